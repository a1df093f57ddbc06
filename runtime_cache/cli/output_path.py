"""Where a file named on the command line is written: the path is walked one name at a
time from ``/``, each folder held open, and a link, FIFO or device is used only where
nobody but this user or root can have put it.

The kernel's own lookup follows every link on the way, and a check made before it
(``lstat``, ``realpath``) can be undone before the open: a member of a group that can
write a folder on the way swaps a folder or plants a link between the two, and the
output lands on a file of the user's choosing. Here each step is made from the folder
descriptor the step before opened, with ``O_NOFOLLOW``, and ``..`` goes back to the
folder held before (not to the parent of one a member may have moved since), so what was
checked is what is used. "Who can have put it" is asked of every folder from ``/`` down,
not of the entry's own folder alone: whoever can write a folder above can move the
user's own link (or a folder holding one) to where the user will look.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import NamedTuple

from ..environment import group_of_one

__all__ = ["MAX_LINKS", "Output", "find_output"]

#: Links followed in one path at most (Linux's own limit).
MAX_LINKS = 40
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


@dataclass
class Output:
    """Where to write: ``fd`` open on a device, FIFO or ``/proc`` file to write into, or
    else (``fd`` is ``None``) the name ``name`` in the open folder ``folder``, to be
    replaced whole. ``link_replaced`` says why a link at ``name`` is replaced rather than
    followed (``""``: no link). :meth:`close` closes what is open."""

    folder: int
    name: str
    fd: int | None = None
    link_replaced: str = ""

    def close(self) -> None:
        """Close the folder (and ``fd``, where still open); once: a second call closes
        nothing (the numbers may be another file's by then)."""
        for fd in (self.fd, self.folder):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = None
        self.folder = -1


def find_output(path: str) -> Output:
    """Walk ``path`` to where its output goes; raises :class:`OSError`.

    A link, FIFO or device is trusted where only this user or root can have put it: it
    is theirs, and so is every folder from ``/`` down to it, none of which anyone else
    can write (a sticky folder such as ``/tmp`` does not count: others can move entries
    into it; a folder its group can write counts where that group is its owner's alone,
    as OpenSSH judges). A trusted link is followed; a trusted device or FIFO is opened to
    be written into (as a shell's ``>`` does). Elsewhere a link as the last name is
    replaced like a file, never followed; a link on the way, a FIFO or a device is an
    error. A name under ``/proc`` (``/dev/stdout`` leads there) is opened by the kernel,
    which alone can follow it.
    """
    if not path:
        raise FileNotFoundError(errno.ENOENT, "no file named", path)
    if _names_a_folder(path):
        raise IsADirectoryError(errno.EISDIR, "it names a folder", path)
    names = path
    if not path.startswith("/"):
        try:
            names = os.path.join(os.getcwd(), path)  # so the folders above are seen too
        except OSError:  # (the current folder was removed): nothing above it is known
            pass
    walk = _Walk(path, names)
    try:
        return walk.run(names)
    except BaseException:
        walk.close()
        raise


class _Held(NamedTuple):
    fd: int  # -1: let go (a deep path), and judged open again if gone back to
    closed: bool  # nobody but this user or root can write it
    shown: str  # its path, for messages


#: Folders held open at most (a path of thousands of names would run out of descriptors).
HELD_AT_MOST = 64


class _Walk:
    """The walk down ``path``: the folders held, from ``/`` (or from the current folder
    where it is unknown, judged open) to the one reached."""

    def __init__(self, path: str, names: str) -> None:
        self.path = path
        self.held: list[_Held] = []
        if names.startswith("/"):
            self._to_root()
        else:
            self.held.append(_Held(os.open(".", _FOLDER), False, "."))

    @property
    def folder(self) -> int:
        return self.held[-1].fd

    def close(self) -> None:
        """Close every folder held."""
        while self.held:
            fd = self.held.pop().fd
            if fd >= 0:
                os.close(fd)

    def _down(self, name: str) -> None:
        fd = os.open(name, _FOLDER | os.O_NOFOLLOW, dir_fd=self.folder)
        self.held.append(_Held(fd, _closed(fd), os.path.join(self.held[-1].shown, name)))
        deep = len(self.held) - 1 - HELD_AT_MOST
        if deep >= 0 and self.held[deep].fd >= 0:  # let the oldest go, keeping its verdict
            os.close(self.held[deep].fd)
            self.held[deep] = self.held[deep]._replace(fd=-1)

    def _up(self) -> None:
        if len(self.held) > 1 and self.held[-2].fd < 0:  # let go: its parent now, judged open
            top = self.held.pop()
            try:
                fd = os.open("..", _FOLDER, dir_fd=top.fd)
            finally:
                os.close(top.fd)
            self.held[-1] = self.held[-1]._replace(fd=fd, closed=False)
        elif len(self.held) > 1:  # back to the folder held before, wherever it is now
            os.close(self.held.pop().fd)
        elif self.held[0].shown != "/":  # above an unknown current folder: unknown too
            top = self.held.pop()
            try:
                fd = os.open("..", _FOLDER, dir_fd=top.fd)
            finally:
                os.close(top.fd)
            self.held.append(_Held(fd, False, os.path.join(top.shown, "..")))
        # (the parent of "/" is "/")

    def _to_root(self) -> None:
        self.close()
        fd = os.open("/", _FOLDER)
        self.held.append(_Held(fd, _closed(fd), "/"))

    def _open_to_others(self) -> str:
        """The first folder held that others can write (``""``: none)."""
        return next((h.shown for h in self.held if not h.closed), "")

    def _trusted(self, entry: os.stat_result) -> bool:
        return entry.st_uid in _users() and not self._open_to_others()

    def _finish(self, name: str, fd: int | None = None, link_replaced: str = "") -> Output:
        """The output at ``name`` in the folder reached, which the output now holds."""
        last = self.held.pop()
        self.close()
        return Output(last.fd, name, fd, link_replaced)

    def _why_not(self) -> str:
        """Why an entry here is not trusted (its owner or a folder above it)."""
        where = self._open_to_others()
        return f"others can write {where}" if where else "it is another user's"

    def _refuse(self, name: str, what: str) -> PermissionError:
        text = (
            f"not using the {what} {name}: another user may have put it there ({self._why_not()})"
        )
        return PermissionError(errno.EACCES, text, self.path)

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
                    return self._finish(name)
                raise FileNotFoundError(errno.ENOENT, "no such folder", path) from None
            if stat.S_ISLNK(info.st_mode):
                if not self._trusted(info):
                    if last:  # replaced, never followed
                        return self._finish(name, link_replaced=self._why_not())
                    raise self._refuse(name, "link")
                if last and _in_proc(self.folder):
                    return self._finish(name, _open_into(self.folder, name, None))
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
                return self._finish(name)
            if not self._trusted(info):
                raise self._refuse(name, "FIFO or device")
            return self._finish(name, _open_into(self.folder, name, info))
        raise IsADirectoryError(errno.EISDIR, "it leads to a folder", path)


def _names_a_folder(path: str) -> bool:
    """Whether ``path`` can name nothing but a folder (``x/``, ``x/.``, ``..``)."""
    return path.endswith(("/", "/.", "/..")) or path in (".", "..")


def _users() -> tuple[int, ...]:
    return (os.geteuid(), 0)


def _closed(folder: int) -> bool:
    """Whether nobody but this user or root can write ``folder``."""
    held = os.fstat(folder)
    if held.st_uid not in _users() or held.st_mode & 0o002:
        return False
    return not held.st_mode & 0o020 or group_of_one(held.st_gid, held.st_uid)


def _in_proc(folder: int) -> bool:
    try:
        return os.fstat(folder).st_dev == os.stat("/proc").st_dev
    except OSError:
        return False


def _open_into(folder: int, name: str, seen: os.stat_result | None) -> int:
    """Open the device or FIFO ``name`` (``seen`` by the walk, in folders only this user
    or root can write) to write into it, or the ``/proc`` link ``name`` (``seen`` is
    ``None``) through the kernel."""
    # O_NOCTTY: a terminal opened (to be refused: .output.TerminalOutput) never becomes
    # this process's controlling terminal.
    flags = os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY
    if seen is None:  # /proc/<pid>/fd/1: a pipe, a terminal, or a file `>` or `>>` opened
        return os.open(name, flags | os.O_APPEND, dir_fd=folder)
    return os.open(name, flags | os.O_NOFOLLOW, dir_fd=folder)
