"""Safe file-system primitives for the directory backend: everything relative to one root fd.

The backend holds its root folder as a directory file descriptor and opens everything under
it relative to that descriptor, never by a path string. A name is resolved without following
any symbolic link, in any component, and without leaving the root: on Linux 5.6+ with one
``openat2`` call (``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``), elsewhere by opening one folder
at a time with ``O_DIRECTORY | O_NOFOLLOW``. So a member of a shared cache who swaps a folder
for a link, or renames a folder aside, cannot redirect a read or a write outside the cache.

Files are opened ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO never blocks an open), and checked with
``fstat`` before a read of unknown size: only a regular file no larger than the caller's
bound is read (:func:`read_regular`); :func:`read_range` reads a size it is told, and one byte.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import time

from runtime_cache.api import SPAN_HEAD, HeadOnly, Span, blob_tail, frames_blobs

try:
    import ctypes
except ImportError:  # pragma: no cover - a Python built without it: walk instead
    ctypes = None  # type: ignore[assignment]

__all__ = [
    "NOFOLLOW",
    "PARTS_FROM",
    "Junk",
    "create_new",
    "fstat_or_none",
    "make_folders",
    "open_beneath",
    "open_folder",
    "own_leftover",
    "read_parts",
    "read_regular",
    "read_to_end",
    "regular_size",
    "remove_tree",
    "set_aside",
]

#: Flags every open adds: never follow a final link, never leak into children.
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW
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


#: The smallest file :func:`read_parts` reads in pieces: below it, copying the part (in
#: memory malloc keeps at hand) costs less than the extra reads (measured on Linux).
PARTS_FROM = 32 * 1024


class Junk(Exception):
    """Something other than a readable entry file sits at an entry's name."""


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

    Each level is made with ``mode`` (the umask applies), then set to ``chmod``
    when given (a shared cache keeps its folders group-writable and setgid).
    """
    try:
        return open_folder(root_fd, rel)
    except FileNotFoundError:
        pass
    fd = os.open(".", _DIR, dir_fd=root_fd)
    try:
        for part in rel.split("/"):
            try:
                os.mkdir(part, mode, dir_fd=fd)
                made = True
            except FileExistsError:
                made = False
            child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
            if made and chmod is not None:
                os.fchmod(fd, chmod)
    except BaseException:
        os.close(fd)
        raise
    return fd


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


def regular_size(fd: int, limit: int) -> int:
    """The size of the open file ``fd``; :class:`Junk` unless regular and at most ``limit``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a folder"}.get(stat.S_IFMT(st.st_mode))
        raise Junk(f"{kind or 'not a regular file'} (mode {st.st_mode:#o})")
    if st.st_size > limit:
        raise Junk(f"{st.st_size} bytes, over the {limit}-byte limit")
    return st.st_size


def read_to_end(fd: int, size: int, limit: int) -> bytes:
    """Read the file open at ``fd``, expected to hold ``size`` bytes, never past ``limit``."""
    # One read of the size fstat gave, plus a byte to see the end. Entries are
    # replaced, never written in place, so a short read (a network file system)
    # is rare: then read on, still within the limit.
    data = os.read(fd, size + 1)
    if len(data) != size:
        chunks = [data]
        total = len(data)
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise Junk(f"grew past the {limit}-byte limit while read")
        data = b"".join(chunks)
    return data


def read_parts(fd: int, size: int, limit: int, span: Span) -> tuple[bytes, ...]:
    """Read the file at ``fd`` (``size`` bytes) as :meth:`Backend.get_parts` describes.

    A file of at least :data:`PARTS_FROM` bytes is read in pieces: its first
    :data:`~runtime_cache.api.SPAN_HEAD` bytes, then the part ``span`` names with one
    ``pread``, so that part is a ``bytes`` of its own, then what follows it. For a span that
    frames its blobs (:func:`~runtime_cache.api.framing_span`: the front's entries), one
    whose head it finds no entry in, or of another size than the head says (its
    :func:`~runtime_cache.api.blob_tail`, or else more than ``SPAN_HEAD`` bytes after the
    span), is :class:`Junk`, read no further (a sparse gigabyte planted in a shared folder
    was read whole); a :class:`HeadOnly` answer returns the head alone. Anything else
    unexpected (a span out of range, a file that changed size) reads it as read_to_end does.
    """
    if size >= PARTS_FROM:
        head = os.pread(fd, SPAN_HEAD, 0)
        where = span(head) if len(head) == SPAN_HEAD else None
        framed = frames_blobs(span)  # (the front's entries: it can tell junk from a head)
        if where is None and framed:
            raise Junk("a file with no entry header")
        start, end = where or (-1, -1)
        if framed and 0 <= start <= end:
            after = blob_tail(span, head)  # (None: within SPAN_HEAD)
            if not 0 <= size - end <= SPAN_HEAD if after is None else size - end != after:
                raise Junk("an entry of another size than its header says")
        if framed and type(where) is HeadOnly:  # refused by its head: kept, not read on
            return head, b""
        # One byte more than is left shows a file that grew since fstat.
        if end == size and 0 <= start <= SPAN_HEAD and start <= end:
            middle = os.pread(fd, end - start + 1, start)
            if len(middle) == end - start:
                return head[:start], middle, b""
        elif 0 <= start <= SPAN_HEAD and start <= end < size:
            middle = os.pread(fd, end - start, start)
            tail = os.pread(fd, size - end + 1, end)
            if len(middle) == end - start and len(tail) == size - end:
                return head[:start], middle, tail
        os.lseek(fd, 0, os.SEEK_SET)
    return (read_to_end(fd, size, limit),)


def fstat_or_none(fd: int) -> os.stat_result | None:
    """``os.fstat(fd)``, or ``None`` where it fails."""
    try:
        return os.fstat(fd)
    except OSError:
        return None


def read_range(fd: int, start: int, end: int, size: int) -> tuple[bytes, bytes] | None:
    """The bytes ``[start:end]`` and ``[end:]`` of the file at ``fd`` when it is ``size`` bytes
    long (a byte more than is left shows another size) and ``0 <= start <= end <= size``."""
    if not 0 <= start <= end <= size:
        return None
    try:
        if end == size:
            middle, tail = os.pread(fd, end - start + 1, start), b""
        else:
            middle, tail = os.pread(fd, end - start, start), os.pread(fd, size - end + 1, end)
    except OSError as exc:  # a FIFO, a folder, a device: None, as for another size
        if exc.errno in (errno.ESPIPE, errno.EISDIR, errno.EINVAL, errno.ENXIO):
            return None
        raise
    return (middle, tail) if len(middle) == end - start and len(tail) == size - end else None


def read_regular(fd: int, limit: int) -> bytes:
    """Read the whole file at ``fd`` if it is a regular file of at most ``limit`` bytes.

    Raises :class:`Junk` before reading anything otherwise (a FIFO, a device, a
    folder, a huge or sparse file).
    """
    return read_to_end(fd, regular_size(fd, limit), limit)


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
