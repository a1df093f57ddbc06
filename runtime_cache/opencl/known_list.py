"""The crash guard's list of known binaries: a short log, and a sorted table searched in place.

Every process's first cached load asks whether its binaries are known (see
:mod:`.guard` and :mod:`.vetting`), and a machine that has loaded many programs
knows up to :data:`MAX_KNOWN` of them. Reading the whole list into a set at the
first load made that load slower the longer the machine had been in use: 1.2-3 ms
for 3,700 marks, and 11 ms for 20,000, on a 2-core Xeon; on the H200's host, 9.5 ms
of start-up at 19,900. So the list is kept in two files in the guard folder:

* ``vetted``, the log: marks are appended as they become known (one ``O_APPEND``
  write per batch). It is read whole at the first lookup, and it stays short.
* ``vetted.table``: the older marks, sorted, one fixed-width line each. It is
  mapped read-only and binary-searched, so nothing of it is read up front and a
  lookup costs about 15 comparisons.

When the log passes :data:`LOG_LIMIT` lines, the process that appended last merges
it into the table, holding a lock file (``vetted.lock``) so that merges take turns:
it renames the log away (appends from then on start a new one), merges the two, and
replaces the table in one rename. A writer whose log was renamed away while it wrote
writes its marks again to the new log, so no mark is lost to a merge. Past
:data:`MAX_KNOWN` marks, half of the table's are dropped (the table keeps no age, so
which half is arbitrary).
A mark dropped (or not written: a full disk) is not harmful: its binary is vetted
again the next time it is seen.

A table that is not a whole number of lines, or a line that is not a mark, only
makes lookups miss (a binary is then vetted, never trusted more); the next merge
rewrites it. Whoever can write the guard folder can already add marks to the log,
so the table is trusted no more and no less than the log.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from collections.abc import Callable, Iterable, Iterator

from ..file_locks import flock_within

__all__ = [
    "LOCK_WAIT",
    "LOG",
    "LOG_LIMIT",
    "MAX_KNOWN",
    "MAX_LIST_BYTES",
    "OPEN_FLAGS",
    "TABLE",
    "KnownList",
    "Signature",
    "append_whole",
    "file_lock",
    "file_signature",
    "open_for_append",
    "read_lines",
]

#: The log's file name, and the sorted table's.
LOG = "vetted"
TABLE = "vetted.table"
#: Lines in the log past which it is merged into the table.
LOG_LIMIT = 512
#: Marks kept in all; past this, half of the table's are dropped at a merge.
MAX_KNOWN = 20_000
#: A mark is an xxh3-128 digest in hex: 32 characters, a table line 33 bytes.
_WIDTH = 32
_LINE = _WIDTH + 1
#: The largest list file read (the log merges at 512 lines, the blocklist keeps 10,000,
#: of 33 bytes each); a larger one, or one that grows past it while read, reads as empty.
MAX_LIST_BYTES = 4 << 20
#: Added to every open of the guard's files: no link followed, not inherited by children.
OPEN_FLAGS = getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
_LOCK = "vetted.lock"
#: A file's ``(inode, size, modification time in ns)``: see :func:`file_signature`.
Signature = tuple[int, int, int]
#: Seconds a merge waits for another's lock before it leaves the log as it is.
LOCK_WAIT = 1.0


def read_lines(path: str, limit: int = MAX_LIST_BYTES) -> list[str]:
    """The file's lines, blank ones and those with a byte outside ASCII left out (a mark
    holds neither, and a list is written in ASCII again), and a last line with no newline
    after it (cut short: a full disk, a killed writer); ``[]`` if it is
    missing, unreadable, larger than ``limit`` bytes, or not a regular file (a FIFO
    planted there never blocks)."""
    opened = _open_regular(path)
    if opened is None:
        return []
    fd, size = opened
    # Plain reads of the size fstat gave (a larger buffer costs an allocation of its own),
    # no buffered file object: this runs in every process's first load.
    try:
        if size > limit:
            return []
        data = os.read(fd, size + 1)
        if len(data) != size:  # it grew since, or a short read: read on to the end
            chunks = [data]
            total = len(data)
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:
                    return []
            data = b"".join(chunks)
    except OSError:
        return []
    finally:
        os.close(fd)
    if data[-1:] != b"\n":  # every writer ends its lines: a part-line is no entry
        data = data[: data.rfind(b"\n") + 1]
    text = data.decode("ascii", "replace")
    lines = text.split()  # one split in C
    if "\ufffd" in text:  # bytes no list holds (a damaged or planted file): left out
        lines = [line for line in lines if "\ufffd" not in line]
    return lines


def open_for_append(path: str) -> int:
    """The list at ``path`` opened to append to (made if missing; no link followed).
    ``OSError`` when it cannot be."""
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | OPEN_FLAGS
    return os.open(path, flags, 0o600)


def append_whole(fd: int, data: bytes) -> bool:
    """Append ``data`` (whole lines) to the list open as ``fd``
    (:func:`open_for_append`), first ending the line the file ends in when it does not
    end in a newline (a write cut short by a full disk or a killed process, or a
    truncated file): appended straight after it, the first new line would join that
    part-line and read back as neither. Whether all was written; ``False`` without a
    write when ``fd`` is not a regular file. ``OSError`` when a call fails."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        return False
    if info.st_size and os.pread(fd, 1, info.st_size - 1) != b"\n":
        data = b"\n" + data  # (a blank line is no line to the readers)
    return os.write(fd, data) == len(data)


