"""Maintenance over any backend: verify entries, prune by age and size (LRU first).

These functions work through the :class:`~runtime_cache.api.Backend` contract
only, so they apply to every backend; backends that keep last-access times
(directory, memory) give true LRU order, the others fall back to creation time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .cache import Cache
from .errors import NewerFormatError, RuntimeCacheError

__all__ = ["PruneReport", "VerifyReport", "prune", "verify"]


@dataclass
class VerifyReport:
    """What :func:`verify` found: entries checked, bad ones with reasons, removed ones,
    and entries in a newer format (kept: a newer version of the library reads them)."""

    checked: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0
    newer: int = 0

    @property
    def ok(self) -> bool:
        """True when no bad entry was found."""
        return not self.bad


def verify(cache: Cache, *, repair: bool = False, prefix: str = "") -> VerifyReport:
    """Check every entry with :func:`runtime_cache.check.check_entry` (through
    :meth:`Cache.decode`): checksums, (with a secret) signature, key, and parts.

    With ``repair=True``, bad entries are deleted, compare-and-delete: only the
    bytes judged bad, so an entry rebuilt meanwhile is kept. Good entries and
    entries in a newer format are never touched.
    """
    report = VerifyReport()
    backend = cache.backend
    for skey in list(backend.keys(prefix)):
        blob = backend.peek(skey)  # verifying is not a use: LRU order and hits stay
        if blob is None:
            continue  # vanished while we looked: nothing to verify
        report.checked += 1
        try:
            cache.decode(skey, blob)
        except NewerFormatError:
            report.newer += 1
        except RuntimeCacheError as exc:
            report.bad.append((skey, str(exc)))
            if repair and backend.delete_if(skey, blob):
                report.removed += 1
    return report


@dataclass
class PruneReport:
    """What :func:`prune` did."""

    removed: int = 0
    freed: int = 0
    remaining: int = 0
    remaining_bytes: int = 0
    leftovers: int = 0


def prune(
    cache: Cache,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
) -> PruneReport:
    """Remove entries not used for ``older_than`` seconds, then the least recently
    used ones until the total stored size is at most ``max_size`` bytes.
    """
    now = time.time() if now is None else now
    report = PruneReport(leftovers=cache.backend.vacuum())
    items = []
    for info in cache.entries():
        last = info.last_access if info.last_access is not None else info.created_at
        items.append((last, info.key, info.stored_size))
    items.sort()
    total = sum(size for _, _, size in items)
    keep = []
    for last, key, size in items:
        expired = older_than is not None and now - last > older_than
        over = max_size is not None and total > max_size
        if (expired or over) and cache.delete(key):
            report.removed += 1
            report.freed += size
            total -= size
        else:
            keep.append(size)
    report.remaining = len(keep)
    report.remaining_bytes = sum(keep)
    return report
