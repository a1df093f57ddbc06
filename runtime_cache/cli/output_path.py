"""Where a file named on the command line is written: the path is walked one name at a
time from ``/``, each folder held open, and a link, FIFO or device is used only where
nobody but this user or root can have put it.

The kernel's own lookup follows every link on the way, and a check made before it
(``lstat``, ``realpath``) can be undone before the open: a member of a group that can
write a folder on the way swaps a folder or plants a link between the two, and the
output lands on a file of the user's choosing. Here each step is made from the folder
descriptor the step before opened, with ``O_NOFOLLOW``, so what was checked is what is
used. And "who can have put it" is asked of every folder from ``/`` down, not of the
entry's own folder alone: whoever can write a folder above can move the user's own link
(or a folder holding one) to where the user will look, and ``rename`` needs no more.
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

    A link, FIFO or device is trusted where only this user or root can have put it: it
    is theirs, and so is every folder from ``/`` down to it, none of which anyone else
    can write (a sticky folder such as ``/tmp`` does not count: others can move entries
    into it). A trusted link is followed; a trusted device or FIFO is opened to be
    written into (as a shell's ``>`` does). Elsewhere a link as the last name is replaced
    like a file, never followed; a link on the way, a FIFO or a device is an error. A
    name under ``/proc`` (``/dev/stdout`` leads there) is opened by the kernel, which
    alone can follow it.
    """
    if not path:
        raise FileNotFoundError(errno.ENOENT, "no file named", path)
    if _names_a_folder(path):
        raise IsADirectoryError(errno.EISDIR, "it names a folder", path)
    start, names = "/", path
    if not path.startswith("/"):
        try:
            names = os.path.join(os.getcwd(), path)  # so the folders above are seen too
        except OSError:  # (the current folder was removed): nothing above it is known
            start = "."
    walk = _Walk(os.open(start, _FOLDER), path, known=start == "/")
    try:
        return walk.run(names)
    except BaseException:
        os.close(walk.folder)  # the folder it had reached
        raise


class _Walk:
    """The walk down ``path`` from the open ``folder``, which it moves on (and closes).
    ``closed`` holds, for each folder from ``/`` to the one reached, whether nobody but
    this user or root can write it."""

    def __init__(self, folder: int, path: str, known: bool) -> None:
        self.folder = folder
        self.path = path
        self.closed = [known and _closed(folder)]

    def _down(self, name: str) -> None:
        self._move(os.open(name, _FOLDER | os.O_NOFOLLOW, dir_fd=self.folder))
        self.closed.append(_closed(self.folder))

    def _up(self) -> None:
        self._move(os.open("..", _FOLDER, dir_fd=self.folder))
        if len(self.closed) > 1:
            self.closed.pop()  # (the parent of "/" is "/")

    def _to_root(self) -> None:
        self._move(os.open("/", _FOLDER))
        self.closed = [_closed(self.folder)]

    def _move(self, new: int) -> None:
        os.close(self.folder)
        self.folder = new

    def _trusted(self, entry: os.stat_result) -> bool:
        return entry.st_uid in _users() and all(self.closed)

    def run(self, names: str) -> Output:
        """Walk each of ``names``; return where the output goes."""
        path = self.path
        pending = [n for n in reversed(names.split("/")) if n not in ("", ".")]
        links = 0
        while pending:
            name = pending.pop()
            last = not pending
            if name == "..":
                self._up()
                continue
            try:
                info = os.stat(name, dir_fd=self.folder, follow_symlinks=False)
            except FileNotFoundError:
                if last:
                    return Output(self.folder, name)
                raise FileNotFoundError(errno.ENOENT, "no such folder", path) from None
            if stat.S_ISLNK(info.st_mode):
                if not self._trusted(info):
                    if last:
                        return Output(self.folder, name)  # replaced, never followed
                    raise PermissionError(errno.EACCES, _UNTRUSTED.format(name, "link"), path)
                if last and _in_proc(self.folder):
                    return Output(self.folder, name, _open_into(self.folder, name, None))
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many links", path)
                target = os.readlink(name, dir_fd=self.folder)
                if last and _names_a_folder(target):
                    raise IsADirectoryError(errno.EISDIR, "it leads to a folder", path)
                if target.startswith("/"):
                    self._to_root()
                pending.extend(n for n in reversed(target.split("/")) if n not in ("", "."))
                continue
            if stat.S_ISDIR(info.st_mode):
                if last:
                    raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
                self._down(name)
                continue
            if not last:
                raise NotADirectoryError(errno.ENOTDIR, f"{name} is not a folder", path)
            if stat.S_ISREG(info.st_mode):
                return Output(self.folder, name)
            if not self._trusted(info):
                raise PermissionError(errno.EACCES, _UNTRUSTED.format(name, "FIFO or device"), path)
            return Output(self.folder, name, _open_into(self.folder, name, info))
        raise IsADirectoryError(errno.EISDIR, "it leads to a folder", path)


_UNTRUSTED = (
    "not using the {1} {0}: another user may have put it there (a folder from / down to it "
    "is another user's, or others can write it)"
)


def _names_a_folder(path: str) -> bool:
    """Whether ``path`` can name nothing but a folder (``x/``, ``x/.``, ``..``)."""
    return path.endswith(("/", "/.", "/..")) or path in (".", "..")


def _users() -> tuple[int, ...]:
    return (os.geteuid(), 0)


def _closed(folder: int) -> bool:
    """Whether nobody but this user or root can write ``folder``."""
    held = os.fstat(folder)
    return held.st_uid in _users() and not held.st_mode & 0o022


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