def _open_regular(path: str) -> tuple[int, int] | None:
    """``path`` opened for reading, and its size, when it is a regular file (no symlink
    followed)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode):
            return fd, info.st_size
    except OSError:
        pass
    os.close(fd)
    return None


class KnownList:
    """The known marks of one guard folder: the log's, in a set, and the table's, mapped.

    Lookups and :meth:`add` are not thread-safe (the guard makes them under its lock);
    :meth:`write` may run beside them.
    """

    def __init__(self, folder: str, trusted: Callable[[], bool] = lambda: True) -> None:
        """The lists in ``folder``, read now. ``trusted()`` says whether the folder may be
        read again later (see :mod:`.list_watch`): a table a later merge made is taken
        up only then."""
        self.folder = folder
        self._trusted = trusted
        self._log = os.path.join(folder, LOG)
        self._table = os.path.join(folder, TABLE)
        self._recent: set[str] = set()
        #: The log's inode and size when last read, and how far it was read (whole lines).
        self._log_seen: tuple[int, int] = (0, 0)
        self._log_read = 0
        self._read_log()
        self._table_seen: Signature | None = file_signature(self._table)
        self._map: mmap.mmap | bytes = _map_table(self._table)
        if len(self._recent) > LOG_LIMIT:  # a long log (one from before the table): merge it
            try:
                if self.merge() and self._trusted():
                    self._recent = set()  # all in the table now, which this list maps
            except OSError:
                pass

    def _read_log(self) -> bool:
        """Add the log's marks that this list has not read yet (the lines appended since,
        or a new log's, after a merge renamed the last one away); whether any were read."""
        opened = _open_regular(self._log)
        if opened is None:
            return False
        fd, size = opened
        try:
            inode = os.fstat(fd).st_ino
            seen_inode, _ = self._log_seen
            start = self._log_read if inode == seen_inode and size >= self._log_read else 0
            self._log_seen = (inode, size)
            if size - start > MAX_LIST_BYTES or size == start:
                self._log_read = size if size - start > MAX_LIST_BYTES else start
                return False  # (a log past the cap reads as empty, as every list does)
            data = os.pread(fd, size - start, start)
        except OSError:
            return False
        finally:
            os.close(fd)
        whole = data.rfind(b"\n") + 1  # a line still being written is read next time
        self._log_read = start + whole
        self._recent.update(data[:whole].decode("ascii", "replace").split())
        return whole > 0

    def refresh(self) -> bool:
        """Read what other processes added since this list last looked: the log's new
        lines, and the table anew when a merge replaced it. Whether anything changed.
        Two ``stat`` calls when nothing did: asked before a binary is vetted (a child
        process, 0.1-1 s), so that processes of one machine do not vet each other's."""
        changed = False
        table_now = file_signature(self._table)
        if table_now != self._table_seen:
            self._table_seen = table_now
            self._map = _map_table(self._table)
            # A merge made it, and renamed the log away: the log there now is a new
            # one, read whole (it may have the old one's inode, and be as long).
            self._log_seen, self._log_read = (0, 0), 0
            changed = True
        log_now = file_signature(self._log)
        if log_now is not None and log_now[:2] != self._log_seen:
            changed = self._read_log() or changed
        return changed

    def __contains__(self, mark: str) -> bool:
        return mark in self._recent or self._in_table(mark)

    def _in_table(self, mark: str) -> bool:
        table = self._map
        if len(mark) != _WIDTH or not table:
            return False
        wanted = mark.encode("ascii", "replace")
        low, high = 0, len(table) // _LINE
        while low < high:
            middle = (low + high) // 2
            at = middle * _LINE
            probe = table[at : at + _WIDTH]
            if probe < wanted:
                low = middle + 1
            elif probe > wanted:
                high = middle
            else:
                return True
        return False

    def add(self, marks: Iterable[str]) -> list[str]:
        """Know ``marks`` in this process; return the ones that were new (for :meth:`write`)."""
        new = [m for m in dict.fromkeys(marks) if m not in self]
        self._recent.update(new)
        return new

    def write(self, marks: list[str]) -> None:
        """Append ``marks`` to the log (merging it when it has grown long); advisory: a mark
        not written is only vetted again by the next process. Safe beside lookups."""
        if not marks:
            return
        data = "".join(f"{m}\n" for m in marks).encode("ascii", "replace")
        try:
            for _ in range(3):
                fd = open_for_append(self._log)
                try:
                    if not append_whole(fd, data):
                        return  # not a regular file: nothing is written there
                    info = os.fstat(fd)
                    # A merge that renamed the log away after this open may have read it
                    # before the write: then write again to the new log (a mark twice is
                    # harmless). Asked while the file is open: once closed, a merge may
                    # remove it, and a new log may take its inode number.
                    same = _same_file(self._log, info)
                finally:
                    os.close(fd)
                if same:
                    break
            if info.st_size // _LINE > LOG_LIMIT:
                self.merge()
        except OSError:
            pass

    def merge(self) -> bool:
        """Move the log's marks into the table (see the module's text); whether this call did.
        ``OSError`` on failure.

        One process merges at a time (a lock file), so no merge undoes another's; a lock
        held past :data:`LOCK_WAIT` seconds (a stopped process) skips this merge."""
        with file_lock(os.path.join(self.folder, _LOCK)) as locked:
            if not locked:
                return False  # the log grows a little longer; the next write tries again
            taken = f"{self._log}.{os.getpid()}.merging"
            try:
                os.rename(self._log, taken)  # appends from now on start a new log
            except FileNotFoundError:
                return False  # another process merged it
            temp = f"{self._table}.{os.getpid()}.tmp"
            try:
                fresh = {m for m in read_lines(taken) if _is_mark(m)}
                older = [m for m in _table_lines(self._table) if m not in fresh]
                if len(older) + len(fresh) > MAX_KNOWN:
                    older = older[::2][: max(0, MAX_KNOWN - len(fresh))]
                lines = sorted(set(older) | fresh)
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS
                with os.fdopen(os.open(temp, flags, 0o600), "wb") as handle:
                    handle.write("".join(f"{m}\n" for m in lines).encode("ascii"))
                os.replace(temp, self._table)
            finally:
                for leftover in (taken, temp):  # a failed write (a full disk) leaves no file
                    try:
                        os.unlink(leftover)
                    except OSError:
                        pass
        if self._trusted():  # (else this process keeps what it read at its start)
            self._table_seen = file_signature(self._table)
            self._map = _map_table(self._table)
        return True


