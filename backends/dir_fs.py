"""Safe file-system primitives for the directory backend: everything relative to one root fd.

The backend holds its root folder as a directory file descriptor and opens everything under
it relative to that descriptor, never by a path string. A name is resolved without following
any symbolic link, in any component, and without leaving the root: on Linux 5.6+ with one
``openat2`` call (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``), elsewhere by opening one folder
at a time with ``O_DIRECTORY | O_NOFOLLOW``. So a member of a shared cache who swaps a folder
for a link, or renames a folder aside, cannot redirect a read or a write outside the cache.

Files are opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks an open), and read by
descriptor within a bound (:mod:`.bounded_reads`, whose names this module still exports).
A name found holding something else is set aside and removed without following a link
(:func:`set_aside`, :func:`remove_tree`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import sys
import time

from .bounded_reads import (
    PARTS_FROM,
    Junk,
    fstat_or_none,
    read_parts,
    read_range,
    read_regular,
    read_to_end,
    regular_size,
)

# Read by descriptor, moved out of this module: still importable from here.
from .folder_making import make_folder, remove_stale_temps

try:
    import ctypes
except ImportError:  # pragma: no cover - a Python built without it: walk instead
    ctypes = None  # type: ignore[assignment]

__all__ = [
    "NOFOLLOW",
    "PARTS_FROM",
    "Junk",
    "clear_way",
    "create_new",
    "fstat_or_none",
    "kind_of",
    "make_folders",
    "open_beneath",
    "open_folder",
    "own_leftover",
    "read_parts",
    "read_range",
    "read_regular",
    "read_to_end",
    "regular_size",
    "remove_link",
    "remove_tree",
    "set_aside",
]

#: Flags every open adds: never follow a final link, never leak into children.
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
#: The name a shared cache's folder is made under before it takes its own (a random end
#: follows; a name starting with "." is no key's, so listings pass it by).
TEMP_FOLDER = ".rc-dir-"
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every Linux architecture (unified table)


#: Seconds :func:`set_aside` spends removing a folder found at a name; the rest waits.
JUNK_SECONDS = 0.2
#: The names the backend gives its own temporary files and the names it sets aside: a
#: prefix and 16 random hex digits (and, as earlier builds named them, ``.tmp-PID-THREAD-N``
#: and ``.tmp-hits-PID``). Only these are ever removed as leftovers.
_OWN_LEFTOVER = re.compile(
    r"\.(?:(?:tmp-(?:hits-)?|junk-|del-)[0-9a-f]{16}|tmp-[0-9]+-[0-9]+-[0-9]+|tmp-hits-[0-9]+)"
)


def own_leftover(name: str) -> bool:
    """Whether ``name`` is one the backend gives its temporary files or what it sets aside
    (``.tmp-``, ``.tmp-hits-``, ``.junk-`` or ``.del-``, then 16 hex digits): a file named
    so by anyone else (``.tmp-notes.txt``) is never taken for a leftover."""
    return _OWN_LEFTOVER.fullmatch(name) is not None


if ctypes is not None:

    class _OpenHow(ctypes.Structure):
        _fields_ = (
            ("flags", ctypes.c_uint64),
            ("mode", ctypes.c_uint64),
            ("resolve", ctypes.c_uint64),
        )


def _load_openat2() -> object | None:
    if ctypes is None or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.syscall
    except (OSError, AttributeError):  # pragma: no cover - odd libc
        return None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    probe = _OpenHow(_DIR, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS)
    fd = call(_SYS_OPENAT2, -100, b".", ctypes.byref(probe), ctypes.sizeof(probe))
    if fd < 0:
        return None  # ENOSYS (old kernel) or blocked by a seccomp filter: walk instead
    os.close(fd)
    return call


_openat2 = _load_openat2()
_hows: dict[tuple[int, int], tuple[_OpenHow, int]] = {}


def _how(flags: int, mode: int) -> tuple[object, int]:
    found = _hows.get((flags, mode))
    if found is None:
        how = _OpenHow(
            flags, mode, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
        )
        found = _hows[(flags, mode)] = (how, ctypes.sizeof(how))
    return ctypes.byref(found[0]), found[1]


def open_beneath(root_fd: int, rel: str, flags: int, mode: int = 0) -> int:
    """Open ``rel`` (a ``/``-separated name without ``.`` or ``..``) under ``root_fd``.

    No component may be a symbolic link (``ELOOP``) and the result stays under
    the root. ``flags`` gets :data:`NOFOLLOW` added.
    """
    flags |= NOFOLLOW
    if _openat2 is not None:
        ref, size = _how(flags, mode if flags & os.O_CREAT else 0)
        fd: int = _openat2(_SYS_OPENAT2, root_fd, os.fsencode(rel), ref, size)  # type: ignore[operator]
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), rel)
        return fd
    folder, _, name = rel.rpartition("/")
    if not folder:
        return os.open(name, flags, mode, dir_fd=root_fd)
    parent = open_folder(root_fd, folder)
    try:
        return os.open(name, flags, mode, dir_fd=parent)
    finally:
        os.close(parent)


def open_folder(root_fd: int, rel: str) -> int:
    """Open the folder ``rel`` under ``root_fd`` (no link followed); ``""`` is the root itself."""
    if not rel:
        return os.open(".", _DIR, dir_fd=root_fd)
    if _openat2 is not None:
        return open_beneath(root_fd, rel, _DIR)
    fd = root_fd
    try:
        for part in rel.split("/"):
            child = os.open(part, _DIR, dir_fd=fd)
            if fd != root_fd:
                os.close(fd)
            fd = child
    except BaseException:
        if fd != root_fd:
            os.close(fd)
        raise
    return fd


def make_folders(root_fd: int, rel: str, mode: int, chmod: int | None = None) -> int:
    """Open the folder ``rel`` under ``root_fd``, creating missing levels; return its fd.

    Each level is made with ``mode`` (the umask applies); with ``chmod`` (a shared cache
    keeps its folders group-writable and setgid), under a random name first, given
    ``chmod``, then its name (:func:`.folder_making.make_folder`): made at its name, another
    member's store found it at ``mkdir``'s mode and failed, and a folder of the victim's
    swapped in there by a member was given the group's mode.
    """
    try:
        return open_folder(root_fd, rel)
    except FileNotFoundError:
        pass
    fd = os.open(".", _DIR, dir_fd=root_fd)
    try:
        for part in rel.split("/"):
            child = _folder(fd, part, mode, chmod)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _folder(parent: int, name: str, mode: int, chmod: int | None) -> int:
    # The folder ``name`` in ``parent``, made where missing; its descriptor.
    if chmod is None:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, mode, dir_fd=parent)
        return os.open(name, _DIR, dir_fd=parent)
    try:
        return os.open(name, _DIR, dir_fd=parent)
    except FileNotFoundError:
        pass
    remove_stale_temps(parent, TEMP_FOLDER)
    made = make_folder(parent, name, mode, chmod, TEMP_FOLDER, inner=True)
    return os.open(name, _DIR, dir_fd=parent) if made is None else made


def create_new(dir_fd: int, prefix: str, mode: int, chmod: int | None = None) -> tuple[int, str]:
    """Create a new file with a random name in ``dir_fd``, ``O_EXCL``; return ``(fd, name)``.

    Like :func:`tempfile.mkstemp`: the name is unpredictable and never a link.
    """
    for _ in range(100):
        name = f"{prefix}{os.urandom(8).hex()}"
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        if chmod is not None:
            try:
                os.fchmod(fd, chmod)
            except OSError:
                os.close(fd)
                os.unlink(name, dir_fd=dir_fd)
                raise
        return fd, name
    raise FileExistsError(errno.EEXIST, "no free temp name", prefix)  # pragma: no cover


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISREG, "a file"),
)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, for messages: ``"a socket"``, ``"a file"``,
    ``"a device"`` (a character or block one)."""
    return next((what for test, what in _KINDS if test(mode)), "a device")


