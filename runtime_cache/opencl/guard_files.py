"""The crash guard's files, opened so that nothing planted in its folder can hurt.

The guard (:mod:`.guard`) keeps its files in one folder: ``<pid>.loading``, one a
process, and the ``blocklist``. Everything here opens them without following a
symbolic link and without blocking (a FIFO planted under one of these names is
skipped), reads only regular files of at most
:data:`~.known_list.MAX_LIST_BYTES`, and writes
a list anew through a fresh temporary file. The folder itself must be this
user's own and not writable by others (:func:`open_folder`): on a folder that
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

import os
import stat
from collections.abc import Callable, Sequence

from .known_list import MAX_LIST_BYTES, OPEN_FLAGS, read_lines

try:
    import fcntl
except ImportError:  # not POSIX: a process is told alive by its pid alone
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MAX_LIST_BYTES",
    "append_lines",
    "dead_marks",
    "open_folder",
    "open_mark_file",
    "replace_lines",
    "reserve",
]

#: The largest pid a Linux kernel gives (``pid_max`` at most 2**22).
_MAX_PID = 1 << 22


def open_folder(folder: str, *, private_parent: bool = False) -> list[str]:
    """Make ``folder`` (private) and list it.

    ``OSError`` when it is unusable, not this user's own, or writable by others;
    with ``private_parent`` (a shared temporary folder's), also when its parent is
    not a private folder of this user.
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
    if info.st_uid != geteuid() or info.st_mode & 0o002:
        raise OSError(f"{folder} is not this user's own, or others can write to it")
    if private_parent:
        parent = os.lstat(os.path.dirname(folder))
        if parent.st_uid != geteuid() or parent.st_mode & 0o022:
            raise OSError(f"{os.path.dirname(folder)} is not a private folder of this user")
    return names


def dead_marks(folder: str, names: Sequence[str], alive: Callable[[int], bool]) -> list[str]:
    """The digests in the ``<pid>.loading`` files of processes that are gone; those
    files are removed. A file whose lock is held belongs to a live process (``alive(pid)``
    decides where there are no locks). Names that are no pid are left alone; a file that
    is not a regular file of at most :data:`~.known_list.MAX_LIST_BYTES` holds nothing."""
    found: list[str] = []
    for name in names:
        pid_text, _, suffix = name.partition(".")
        if suffix != "loading" or not (pid_text.isascii() and pid_text.isdigit()):
            continue
        pid = int(pid_text)
        if pid > _MAX_PID or pid == os.getpid():
            continue
        path = os.path.join(folder, name)
        held, told = _lock_if_dead(path)
        if held is None and (told or alive(pid)):
            continue  # alive (or not a regular file: left alone)
        try:
            lines = read_lines(path)
            found.extend(line.replace("\0", "") for line in lines)
            os.unlink(path)
        except OSError:
            pass
        finally:
            if held is not None:
                os.close(held)  # and the lock with it
    return [d for d in found if d]


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


def open_mark_file(folder: str) -> int | None:
    """This process's ``<pid>.loading``, made afresh (what was there is removed first:
    a file a process of the same pid left, or anything planted) and locked for as long as
    the process lives; ``None`` if it cannot."""
    path = os.path.join(folder, f"{os.getpid()}.loading")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | OPEN_FLAGS
    for _ in range(2):
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            try:
                os.unlink(path)
            except OSError:
                return None
            continue
        except OSError:
            return None
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # a file system without locks: others ask the pid
                pass
        return fd
    return None


def reserve(fd: int, size: int) -> bool:
    """Give the file at ``fd`` ``size`` bytes of disk, so that writes into a map of it
    cannot fault; whether it did (not: a full disk, a quota, no such call)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return False
    try:
        fallocate(fd, 0, size)
    except OSError:
        return False
    return True


def append_lines(path: str, lines: Sequence[str], limit: int) -> None:
    """Append ``lines`` to the list at ``path`` (one ``O_APPEND`` write to a regular
    file); keep the newest half once it holds more than ``limit`` lines."""
    data = "".join(f"{d}\n" for d in lines).encode("ascii")
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | OPEN_FLAGS
        fd = os.open(path, flags, 0o600)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return
            os.write(fd, data)
            size = info.st_size + len(data)
        finally:
            os.close(fd)
        if size // 33 > limit:  # a digest line is 33 bytes
            replace_lines(path, read_lines(path)[-(limit // 2) :])
    except OSError:
        pass  # advisory: a binary not recorded is vetted again next time


def replace_lines(path: str, lines: Sequence[str]) -> None:
    """Write the list at ``path`` anew, through a fresh temporary file and one rename."""
    temp = f"{path}.{os.getpid()}.tmp"
    data = "".join(f"{d}\n" for d in lines).encode("ascii")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NONBLOCK | OPEN_FLAGS
    try:
        try:
            fd = os.open(temp, flags, 0o600)
        except FileExistsError:  # a leftover of a process of the same pid
            os.unlink(temp)
            fd = os.open(temp, flags, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError:
        pass  # advisory, as above