def file_signature(path: str) -> Signature | None:
    """``(inode, size, modification time in ns)`` of the file at ``path`` (no link
    followed), or ``None``: what changes when another process writes or replaces it."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


@contextlib.contextmanager
def file_lock(path: str, shared: bool = False) -> Iterator[bool]:
    """Hold an ``flock`` on the lock file ``path`` (exclusive, or ``shared``; released with
    the process); yields whether it was taken within :data:`LOCK_WAIT` seconds (never waits
    longer). ``OSError`` when the lock file cannot be opened."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | OPEN_FLAGS, 0o600)
    try:
        yield flock_within(fd, LOCK_WAIT, shared=shared, pause=0.005)
    finally:
        os.close(fd)


def _same_file(path: str, info: os.stat_result) -> bool:
    """Whether ``path`` still names the file ``info`` describes."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def _table_lines(path: str) -> list[str]:
    """The table's marks; none from a file far past the cap (planted, or not ours)."""
    try:
        if os.lstat(path).st_size > 2 * MAX_KNOWN * _LINE:
            return []
    except OSError:
        return []
    return [m for m in read_lines(path) if _is_mark(m)]


def _is_mark(line: str) -> bool:
    return len(line) == _WIDTH and not line.strip("0123456789abcdef")


def _map_table(path: str) -> mmap.mmap | bytes:
    """The table mapped read-only, or ``b""`` (none, empty, not a regular file, or not
    whole lines)."""
    opened = _open_regular(path)
    if opened is None:
        return b""
    fd, size = opened
    try:
        if size == 0 or size % _LINE:
            return b""
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return b""
    finally:
        os.close(fd)