def clear_way(root_fd: int, rel: str) -> tuple[str, str, bool]:
    """Remove the link, FIFO, socket, folder or file at or above the entry name ``rel``
    that keeps it from being written: walks from the root one folder at a time, and the
    first name that is not a real folder (or, last, ``rel`` itself) is set aside
    (:func:`set_aside`), never followed. Returns that name (``rel`` or a folder's above
    it), what it was (``"a socket"``; ``""``: nothing there, or no answer) and whether the
    name is free now."""
    parts = rel.split("/")
    fd = os.open(".", _DIR, dir_fd=root_fd)
    try:
        for depth, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                return rel, "", True
            except OSError:
                return ("/".join(parts[: depth + 1]), *_named_aside(fd, part))
            os.close(fd)
            fd = child
        return (rel, *_named_aside(fd, parts[-1]))
    finally:
        os.close(fd)


def _named_aside(dir_fd: int, name: str) -> tuple[str, bool]:
    # What sits at ``name`` (kind_of; "" with no answer), and whether set_aside freed it.
    try:
        what = kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        what = ""
    return what, set_aside(dir_fd, name, ".junk-")


def remove_link(root_fd: int, rel: str) -> bool:
    """Remove the symbolic link at ``rel`` under ``root_fd``: the link alone, reached
    without following any link, so what it points to is never touched. Anything else at
    the name is left (a folder made there since is the cache's again). Returns whether no
    link is there now; raises :class:`OSError` when it could not be removed."""
    folder, _, name = rel.rpartition("/")
    try:
        fd = open_folder(root_fd, folder)
    except FileNotFoundError:
        return True
    try:
        if not stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            return True
        os.unlink(name, dir_fd=fd)  # (a folder there since: EISDIR, raised)
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)
    return True


