"""Opening a directory cache's root: the one descriptor, the file modes, and who may share it.

The root is opened once, following a link given as the root itself, and held
as a descriptor (``O_PATH`` where there is one, so that a root this process may
not list still opens and each call then fails on its own). Everything else is
opened relative to it, so repointing the link later changes nothing.

A private cache makes folders ``0700`` and files ``0600``. A shared one
(``shared=1``) makes folders setgid and group-writable and files group-readable
and writable; the umask decides what others may read, and others never write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from runtime_cache.errors import BackendError, ReadOnlyBackendError

from .folder_making import FolderSwapped, make_folder, remove_stale_temps
from .group_members import GroupMembers

__all__ = [
    "ROOT_FLAGS",
    "Modes",
    "backend_error",
    "make_root",
    "only_mine",
    "open_root",
    "owner_check",
    "read_umask",
    "remake_root",
]

#: Flags of the root descriptor (also used to reopen it after a fork).
ROOT_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
#: The name a root is made under before it takes its own (a random end follows).
_TEMP_ROOT = ".rc-root-"

_FULL = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class Modes:
    """Modes to create files and folders with (the umask applies), and to set after."""

    file: int
    folder: int
    file_chmod: int | None = None
    folder_chmod: int | None = None

    @classmethod
    def for_cache(cls, shared: bool) -> Modes:
        """Private ``0600``/``0700``, or a group's modes with this process's umask."""
        if not shared:
            return cls(0o600, 0o700)
        mask = read_umask()
        return cls(
            0o666,
            0o2777,
            ((0o666 & ~mask) | 0o660) & ~0o002,
            ((0o777 & ~mask) | 0o2770) & ~0o002,
        )


def _not_a_folder(root: str | Path) -> BackendError:
    try:
        target = os.readlink(root)
    except OSError:  # not a link (a file), or gone
        return BackendError(f"cache root {root} is not a directory")
    return BackendError(
        f"cache root {root} is a symbolic link to {target}, which is missing or no directory"
    )


def _failed(root: str | Path, exc: OSError) -> BackendError:
    if exc.errno in _READ_ONLY:
        return ReadOnlyBackendError(f"open of {root}: read-only or no permission ({exc.strerror})")
    return BackendError(f"open of {root}: {exc.strerror or exc}")


def open_root(root: str | Path, modes: Modes) -> int:
    """Open (creating it if missing: :func:`make_root`) the root folder; return its
    descriptor.

    Raises :class:`BackendError` ("is not a directory") when ``root`` names a file, and
    :class:`ReadOnlyBackendError` when this user may not enter it.
    """
    try:
        return _enterable(os.open(root, ROOT_FLAGS), root)
    except FileNotFoundError:
        pass
    except NotADirectoryError:
        raise _not_a_folder(root) from None
    except OSError as exc:
        raise _failed(root, exc) from exc
    return make_root(root, modes)[0]


def make_root(root: str | Path, modes: Modes) -> tuple[int, bool]:
    """Make the missing folder ``root`` (its parents too) and open it, following no link at
    its name; return its descriptor and whether this call made it.

    It is made under a random name beside ``root``, its mode set through its descriptor,
    and only then renamed to ``root``, unless something is there by then
    (:func:`.folder_making.make_folder`, which says why). Set by its name, a link that a
    member of a shared parent put there between the two steps was followed, and the
    folder it led to (the victim's own, ``0700``) made group-writable.

    A link at the name, new or old, is :class:`BackendError` ("is not a directory"): the
    root is made again (:func:`remake_root`) only where it was a folder.
    """
    name = os.fspath(root).rstrip("/") or "/"  # (a trailing "/" would follow a link)
    try:
        os.makedirs(os.path.dirname(name) or ".", mode=modes.folder, exist_ok=True)
        fd = _made_aside(name, modes)
        if fd is None:  # (made meanwhile by another: whoever made it set its mode)
            return _enterable(os.open(name, ROOT_FLAGS | os.O_NOFOLLOW), root), False
    except (FileExistsError, NotADirectoryError):
        raise _not_a_folder(root) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_folder(root) from None
        raise _failed(root, exc) from exc
    try:
        return os.open(".", ROOT_FLAGS, dir_fd=fd), True
    except OSError as exc:
        raise _failed(root, exc) from exc
    finally:
        os.close(fd)


def _made_aside(name: str, modes: Modes) -> int | None:
    """The folder made for ``name`` with its modes (open ``O_RDONLY``), or ``None`` where
    something was at ``name`` by then (:func:`.folder_making.make_folder`). Raises
    :class:`OSError`, and :class:`BackendError` where the folder made was swapped for
    another on the way (an attack, not a race)."""
    parent_name, base = os.path.split(name)
    parent = os.open(parent_name or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_stale_temps(parent, _TEMP_ROOT)
        return make_folder(parent, base, modes.folder, modes.folder_chmod, _TEMP_ROOT)
    except FolderSwapped:
        raise BackendError(f"cache root {name}: the folder made for it was swapped") from None
    finally:
        os.close(parent)


def _enterable(fd: int, root: str | Path) -> int:
    """``fd``, where this user may enter the folder it holds; else closed, and raised.
    (``O_PATH`` opens any folder: one another user made ``0700``, say by a ``sudo`` run
    that kept ``HOME``, was opened, and then every read and write of it failed.)"""
    effective = os.access in os.supports_effective_ids
    try:
        if os.access(".", os.X_OK, dir_fd=fd, effective_ids=effective):
            return fd
        info = os.fstat(fd)
    except OSError:
        return fd  # (no answer: its reads and writes will tell)
    os.close(fd)
    raise ReadOnlyBackendError(
        f"open of {root}: no permission to enter it (owner uid {info.st_uid}, mode "
        f"{stat.S_IMODE(info.st_mode):o})"
    )


def remake_root(root_fd: int, root: str, modes: Modes, members: object) -> None:
    """Make ``root`` again where it was removed under the process (``rm -rf``, a tmp
    cleaner; NFS: ``root_fd`` answers ESTALE), with an open's checks, at ``root_fd``'s own
    number (dup2: no thread meets a closed descriptor). No link at its name is followed
    (:func:`make_root`): in a shared folder a member can put one there, to a folder of the
    process's user (root's: ``/etc``), which the process would then have given to the
    group. A shared root this call made (``members``: :func:`owner_check`'s answer at the
    first open) gets back its group, not this process's; one another process made
    meanwhile is taken as it is. Where it cannot be made, ``root_fd`` is left as it is:
    writes fail, reads miss."""
    try:
        if os.fstat(root_fd).st_nlink > 0:
            return
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            return
    try:
        fd, made = make_root(root, modes)
    except (OSError, BackendError):
        return
    try:
        if made and isinstance(members, GroupMembers) and os.fstat(fd).st_gid != members.gid:
            with contextlib.suppress(OSError):  # (not a member of it)
                path = f"/proc/self/fd/{fd}"  # the folder made, whatever is at its name now
                os.chown(path, -1, members.gid)
                if modes.folder_chmod is not None:  # (a chown may drop the setgid bit)
                    os.chmod(path, modes.folder_chmod)
        owner_check(fd, root, members is not None)
        os.dup2(fd, root_fd, inheritable=False)
    except (OSError, BackendError):
        pass
    finally:
        os.close(fd)


def owner_check(root_fd: int, root: str | Path, shared: bool) -> GroupMembers | None:
    """Refuse a root others may write unless ``shared``; return the group's users when shared.

    A root that another user (not root) owns, or that its group or anyone may
    write, would let them plant entries and links. In a shared cache, files of
    users outside the root's group are left out of the cap.
    """
    st = os.fstat(root_fd)
    if not shared:
        foreign = st.st_uid not in (os.geteuid(), 0)
        if foreign or st.st_mode & 0o022:
            raise BackendError(
                f"cache root {root} is owned by another user or writable by its group or "
                "anyone; refusing it (add ?shared=1, or shared=True, to use it on purpose)"
            )
        return None
    return GroupMembers(st.st_gid, os.geteuid())


def only_mine(root_fd: int) -> bool:
    """Whether the root is private: ours (or root's, above every user anyway), and
    nobody else may write it."""
    try:
        st = os.fstat(root_fd)
    except OSError:
        return False
    geteuid = getattr(os, "geteuid", None)
    owner = geteuid is None or st.st_uid in (geteuid(), 0)
    return owner and not st.st_mode & 0o022


def backend_error(root: Path, op: str, exc: OSError, name: str = "") -> BackendError:
    """The typed error for ``exc`` raised by ``op`` on ``name`` under ``root`` (or in it)."""
    where = f"{op} of {root / name}" if name else f"{op} in {root}"
    if (op in ("write", "open") and exc.errno in _READ_ONLY) or exc.errno == errno.EROFS:
        return ReadOnlyBackendError(f"{where}: read-only or no permission ({exc.strerror})")
    if exc.errno in _FULL:
        return BackendError(f"{where}: disk full ({exc.strerror})")
    return BackendError(f"{where}: {exc.strerror or exc}")


def read_umask() -> int:
    """This process's umask, read without changing it where the system allows."""
    try:
        fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        for line in status.splitlines():
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)  # pragma: no cover - not Linux; racy with other threads
    os.umask(mask)  # pragma: no cover
    return mask  # pragma: no cover
