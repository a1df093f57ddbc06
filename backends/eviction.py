"""Eviction for the directory backend: one process at a time, never a wait without a deadline.

Several processes share one cache folder. Were each to evict on its own view,
they would together remove several times what the cap asks. So eviction runs
under an exclusive ``flock`` on ``<root>/.evict.lock``; a process that finds it
taken skips its turn, since the holder is bringing the total down already.

Every wait for the lock polls with ``LOCK_NB`` up to a deadline, then gives up
(the write that asked is not held back). A lock file that is not a regular
file, that has another name too (a hard link: see :mod:`.fixed_files`), that this
process may not open, or whose holder has not touched it for ``stale_after`` seconds
(a stopped or hung evictor) is broken: removed, so the next turn makes a fresh one.

The cap counts disk, not file sizes: a file costs its allocated blocks, so a
sparse terabyte costs nothing and a one-byte file a whole block. Candidates go
least recently used first, taken from the owner that holds the most disk, so a
member of a shared cache who floods it loses their own files first.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .dir_fs import set_aside
from .fixed_files import held, in_place, open_in_place

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["Candidate", "LockStats", "disk_bytes", "evict", "eviction_turn"]

_POLL = 0.01


@dataclass(frozen=True)
class Candidate:
    """One stored file as the walk saw it."""

    mtime_ns: int
    inode: int
    folder: str
    name: str
    disk: int
    owner: int


@dataclass
class LockStats:
    """How often eviction was skipped for want of the lock, and how many locks were broken."""

    skipped: int = 0
    broken: int = 0


def disk_bytes(st: os.stat_result) -> int:
    """The disk a file takes: its allocated blocks, else its size rounded up to 4 KiB."""
    blocks = getattr(st, "st_blocks", None)
    if blocks is not None:
        return int(blocks) * 512
    return -(-st.st_size // 4096) * 4096  # pragma: no cover - no st_blocks here


def _open_lock(root_fd: int, name: str, mode: int, chmod: int | None) -> int | None:
    # (a shared cache's lock gets the group's mode: every member must open it)
    try:
        return open_in_place(root_fd, name, os.O_RDWR | os.O_CLOEXEC, mode, chmod)
    except OSError:  # a link, a FIFO, a folder, a hard link: broken, never written
        return None


def _same_file(root_fd: int, name: str, fd: int) -> bool:
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return False
    return st.st_ino == os.fstat(fd).st_ino


def _break(root_fd: int, name: str, stats: LockStats, stale_after: float) -> None:
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return
    fresh = in_place(st) and time.time() - st.st_mtime < stale_after
    if fresh and os.access(name, os.R_OK | os.W_OK, dir_fd=root_fd, follow_symlinks=False):
        return  # a live lock that we could take later
    if stat.S_ISREG(st.st_mode) and not in_place(st) and _held(root_fd, name, stale_after):
        return  # a live evictor's lock given a second name: not broken under it
    if set_aside(root_fd, name, ".junk-"):
        stats.broken += 1


def _held(root_fd: int, name: str, stale_after: float) -> bool:
    try:  # (read-only: a hard link's other file is never written)
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root_fd
        )
    except OSError:
        return False
    try:
        return held(fd, stale_after)
    finally:
        os.close(fd)


@contextmanager
def eviction_turn(
    root_fd: int,
    name: str,
    *,
    wait: float = 0.0,
    stale_after: float = 30.0,
    mode: int = 0o600,
    chmod: int | None = None,
    stats: LockStats | None = None,
) -> Iterator[Callable[[], None] | None]:
    """Yield a heartbeat function when this process may evict now, else ``None``.

    Polls the lock up to ``wait`` seconds. The holder calls the heartbeat now
    and then, so that others can tell it from a stopped evictor.
    """
    stats = stats if stats is not None else LockStats()
    deadline = time.monotonic() + wait
    broke = False
    while True:
        fd = _open_lock(root_fd, name, mode, chmod)
        if fd is not None:
            if fcntl is None:  # pragma: no cover - not on POSIX
                yield lambda: None
                os.close(fd)
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = _same_file(root_fd, name, fd)  # broken and remade meanwhile: retry
            except OSError as exc:
                got = exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)
            if got:
                try:
                    beat = _heartbeat(fd)
                    beat()
                    yield beat
                finally:
                    os.close(fd)
                return
            os.close(fd)
        elif not broke:  # a link, a FIFO, a folder, or not ours to open: no lock to wait for
            broke = True
            _break(root_fd, name, stats, stale_after)
            continue
        if time.monotonic() >= deadline:
            if not broke:
                broke = True
                _break(root_fd, name, stats, stale_after)
                continue  # one more try on the fresh lock
            stats.skipped += 1
            yield None
            return
        time.sleep(_POLL)


def _heartbeat(fd: int) -> Callable[[], None]:
    def beat() -> None:
        try:
            os.utime(fd)
        except OSError:
            pass  # not ours to touch (a shared lock made by another member)

    return beat


def evict(
    candidates: list[Candidate],
    total: int,
    target: int,
    remove: Callable[[Candidate], bool | None],
    beat: Callable[[], None] | None = None,
    max_files: int | None = None,
    deadline: float | None = None,
) -> tuple[int, int, int]:
    """Remove files until ``total`` disk is at most ``target`` and the count at most ``max_files``.

    Takes the least recently used file of the owner holding the most disk each
    time. ``remove`` looks at the file again and removes it unless it was read
    or rewritten since the walk; it returns whether the file is gone, or
    ``None`` when it may not be removed (it then leaves the count). Stops at
    ``deadline`` (a :func:`time.monotonic` time) if given. Returns
    ``(removed, total, count)``.
    """
    by_owner: dict[int, list[Candidate]] = {}
    usage: dict[int, int] = {}
    for item in candidates:
        by_owner.setdefault(item.owner, []).append(item)
        usage[item.owner] = usage.get(item.owner, 0) + item.disk
    for items in by_owner.values():
        items.sort(key=lambda c: c.mtime_ns, reverse=True)  # oldest last: pop() is cheap
    count = len(candidates)
    cap = count if max_files is None else max_files
    removed = 0
    while by_owner and (total > target or count > cap):
        owner = max(by_owner, key=usage.__getitem__)  # few owners: a scan is cheap
        items = by_owner[owner]
        item = items.pop()
        if not items:
            del by_owner[owner]
        outcome = remove(item)
        if outcome is not False:
            total -= item.disk
            count -= 1
            removed += outcome is True
            if removed % 256 == 0:
                if beat is not None:
                    beat()
                if deadline is not None and time.monotonic() > deadline:
                    break
        usage[owner] -= item.disk
    return removed, total, count
