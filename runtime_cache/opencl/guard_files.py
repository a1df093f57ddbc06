"""The crash guard's files, opened so that nothing planted in its folder can hurt.

The guard (:mod:`.guard`) keeps its files in one folder: ``<pid>.<token>.loading``,
one a process, and the ``blocklist``. Everything here opens them without following a
symbolic link and without blocking (a FIFO planted under one of these names is
skipped), reads only regular files of at most
:data:`~.known_list.MAX_LIST_BYTES`, and writes
a list anew through a fresh temporary file. The folder itself must be this
user's own and not writable by its group or others (:func:`open_folder`): on a folder that
another user can write, these names could point anywhere.

A process holds an exclusive ``flock`` on its own mark file while it lives, and
another process takes a mark file for a dead process's only when it can lock it:
that holds across pid namespaces (containers) and hosts that share the folder,
where asking the local kernel about the pid does not (without ``fcntl``, the pid
is asked). The mark file is reserved on disk before it is mapped (:func:`reserve`): a write
into a mapped page with no disk block behind it (a full disk, a quota) kills the
process with ``SIGBUS``, where a write call only fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Sequence, Set

from ..file_locks import flock_within
from .known_list import (
    MAX_LIST_BYTES,
    OPEN_FLAGS,
    append_whole,
    file_lock,
    open_for_append,
    read_lines,
)

try:
    import fcntl
except ImportError:  # not POSIX: a process is told alive by its pid alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MAX_LIST_BYTES",
    "ReadOnlyFolder",
    "append_lines",
    "dead_marks",
    "lines_without",
    "marks_set_aside_since",
    "open_folder",
    "open_mark_file",
    "process_alive",
    "record_nothing",
    "remove_left_temps",
    "replace_lines",
    "reserve",
    "rewrite_lines",
    "write_all",
]

#: The ending of a list's lock file (``blocklist.lock``): see :func:`append_lines`.
_LOCK = ".lock"
#: A half-made mark file (``.<pid>.<token>.new``) younger than this is being made, not left.
_NEW_SECONDS = 60.0
#: A list's temporary file older than this was left by a writer that died mid-rewrite.
_TEMP_SECONDS = 300.0
#: The largest pid a Linux kernel gives (``pid_max`` at most 2**22).
_MAX_PID = 1 << 22


class ReadOnlyFolder(OSError):
    """:func:`open_folder`'s error for a folder that passed its checks but cannot be
    written (a read-only mount): its lists may still be read (``names``: what it holds)."""

    def __init__(self, folder: str, names: list[str]) -> None:
        super().__init__(errno.EROFS, f"{folder} cannot be written")
        self.names = names

    def __str__(self) -> str:
        return str(self.strerror)


def open_folder(folder: str, *, private_parent: bool = False) -> list[str]:
    """Make ``folder`` (private) and list it.

    ``OSError`` when it is unusable, is not this user's own, or its group or others can
    write it (a member could plant a mark file that evicts a good entry, or truncate a
    mapped table under this process: SIGBUS); with ``private_parent`` (a shared temporary
    folder's), also when its parent is not a private folder of this user.
    :class:`ReadOnlyFolder` when it passes those checks but cannot be written.
    """
    try:
        names = os.listdir(folder)
    except FileNotFoundError:  # the first use on this machine: make it (two mkdirs)
        os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        names = os.listdir(folder)
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # not POSIX: no owners to check
        return names
    info = os.stat(folder)
    if info.st_uid != geteuid() or info.st_mode & 0o022:
        raise OSError(f"{folder} is not this user's own, or its group or others can write it")
    if private_parent:
        parent = os.lstat(os.path.dirname(folder))
        if parent.st_uid != geteuid() or parent.st_mode & 0o022:
            raise OSError(f"{os.path.dirname(folder)} is not a private folder of this user")
    # Checked last: a read-only folder that passed the checks above can still be read.
    if not os.access(folder, os.W_OK | os.X_OK):  # read-only: no mark could be written
        raise ReadOnlyFolder(folder, names)
    return names


def dead_marks(
    folder: str,
    names: Sequence[str],
    alive: Callable[[int], bool],
    own: str | None = None,
    keep: Callable[[list[str]], bool] | None = None,
) -> list[str]:
    """The digests in the mark files of processes that are gone; those files are removed,
    after ``keep(digests)`` (when given, and any were found) says they were recorded:
    otherwise they stay, for the next process to find.

    A mark file is ``<pid>.<token>.loading``; its process holds a lock on it while it
    lives, so a file that can be locked is a dead process's, whatever its pid (another
    container's pid 1, or this process's own pid reused). Where the file system has no
    locks, and for a ``<pid>.loading`` of an earlier version (which held none), the pid
    is asked (``alive``). ``own`` is this process's own file. Names that are no pid are left
    alone; a file that is not a regular file of at most
    :data:`~.known_list.MAX_LIST_BYTES` holds nothing. A half-made mark file
    (``.<pid>.<token>.new``) that nobody holds, made over a minute ago, is removed.
    """
    found: list[str] = []
    taken: list[tuple[str, int | None]] = []
    for name in names:
        parts = name.split(".")
        pid_text = parts[0] or (parts[1] if len(parts) == 4 else "")
        pid = int(pid_text) if pid_text.isascii() and pid_text.isdigit() else _MAX_PID + 1
        if pid > _MAX_PID:
            continue
        path = os.path.join(folder, name)
        if len(parts) == 4 and parts[0] == "" and parts[3] == "new":  # a half-made one
            if not _young(path):  # (a young one is being made: its maker locks it next)
                held, _ = _lock_if_dead(path)
                if held is not None:
                    _remove(path, held)
            continue
        if parts[-1] != "loading" or len(parts) not in (2, 3) or name == own:
            continue
        held, told = _lock_if_dead(path)
        if held is None and told:
            continue  # a live process holds it (or it is no regular file)
        by_pid = len(parts) == 2 or not told  # no lock to tell by: ask the pid
        if by_pid and (pid == os.getpid() or alive(pid)):
            if held is not None:
                os.close(held)
            continue
        found.extend(line.replace("\0", "") for line in read_lines(path))
        taken.append((path, held))
    digests = [d for d in found if d]
    recorded = keep is None or not digests or keep(digests)
    for path, held in taken:
        if recorded:
            _remove(path, held)
        elif held is not None:
            os.close(held)  # (and the lock with it: the next process finds the file)
    return digests


def record_nothing(digests: list[str]) -> bool:
    """:func:`dead_marks`' ``keep`` for a folder that cannot be written: the marks stay."""
    return False


