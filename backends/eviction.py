"""LRU eviction for the directory backend: one process at a time, never a file in use.

Several processes share one cache folder. Were each to evict on its own view,
they would together remove several times what the cap asks (each brings "the
total" down to 90% of the cap) and empty the cache. So eviction runs under an
exclusive ``flock`` on ``<root>/.evict.lock``; a process that finds it taken
skips its turn, since the holder is bringing the total down already.

Candidates come from a walk, oldest last access first. Before removing one,
it is looked at again: a file read since the walk (its mtime was bumped) or
replaced by a new write (a new inode) is kept.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Candidate", "evict_lru", "eviction_turn"]

#: (mtime in ns, inode, path, size) of one stored file.
Candidate = tuple[int, int, str, int]


@contextmanager
def eviction_turn(lock_path: str, wait: bool = False) -> Iterator[bool]:
    """Yield whether this process may evict now (no other process is evicting).

    With ``wait=True``, wait for the other one to finish instead: a writer far
    over the cap stops writing until the cache is back under it.
    """
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        yield True  # read-only or odd storage: evicting will fail or be alone anyway
        return
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            except OSError:
                pass  # no flock on this file system: evict without it
        yield True
    finally:
        os.close(fd)


def evict_lru(candidates: list[Candidate], total: int, target: int) -> tuple[int, int]:
    """Remove the least recently used files until ``total`` is at most ``target``.

    Returns ``(removed, total)``. A file whose mtime or inode changed since the
    walk is skipped: it was just read or rewritten, so it is not cold.
    """
    removed = 0
    for mtime, inode, path, size in sorted(candidates):
        if total <= target:
            break
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            total -= size  # gone already (deleted or evicted by someone else)
            continue
        if st.st_mtime_ns != mtime or st.st_ino != inode:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        removed += 1
    return removed, total
