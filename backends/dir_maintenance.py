"""The maintenance calls of :class:`~runtime_cache.backends.directory.DirectoryBackend`.

Its size, its eviction, its vacuum and the compaction of its hits journal: each is done by
the backend's upkeep (:mod:`.dir_upkeep`) or its journal (:mod:`.hits_journal`), and
:class:`DirMaintenance` gives the backend the calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .dir_tree import keys_until
from .dir_upkeep import VACUUM_SECONDS
from .eviction import LockStats

if TYPE_CHECKING:
    from .dir_upkeep import Upkeep
    from .hits_journal import HitsJournal

__all__ = ["TEMP_HITS", "DirMaintenance"]

#: The name a compacted journal is written under before it takes the journal's place.
TEMP_HITS = ".tmp-hits-"


class DirMaintenance:
    """The maintenance methods of :class:`~runtime_cache.backends.directory.DirectoryBackend`."""

    _upkeep: Upkeep
    _journal: HitsJournal
    root_fd: int
    lock_wait: float

    def total_size(self) -> int:
        """The disk the entries take now (a full walk)."""
        return self._upkeep.usage()[0]

    def enforce_size(self, budget: float | None = None) -> int:
        """Evict least recently used files until under 90% of the caps; return how many.

        One process at a time evicts: when another one is at it, this waits up
        to :attr:`lock_wait` seconds, then returns 0. ``budget`` bounds the
        seconds spent walking, and again removing (call again to go on); a
        write's own turn has 1 s for each.
        """
        return self._upkeep.enforce(self.lock_wait, budget)

    @property
    def lock_stats(self) -> LockStats:
        """Evictions skipped for want of the lock, and stale locks broken."""
        return self._upkeep.locks

    def vacuum(self, seconds: float = VACUUM_SECONDS) -> int:
        """Remove temp files that dead writers left, and compact the hits journal.

        A temp file whose writer is gone (its lock is free) goes at once; where
        the file system has no locks, one not written for 5 minutes goes. Only
        names the backend gives its own files are removed; the walk stops after
        ``seconds``, and the next vacuum goes on.
        """
        return self._upkeep.vacuum(seconds)

    def compact_hits(self, deadline: float | None = None) -> None:
        """Rewrite the hits journal as one line per live key once it passes 1 MiB (a
        sixteenth of a smaller ``max_size``); the keys are listed only then, and not past
        ``deadline`` (``time.monotonic()``)."""
        at = min(1 << 20, self._journal.compact_at)
        self._journal.compact(lambda: keys_until(self.root_fd, deadline), TEMP_HITS, at)