def _young(path: str) -> bool:
    # Whether the file at ``path`` was made less than _NEW_SECONDS ago (or is gone).
    try:
        return time.time() - os.lstat(path).st_mtime < _NEW_SECONDS
    except OSError:
        return True


def _remove(path: str, held: int | None) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
    finally:
        if held is not None:
            os.close(held)  # and the lock with it


def _lock_if_dead(path: str) -> tuple[int | None, bool]:
    # (the file, opened and locked), True: its process is gone. (None, True): a live
    # process holds it, or it is no regular file. (None, False): no locks here, ask the pid.
    if fcntl is None:
        return None, False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
    except OSError:
        return None, True
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, True
        told = True
    except BlockingIOError:  # held: a live process's, in this namespace or another
        told = True
    except OSError:  # no locks on this file system
        told = False
    os.close(fd)
    return None, told


def open_mark_file(folder: str) -> tuple[int, str] | None:
    """This process's mark file, ``<pid>.<token>.loading`` (a random token: a process of
    the same pid in another container, or an earlier one, has another name), locked for
    as long as the process lives; its descriptor and name, or ``None`` if it cannot.

    It is made and locked under a hidden name and renamed into place, so no other
    process ever sees it unlocked (and takes it for a dead process's)."""
    pid = os.getpid()
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | OPEN_FLAGS
    token = os.urandom(4).hex()
    name = f"{pid}.{token}.loading"
    temp = os.path.join(folder, f".{pid}.{token}.new")
    try:
        fd = os.open(temp, flags, 0o600)
    except OSError:
        return None
    try:
        try:  # another process may hold it a moment (dead_marks' test)
            taken = flock_within(fd, 0.05, pause=0.001)
        except OSError:  # a file system without locks: others ask the pid
            taken = True
        if not taken:
            raise BlockingIOError(errno.EWOULDBLOCK, "held by another process", temp)
        os.rename(temp, os.path.join(folder, name))
    except OSError:
        _remove(temp, fd)
        return None
    return fd, name


