"""Making a folder that others may share, so that nobody finds it before it has its mode,
and no folder swapped in for it is ever given its mode.

A shared ``dir://`` cache makes its folders setgid and group-writable. Made with
``mkdir`` at their own name and then ``chmod``-ed through a descriptor, two things went
wrong between the two steps: another member's process found the new folder at
``mkdir``'s mode (the umask's: not group-writable) and its store failed; and a member who
swapped a private folder of the victim's in at that name (``renameat2`` with
``RENAME_EXCHANGE``, from any folder they may write on the same file system) had the
victim's process make it group-writable. So :func:`make_folder` makes the folder under a
random name, private, checks it is the one made (this user's, empty), gives it its mode,
and only then gives it its name with ``renameat2(RENAME_NOREPLACE)``
(:mod:`.exclusive_rename`), never over what another process made there meanwhile.
Without ``renameat2`` it is made at its name and given its mode only where it is found
this user's and empty (:func:`made_in_place`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

from .exclusive_rename import rename_noreplace

__all__ = ["FOLDER_FLAGS", "FolderSwapped", "fresh", "make_folder", "remove_stale_temps"]

#: How a folder just made is opened, to set its mode: no link followed at its name.
FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: How long a temporary folder of this user's is left before another maker removes it.
_STALE_SECONDS = 60.0


class FolderSwapped(OSError):
    """The folder made was swapped for another on the way (an attack, not a race)."""


def fresh(fd: int) -> bool:
    """Whether the folder open as ``fd`` can be the one just made: this user's, and
    empty. A folder of the victim's swapped in for it (``RENAME_EXCHANGE``) is seldom
    empty; an empty one has nothing to give away."""
    try:
        return os.fstat(fd).st_uid == os.geteuid() and not os.listdir(fd)
    except OSError:
        return False


def make_folder(
    parent: int, name: str, mode: int, chmod: int | None, temp_prefix: str, *, inner: bool = False
) -> int | None:
    """Make the folder ``name`` in the open folder ``parent`` (``mode``, the umask's say;
    then ``chmod`` where given), under a random name of ``temp_prefix`` first; its
    descriptor (:data:`FOLDER_FLAGS`), or ``None`` where something was at ``name`` by then.
    Raises :class:`OSError`: :class:`FolderSwapped` where the folder made was swapped.
    ``inner``: a folder inside the cache (see :func:`made_in_place`)."""
    import secrets  # (only where a folder is made)

    temp = f"{temp_prefix}{secrets.token_hex(8)}"
    # Private until its mode is set: no member of a shared parent writes into it first.
    os.mkdir(temp, mode if chmod is None else 0o700, dir_fd=parent)
    fd = os.open(temp, FOLDER_FLAGS, dir_fd=parent)
    try:
        if not fresh(fd):
            raise FolderSwapped(f"the folder made for {name} was swapped")
        if chmod is not None:
            os.fchmod(fd, chmod)
        moved = rename_noreplace(parent, temp, name)
        if not moved:
            with contextlib.suppress(OSError):  # (ours, and empty: rmdir takes no other)
                os.rmdir(temp, dir_fd=parent)
            os.close(fd)
            return None if moved is False else made_in_place(parent, name, mode, chmod, inner)
        if not os.path.samestat(os.stat(name, dir_fd=parent, follow_symlinks=False), os.fstat(fd)):
            raise FolderSwapped(f"the folder made for {name} was swapped")
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def made_in_place(
    parent: int, name: str, mode: int, chmod: int | None, inner: bool = False
) -> int | None:
    """:func:`make_folder` where there is no ``renameat2`` (glibc before 2.28, NFS, FUSE):
    ``mkdir`` at ``name``, given ``chmod`` through its descriptor where it is found this
    user's and, for a cache's root, empty; ``None`` where something was there, or what
    was found is not (swapped, or found and stored into at once by another process of
    this user: taken as it is, its mode left, and a member's store into it fails: the
    price, at a root, of never chmod-ing a victim's folder swapped in beside it). A
    folder ``inner`` to the cache is not judged by what it holds: a folder is moved to
    another parent only by whoever may write it (its ``..``), so no victim's private
    folder can be swapped in there, and the store of another process of this user, which
    found it at once, left it at ``mkdir``'s mode and members' stores into it failing
    for good."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        return None
    fd = os.open(name, FOLDER_FLAGS, dir_fd=parent)
    try:
        mine = os.fstat(fd).st_uid == os.geteuid() if inner else fresh(fd)
        if not mine:
            os.close(fd)
            return None
        if chmod is not None:
            os.fchmod(fd, chmod)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def remove_stale_temps(parent: int, temp_prefix: str) -> None:
    """Remove the folders a killed maker left in ``parent``: this user's, empty, named
    with ``temp_prefix``, untouched for a minute."""
    try:
        names = [n for n in os.listdir(parent) if n.startswith(temp_prefix)]
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            if mine and time.time() - st.st_mtime > _STALE_SECONDS:
                os.rmdir(name, dir_fd=parent)  # (empty alone: one holding files stays)