def set_aside(dir_fd: int, name: str, prefix: str, seconds: float = JUNK_SECONDS) -> bool:
    """Remove whatever sits at ``name`` in ``dir_fd`` (a link, a FIFO, a folder); never follow it.

    A folder is first renamed to a fresh hidden name (``prefix`` and 16 hex digits), so
    the entry's name is free at once, then removed by :func:`remove_tree` for at most
    ``seconds``; what is left keeps such names, for a later vacuum. Returns whether the
    name is free now.
    """
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return True
    except IsADirectoryError:
        pass
    except OSError as exc:
        if exc.errno != errno.EPERM:  # Linux answers EISDIR; some systems EPERM
            return False
    aside = f"{prefix}{os.urandom(8).hex()}"
    try:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        return False
    remove_tree(dir_fd, aside, prefix, time.monotonic() + seconds)
    return True


def remove_tree(dir_fd: int, name: str, prefix: str, deadline: float) -> bool:
    """Remove the folder ``name`` in ``dir_fd`` and all it holds, until ``deadline``
    (``time.monotonic()``); return whether it is all gone.

    No link is followed, and nothing recurses: each folder found inside is first moved
    up beside ``name`` (under ``prefix`` and 16 hex digits) and removed in its turn, so
    a tree nested thousands deep holds no stack and no descriptor per level. A tree
    too large for the time left, or parts of it this process may not remove, stay, as
    folders of such names.
    """
    pending = [name]
    complete = True
    while pending:
        if time.monotonic() > deadline:
            return False
        current = pending.pop()
        try:
            fd = os.open(current, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a link by now
                try:
                    os.unlink(current, dir_fd=dir_fd)
                    continue
                except OSError:
                    pass
            complete = False
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    if time.monotonic() > deadline:
                        return False
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            moved = f"{prefix}{os.urandom(8).hex()}"
                            os.rename(entry.name, moved, src_dir_fd=fd, dst_dir_fd=dir_fd)
                            pending.append(moved)
                        else:
                            os.unlink(entry.name, dir_fd=fd)
                    except OSError:
                        complete = False
        except OSError:
            complete = False  # a folder that cannot be listed: left for a later turn
        finally:
            os.close(fd)
        try:
            os.rmdir(current, dir_fd=dir_fd)
        except OSError:
            complete = False
    return complete
