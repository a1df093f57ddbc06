"""The ``dir://`` backend's files at fixed names, opened to be written in place.

Some files are not replaced by a rename but written where they are: the eviction lock
(``.evict.lock``), the lease locks and the locks folder's own lock (``.locks/*.lock``,
``.locks/.unlinking``), the hits journal (``.hits``) and the vacuum's marker
(``.vacuumed``). In a ``shared=1`` folder any member can remove such a name and put
something else there. A symbolic link is never followed (``O_NOFOLLOW``), but a hard link
is no link to the open: it *is* the file it names. A member who may link a file of yours
(where ``fs.protected_hardlinks`` is 0, on macOS, on NFS) plants one to your private
file, and a write, a truncation, a touch or a ``chmod`` made through the cache's name
changes your file outside the cache (made group-readable, a lease token written over it,
hit lines appended to it).

So :func:`open_fixed` tells whether what it opened is the cache's own to write: a file
this process made now (``O_CREAT | O_EXCL``), or a regular file with one link
(:func:`in_place`). A file with more links has a name elsewhere too: never written,
truncated, touched or ``chmod``-ed. Its mode is set only on a file this process made or
owns. What a caller does with a file refused (removes its name and makes a fresh one,
sets it aside, goes without) fits the file's role; :func:`open_in_place` raises
:class:`NotInPlace` for it.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import stat
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: nothing is held
    fcntl = None  # type: ignore[assignment]

from .dir_fs import NOFOLLOW, kind_of

__all__ = ["NotInPlace", "held", "in_place", "open_fixed", "open_in_place", "planted"]

_NOT_MADE = ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)


class NotInPlace(OSError):
    """What sits at a fixed name is no file of the cache's own to write in place: a hard
    link (``errno.EMLINK``) or not a regular file (``errno.EINVAL``)."""


def in_place(st: os.stat_result) -> bool:
    """Whether a file found at a fixed name (``st``) may be written in place: a regular
    file with no other name (an unlinked one has none)."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink <= 1


def planted(dir_fd: int, name: str) -> str | None:
    """What sits at ``name`` in ``dir_fd`` where no file can be opened to be written and
    nothing may be removed (``"a socket"``, ``"a folder"``, ``"a symbolic link"``,
    ``"a device"``), looked at and never followed; ``None`` for nothing there, a file or a
    FIFO (:func:`open_fixed` opens those), or no answer."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) else kind_of(mode)


def open_fixed(
    dir_fd: int, name: str, flags: int, mode: int, chmod: int | None = None
) -> tuple[int, bool]:
    """Open ``name`` in ``dir_fd`` with ``flags`` (no link followed, no wait on a FIFO),
    making it with ``mode`` if missing; return its descriptor and whether it may be
    written in place (the caller closes it either way, and writes nothing to one refused).

    ``chmod``: the mode a file this process made, or one of its own of the folder's group
    that may be written in place, is given (a shared folder's: every member must open
    it); not one of another's."""
    flags = (flags | NOFOLLOW | os.O_NONBLOCK) & _NOT_MADE
    for _ in range(3):
        try:
            fd, made = os.open(name, flags | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd), True
        except FileExistsError:
            try:
                fd, made = os.open(name, flags, dir_fd=dir_fd), False
            except FileNotFoundError:
                continue  # removed since: made next round
        break
    else:
        raise OSError(errno.EAGAIN, "made and removed again and again meanwhile", name)
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    ours = made or in_place(st)
    if chmod is not None and ours and stat.S_IMODE(st.st_mode) != chmod:
        # Made now, or one of ours of the folder's group. (A link planted to a private
        # file whose other name then went, an editor's rename, has one name and this
        # user's uid, but the file's own group, not the shared folder's: the re-attack
        # review of session 41.)
        mine = made or (st.st_uid == os.geteuid() and _folder_group(dir_fd) == st.st_gid)
        if mine:
            with contextlib.suppress(OSError):
                os.fchmod(fd, chmod)
    return fd, ours


def _folder_group(dir_fd: int) -> int | None:
    try:
        return os.fstat(dir_fd).st_gid
    except OSError:
        return None


def open_in_place(dir_fd: int, name: str, flags: int, mode: int, chmod: int | None = None) -> int:
    """:func:`open_fixed`'s descriptor of a file that may be written in place; raises
    :class:`NotInPlace` (closing it) for one that may not, ``OSError`` when none opens."""
    fd, ours = open_fixed(dir_fd, name, flags, mode, chmod)
    if ours:
        return fd
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if stat.S_ISREG(st.st_mode):
        raise NotInPlace(errno.EMLINK, f"a hard link ({st.st_nlink} names), not the cache's", name)
    raise NotInPlace(errno.EINVAL, "not a regular file", name)


def held(fd: int, stale_after: float = math.inf) -> bool:
    """Whether a live holder holds an ``flock`` on the file open as ``fd``: a lock file
    given a second name (a hard-link backup, ``cp -al``; a member's ``ln``) while its
    holder holds it. Such a file is no junk to remove: a second holder would take the
    name's fresh file beside the first (the re-attack review of session 41). One held but
    not touched for ``stale_after`` seconds is a stale holder's: not held, as a lock of
    one name is broken then. One nobody holds is locked through ``fd`` until it is closed,
    so that nobody takes it between this look and its removal; no answer (a FIFO, no
    locks) is "not held"."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return time.time() - os.fstat(fd).st_mtime <= stale_after
        except OSError:
            return True
    except OSError:
        return False
    return False
