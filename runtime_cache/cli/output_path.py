"""Where a file named on the command line is written: the path is walked one name at a
time, each folder held open, and a link is followed only where nobody but this user or
root can have put it.

The kernel's own lookup follows every link on the way, and a check made before it
(``lstat``, ``realpath``) can be undone before the open: a member of a group that can
write a folder on the way swaps a folder or plants a link between the two, and the
output lands on a file of the user's choosing. Here each step is made from the folder
descriptor the step before opened, with ``O_NOFOLLOW``, so what was checked is what is
used.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

__all__ = ["MAX_LINKS", "Output", "find_output"]

#: Links followed in one path at most (Linux's own limit).
MAX_LINKS = 40
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass
class Output:
    """Where to write: ``fd`` open on a device, FIFO or ``/proc`` file to write into, or
    else (``fd`` is ``None``) the name ``name`` in the open folder ``folder``, to be
    replaced whole. :meth:`close` closes what is open."""

    folder: int
    name: str
    fd: int | None = None

    def close(self) -> None:
        """Close the folder (and ``fd``, where still open)."""
        for fd in (self.fd, self.folder):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = None


def find_output(path: str) -> Output:
    """Walk ``path`` to where its output goes; raises :class:`OSError`.

    A link is followed where only this user or root can have put it: the link is theirs,
    and its folder is theirs and closed to others, or sticky. Elsewhere a link as the last
    name is replaced like a file, never followed, and a link on the way is an error. A
    device or FIFO as the last name, in such a place, is opened to be written into (as a
    shell's ``>`` does); elsewhere it is replaced. A name under ``/proc`` (``/dev/stdout``
    leads there) is opened by the kernel, which alone can follow it.
    """
    if not path:
        raise FileNotFoundError(errno.ENOENT, "no file named", path)
    if path.endswith("/"):
        raise IsADirectoryError(errno.EISDIR, "it names a folder", path)
    walk = _Walk(os.open("/" if path.startswith("/") else ".", _FOLDER), path)
    try:
        return walk.run()
    except BaseException:
        os.close(walk.folder)  # the folder it had reached
        raise


class _Walk:
    """The walk down ``path`` from the open ``folder``, which it moves on (and closes)."""

    def __init__(self, folder: int, path: str) -> None:
        self.folder = folder
        self.path = path

    def _move(self, new: int) -> None:
        os.close(self.folder)
        self.folder = new

    def run(self) -> Output:
        """Walk each name; return where the output goes."""
        path = self.path
        pending = [n for n in reversed(path.split("/")) if n not in ("", ".")]
        links = 0
        while pending:
            name = pending.pop()
            last = not pending
            if name == "..":
                if last:
                    raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
                self._move(os.open("..", _FOLDER, dir_fd=self.folder))
                continue
            try:
                info = os.stat(name, dir_fd=self.folder, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return Output(self.folder, name)
                raise FileNotFoundError(errno.ENOENT, "no such folder", path) from None
            if stat.S_ISLNK(info.st_mode):
                if not _trusted(self.folder, info):
                    if last:
                        return Output(self.folder, name)  # replaced, never followed
                    raise PermissionError(
                        errno.EACCES, f"not following {name}: another user may have put it", path
                    )
                if last and _in_proc(self.folder):
                    return Output(self.folder, name, _open_into(self.folder, name, None))
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many links", path)
                target = os.readlink(name, dir_fd=self.folder)
                if target.endswith("/") and last:
                    raise IsADirectoryError(errno.EISDIR, "it leads to a folder", path)
                if target.startswith("/"):
                    self._move(os.open("/", _FOLDER))
                pending.extend(n for n in reversed(target.split("/")) if n not in ("", "."))
                continue
            if stat.S_ISDIR(info.st_mode):
                if last:
                    raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
                self._move(os.open(name, _FOLDER | os.O_NOFOLLOW, dir_fd=self.folder))
                continue
            if not last:
                raise NotADirectoryError(errno.ENOTDIR, f"{name} is not a folder", path)
            if stat.S_ISREG(info.st_mode) or not _trusted(self.folder, info):
                return Output(self.folder, name)
            return Output(self.folder, name, _open_into(self.folder, name, info))
        raise IsADirectoryError(errno.EISDIR, "it is a folder", path)


def _trusted(folder: int, entry: os.stat_result) -> bool:
    """Whether only this user or root can have put ``entry`` in ``folder``."""
    users = (os.geteuid(), 0)
    held = os.fstat(folder)
    closed = not held.st_mode & 0o022 or bool(held.st_mode & stat.S_ISVTX)
    return entry.st_uid in users and held.st_uid in users and closed


def _in_proc(folder: int) -> bool:
    try:
        return os.fstat(folder).st_dev == os.stat("/proc").st_dev
    except OSError:
        return False


def _open_into(folder: int, name: str, seen: os.stat_result | None) -> int:
    """Open the device or FIFO ``name`` (``seen`` by the walk) to write into it, or the
    ``/proc`` link ``name`` (``seen`` is ``None``) through the kernel."""
    if seen is None:  # /proc/<pid>/fd/1: a pipe, a terminal, or a file `>` or `>>` opened
        return os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC, dir_fd=folder)
    fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    got = os.fstat(fd)
    if (got.st_dev, got.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        raise PermissionError(errno.EACCES, "it changed while it was opened", name)
    return fd
