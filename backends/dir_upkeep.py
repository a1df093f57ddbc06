"""Upkeep of a directory cache: the disk cap, leftovers, and junk.

* :meth:`Upkeep.account` keeps a running estimate of the disk written and walks
  the tree when the cap may be passed (or every 256 writes), then evicts under
  the eviction lock (see :mod:`runtime_cache.backends.eviction`). The walk
  removes junk at entry names and, in a shared cache, leaves files of users
  outside the root's group out of the count.
* :meth:`Upkeep.vacuum` removes dead writers' temp files and names set aside.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import stat
import threading
import time
from collections.abc import Container
from typing import TYPE_CHECKING

from runtime_cache.errors import EntryTooLargeError

from .dir_fs import JUNK_SECONDS, NOFOLLOW, open_folder, own_leftover, set_aside
from .dir_tree import Found, WalkCutShort, walk
from .eviction import Candidate, LockStats, disk_bytes, evict, eviction_turn
from .fixed_files import in_place, open_in_place
from .temp_files import remove_if_orphaned

if TYPE_CHECKING:
    from .dir_root import Modes
    from .directory import DirectoryBackend

__all__ = ["Upkeep"]

log = logging.getLogger(__name__)

_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
_TEMP_MAX_AGE = 300.0
_LOCK_FLAGS = os.O_RDWR | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MARKER = ".vacuumed"
#: An eviction brings the disk and the file count down to this share of their caps.
EVICT_TO = 0.9
_LOCK = ".evict.lock"
#: A ``max_size`` under this keeps only small values: said when the cache opens.
SMALL_CAP = 64 * 1024
#: Seconds the eviction a write sets off may walk, and as many to remove files; the
#: next write's turn goes on from there.
WRITE_BUDGET = 1.0
#: Seconds one vacuum may take at most (see :meth:`Upkeep.vacuum`).
VACUUM_SECONDS = 0.5


class Upkeep:
    """The cap, vacuum and junk removal of one :class:`DirectoryBackend`."""

    def __init__(self, backend: DirectoryBackend, members: Container[int] | None) -> None:
        self.backend = backend
        self.members = members
        self.locks = LockStats()
        self._lock = threading.Lock()
        self._written = 0
        self._writes = 0
        self._estimate: int | None = None
        self._count: int | None = None  # entry files at the last walk
        if backend.max_size is not None and backend.max_size < SMALL_CAP:
            largest = max(0, int(backend.max_size * EVICT_TO) - 4096)  # (refuse_if_too_large)
            log.warning(
                "runtime-cache: %s: max_size keeps no entry over %d bytes stored (the "
                "entry's header and key included: a value a few hundred bytes less)",
                backend.root,
                largest,
            )

    def after_fork(self) -> None:
        """Fresh thread lock in a forked child."""
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ cap
    def account(self, size: int, rel: str | None = None) -> None:
        """Count one write of ``size`` bytes (to the file ``rel``, which its own eviction
        keeps); evict when a cap may be passed."""
        cap, files = self.backend.max_size, self.backend.max_files
        if cap is None and files is None:
            return
        with self._lock:
            self._written += -(-size // 4096) * 4096  # disk, in blocks
            self._writes += 1
            estimate = (self._estimate or 0) + self._written
            count = (self._count or 0) + self._writes  # (a write may replace a file)
            due = (
                self._estimate is None
                or self._writes >= 256
                # Other processes write too: look again after 1/32 of a cap, so
                # together they overshoot it by little.
                or (cap is not None and (estimate > cap or self._written >= cap // 32))
                or (files is not None and (count > files or self._writes >= files // 32))
            )
        if due:
            over = (cap is not None and estimate > cap * 1.1) or (
                files is not None and count > files * 1.1
            )
            self.enforce(self.backend.lock_wait if over else 0.0, WRITE_BUDGET, keep=rel)

    def refuse_if_too_large(self, key: str, size: int) -> None:
        """Raise :class:`EntryTooLargeError` for a value of ``size`` bytes that this cache
        cannot keep: a reader takes a file over ``max_entry_size`` for junk, and one that an
        eviction (down to ``EVICT_TO`` of ``max_size``, in 4 KiB blocks) cannot keep would
        first push every other entry out, then itself."""
        backend = self.backend
        largest = backend.max_entry_size
        if backend.max_size:
            largest = min(largest, int(backend.max_size * EVICT_TO) - 4096)
        if size > largest:
            raise EntryTooLargeError(
                f"{backend.root}: {key!r} is {size} bytes, more than this cache keeps "
                f"({largest}: max_entry_size {backend.max_entry_size}, max_size "
                f"{backend.max_size}); not stored",
                frozenset((key,)),
            )

    def usage(self) -> tuple[int, int]:
        """``(disk bytes, files)`` of the entries counted against the caps (a full walk)."""
        items, _ = self._candidates(None)
        return sum(c.disk for c in items), len(items)

    def _candidates(self, deadline: float | None) -> tuple[list[Candidate], bool]:
        # Stops at the deadline; the bool says whether the walk was complete.
        limit = self.backend.max_entry_size
        items: list[Candidate] = []
        linked: set[tuple[int, int]] = set()  # files with more than one name
        try:
            inner = not self.backend.shared  # (see walk: never in a store others write)
            for found in walk(self.backend.root_fd, deadline=deadline, inner_roots=inner):
                self._consider(found, limit, linked, items)
        except WalkCutShort:
            return items, False
        return items, True

    def _consider(
        self, found: Found, limit: int, linked: set[tuple[int, int]], items: list[Candidate]
    ) -> None:
        st = found.stat
        where = f"{found.folder}/{found.name}"
        if st.st_nlink > 1 and found.regular:
            # The backend never links: more names of one file are someone's flood of names.
            # The file counts once, against max_files as against max_size (which name is
            # its own cannot be told, so none is removed for it).
            if (st.st_dev, st.st_ino) in linked:
                return
            linked.add((st.st_dev, st.st_ino))
        if not found.regular or st.st_size > limit:
            self.backend.found_junk(where, f"{st.st_size} bytes" if found.regular else "not a file")
            return
        if self.members is not None and st.st_uid not in self.members:
            return  # not a group member's: not ours to count or evict
        disk = disk_bytes(st)
        items.append(
            Candidate(st.st_mtime_ns, st.st_ino, found.folder, found.name, disk, st.st_uid)
        )

    def enforce(self, wait: float, budget: float | None = None, keep: str | None = None) -> int:
        """Evict down to 90% of the caps if over them; return how many files were removed.

        Waits up to ``wait`` seconds for the lock, then spends at most about
        ``budget`` seconds (``None``: no bound) walking, and as many removing. A
        walk cut short still evicts when what it saw is over the caps already.
        ``keep``: the file (relative to the root) just written, never evicted here:
        with a small cap, and file times as coarse as the kernel's clock tick, it could
        tie with an older file and go first.
        """
        backend = self.backend
        if backend.max_size is None and backend.max_files is None:
            return 0
        with self._lock:
            seen_bytes, seen_writes = self._written, self._writes  # later writes stay counted
        with eviction_turn(
            backend.root_fd,
            _LOCK,
            wait=wait,
            stale_after=backend.lock_stale_after,
            mode=backend.modes.file,
            chmod=backend.modes.file_chmod,
            stats=self.locks,
        ) as beat:
            if beat is None:
                return 0  # another process is evicting (or holds the lock): next write looks again
            deadline = None if budget is None else time.monotonic() + budget
            items, _ = self._candidates(deadline)
            total = sum(c.disk for c in items)
            removed, count = 0, len(items)
            cap, files = backend.max_size, backend.max_files
            if (cap is not None and total > cap) or (files is not None and count > files):
                others = [c for c in items if f"{c.folder}/{c.name}" != keep]
                kept = len(items) - len(others)
                folders: dict[str, int] = {}
                try:
                    removed, total, left = evict(
                        others,
                        total,
                        total if cap is None else int(cap * EVICT_TO),  # no cap: the count alone
                        lambda c: self._remove(c, folders),
                        beat,
                        None if files is None else max(1, int(files * EVICT_TO)) - kept,
                        None if budget is None else time.monotonic() + budget,
                    )
                    count = left + kept
                finally:
                    for fd in folders.values():
                        os.close(fd)
        with self._lock:
            self._estimate, self._count = total, count
            self._written = max(0, self._written - seen_bytes)
            self._writes = max(0, self._writes - seen_writes)
        return removed

    def _remove(self, item: Candidate, folders: dict[str, int]) -> bool | None:
        # True: removed (or gone); False: used since the walk, kept; None: not ours to remove.
        dfd = folders.get(item.folder)
        if dfd is None:
            if len(folders) >= 256:
                for fd in folders.values():
                    os.close(fd)
                folders.clear()
            try:
                dfd = folders[item.folder] = open_folder(self.backend.root_fd, item.folder)
            except OSError:
                return True  # the folder is gone, and the file with it
        try:
            st = os.stat(item.name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return True
        if st.st_mtime_ns != item.mtime_ns or st.st_ino != item.inode:
            return False
        try:
            os.unlink(item.name, dir_fd=dfd)
        except FileNotFoundError:
            return True
        except OSError:
            return None
        return True

    # ---------------------------------------------------------------- junk
    # --------------------------------------------------------------- vacuum
    def vacuum(self, seconds: float = VACUUM_SECONDS) -> int:
        """Remove dead writers' temp files, old names set aside and stale lease files;
        compact the journal. The walk, the lease files and the compaction together stop
        after about ``seconds`` (a tree someone filled with folders costs each vacuum that
        long); folders are walked in a random order, so that later vacuums reach what this
        one did not."""
        removed = 0
        now = time.time()
        deadline = time.monotonic() + seconds
        stack = [""]
        root_fd = self.backend.root_fd
        while stack:
            rel = stack.pop()
            try:
                fd = open_folder(root_fd, rel)
            except OSError:
                continue
            try:
                with os.scandir(fd) as listing:  # as it goes: a million names, no list of them
                    for entry in listing:
                        if time.monotonic() > deadline:
                            stack.clear()  # the rest waits for the next vacuum
                            break
                        name = entry.name
                        if not name.startswith("."):
                            if entry.is_dir(follow_symlinks=False):
                                stack.append(f"{rel}/{name}" if rel else name)
                                # A random next folder: a walk cut short covers another part.
                                pick = random.randrange(len(stack))
                                stack[pick], stack[-1] = stack[-1], stack[pick]
                        elif not own_leftover(name):
                            continue  # not a name of ours: never removed (a user's .tmp-notes)
                        elif name.startswith(".tmp-"):
                            removed += remove_if_orphaned(name, _TEMP_MAX_AGE, now, dir_fd=fd)
                        else:
                            removed += self._remove_old(fd, name, now, deadline)
            finally:
                os.close(fd)
        removed += self._vacuum_locks(root_fd, now, deadline, self.backend.modes)
        self.backend.compact_hits(deadline)
        self._touch_marker()
        return removed

    @staticmethod
    def _vacuum_locks(root_fd: int, now: float, deadline: float, modes: Modes) -> int:
        """Remove lease files no one holds and no one touched lately (killed holders leave
        them), and notes past their time (:data:`.dir_lease.NOTE_SUFFIX`). Each lease file
        is locked first and unlinked while locked, as a release does, so a taker that
        opened it meanwhile sees another file and tries again."""
        try:  # here: the backend itself must open where fcntl cannot be imported
            import fcntl

            from .dir_lease import LOCKS, unlink_if_same
            from .dir_notes import NOTE_NAMES, remove_stale_note
        except ImportError:
            return 0

        try:
            fd = open_folder(root_fd, LOCKS)
        except OSError:
            return 0
        removed = 0
        try:
            with os.scandir(fd) as names:  # as it goes, as above
                for name in (entry.name for entry in names):
                    if time.monotonic() > deadline:
                        break
                    if name.endswith(NOTE_NAMES):  # a note, or one set aside or half made
                        with contextlib.suppress(OSError):
                            removed += remove_stale_note(fd, name)
                        continue
                    if not name.endswith(".lock"):
                        continue
                    try:
                        lock = os.open(name, _LOCK_FLAGS, dir_fd=fd)
                    except OSError:
                        continue
                    try:
                        mine = os.fstat(lock)
                        if mine.st_mtime > now - _TEMP_MAX_AGE or not stat.S_ISREG(mine.st_mode):
                            continue
                        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while held
                        removed += unlink_if_same(fd, name, lock, modes)
                    except OSError:
                        continue
                    finally:
                        os.close(lock)
        finally:
            os.close(fd)
        return removed

    @staticmethod
    def _remove_old(fd: int, name: str, now: float, deadline: float) -> bool:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        if st.st_mtime >= now - _TEMP_MAX_AGE:
            return False
        left = max(0.0, deadline - time.monotonic())
        return set_aside(fd, name, ".junk-", min(left, JUNK_SECONDS))

    def _touch_marker(self) -> None:
        modes = self.backend.modes
        try:  # (never a hard link: a file of ours outside the cache is not touched)
            fd = open_in_place(
                self.backend.root_fd, _MARKER, os.O_WRONLY, modes.file, modes.file_chmod
            )
        except OSError:
            return  # read-only, or something planted there: vacuum again next open
        try:
            os.utime(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def maybe_vacuum(self) -> None:
        """Vacuum when the last one (by anyone) was over an hour ago."""
        if self.backend.read_only:
            return
        try:
            st = os.stat(_MARKER, dir_fd=self.backend.root_fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and not in_place(st):
            # A FIFO, a folder or a hard link planted there could never be touched: every
            # open would vacuum.
            set_aside(self.backend.root_fd, _MARKER, ".junk-")
            st = None
        if st is None or time.time() - st.st_mtime > 3600:
            self.vacuum()