def reserve(fd: int, size: int) -> bool:
    """Give the file at ``fd`` ``size`` bytes of disk, so that writes into a map of it
    cannot fault; whether it did (not: a full disk, a quota). On a copy-on-write file
    system (btrfs, ZFS) a later write may still need new blocks: there a full disk can
    still fault a write into the map."""
    fallocate = getattr(os, "posix_fallocate", None)
    try:
        if fallocate is not None:
            fallocate(fd, 0, size)
        elif os.pwrite(fd, bytes(size), 0) != size:  # (macOS) zeros written take the blocks
            return False
    except OSError:
        return False
    return True


def append_lines(
    path: str,
    lines: Sequence[str],
    limit: int,
    trim: Callable[[list[str], int], list[str]] | None = None,
) -> bool:
    """Append ``lines`` to the list at ``path`` (one ``O_APPEND`` write to a regular
    file); keep the newest half once it holds more than ``limit`` lines (or what
    ``trim(lines, half)`` keeps). Whether they
    were written (advisory: a binary not recorded is vetted again next time).

    Appends hold the list's lock shared, and rewrites (:func:`rewrite_lines`) exclusive,
    so no append lands between a rewrite's read and its rename."""
    data = "".join(f"{d}\n" for d in lines).encode("ascii")
    try:
        with file_lock(f"{path}{_LOCK}", shared=True):  # (not taken in time: append anyway)
            fd = open_for_append(path)
            try:
                written = append_whole(fd, data)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
    except OSError:
        return False
    if size // 33 > limit:  # a digest line is 33 bytes
        half = limit // 2  # (``trim``: the list's own way to keep half, else the newest)
        rewrite_lines(path, lambda old: trim(old, half) if trim else old[-half:])
    return written


def rewrite_lines(path: str, change: Callable[[list[str]], list[str]]) -> bool:
    """Write the list at ``path`` anew as ``change`` makes it of the lines it holds now,
    holding the list's lock; whether it did. A list that reads as empty (too large, or
    not a regular file: it is so to every reader) is written anew from nothing."""
    try:
        with file_lock(f"{path}{_LOCK}") as locked:
            if not locked:
                return False  # a rewrite held past the wait (a stopped process): not now
            return replace_lines(path, change(read_lines(path)))
    except OSError:
        return False


def replace_lines(path: str, lines: Sequence[str]) -> bool:
    """Write the list at ``path`` anew, through a fresh temporary file and one rename;
    whether it did. (:func:`rewrite_lines` does so under the list's lock.)"""
    temp = f"{path}.{os.urandom(6).hex()}.tmp"  # random: no two writers share one
    data = "".join(f"{d}\n" for d in lines).encode("ascii")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | OPEN_FLAGS
    try:
        fd = os.open(temp, flags, 0o600)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, path)  # only a whole list: a short one would forget the rest
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        return False  # advisory, as above
    return True


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``. ``OSError`` when the disk takes only part of it
    (a nearly full disk writes what fits, then fails)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, "short write")
        view = view[written:]


def remove_left_temps(folder: str, names: Sequence[str], lists: Set[str]) -> None:
    """Remove the temporary files of :func:`replace_lines` (``<list>.<12 hex>.tmp``, for a
    list named in ``lists``) that a writer killed mid-rewrite left: those made over
    :data:`_TEMP_SECONDS` ago. A live writer renames its own within milliseconds; one
    stopped that long finds it gone and leaves the list as it was."""
    for name in names:
        if not name.endswith(".tmp"):
            continue  # (every name but a leftover stops here: no system call)
        base, _, token = name[:-4].partition(".")
        if base not in lists or len(token) != 12 or token.strip("0123456789abcdef"):
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            if time.time() - os.lstat(path).st_mtime > _TEMP_SECONDS:
                os.unlink(path)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def lines_without(lines: list[str], gone: Set[str]) -> list[str]:
    """``lines`` but those in ``gone``."""
    return [line for line in lines if line not in gone]


def marks_set_aside_since(seconds: float, lines: Sequence[str]) -> frozenset[str]:
    """The marks of the set-aside list's ``mark@seconds`` lines written less than
    ``seconds`` ago."""
    now = time.time()
    marks = (line.partition("@") for line in lines)
    # A time in the future (a clock set wrong), or too long to be a time, counts as none.
    return frozenset(
        m
        for m, _, at in marks
        if at.isdigit() and len(at) <= 12 and now - seconds <= int(at) <= now + 60
    )
