"""Where the command line's output goes: all of it or an error, and files replaced whole."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import select
import stat
import sys
import time
from typing import BinaryIO, TextIO

from .fmt import clean
from .output_path import Output, find_output

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX: the hour alone tells
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "STALE_TEMP_SECONDS",
    "TERMINAL_REFUSED",
    "TerminalOutput",
    "WholeText",
    "flush",
    "is_stdout",
    "link_replaced",
    "open_output",
    "replace_file",
    "write_all",
    "write_output",
    "write_text",
]

#: A temporary file of ours older than this (in seconds) was left by a writer that died
#: (``kill -9`` during an export): the next write of the same name removes it.
STALE_TEMP_SECONDS = 3600
#: A writer holds an ``flock`` on its temporary file from just after making it until it
#: takes the name; one older than this (seconds) that nobody holds is a dead writer's,
#: and goes at once (where the file system has no locks, the hour above still serves).
UNHELD_TEMP_SECONDS = 5


#: Why binary data (a bundle, a value) is not written to a terminal: it would only garble
#: the screen. Standard output (:func:`.context.binary_stdout`) and a file that is one
#: (:class:`TerminalOutput`) are refused alike.
TERMINAL_REFUSED = "not writing binary data to a terminal: redirect it (> FILE) or pipe it"


class TerminalOutput(Exception):
    """Binary data was to go to a terminal: standard output (:func:`.context.binary_stdout`)
    or a file :func:`replace_file` was to write (``/dev/tty``, ``/dev/pts/N``,
    ``/proc/self/fd/N`` of one); nothing was written. A usage error to the command line
    (exit 2, said as :data:`TERMINAL_REFUSED`), not an :class:`OSError`."""

    def __init__(self) -> None:
        super().__init__(TERMINAL_REFUSED)


def is_stdout(path: str) -> bool:
    """Whether ``path`` is standard output (``-``, ``/dev/stdout``, ``/dev/fd/1``, or the
    file it was sent to): where a bundle or a value goes, which a message would spoil."""
    if path == "-":
        return True
    try:
        # Started with it closed (``>&-``), descriptor 1 is the /dev/null the command holds
        # there: /dev/stdout is it, and so no file to write a bundle to (it went nowhere).
        out = 1 if sys.stdout is None else sys.stdout.fileno()
        return os.path.samestat(os.stat(path), os.fstat(out))
    except (OSError, ValueError, AttributeError):
        return False


def write_all(stream: BinaryIO, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``stream``, or raise.

    A buffered write of more than the pipe holds, into a pipe whose reader closes, returns
    a short count instead of raising: `export - | head -c 10` said "exported 3000 entries"
    and exited 0. The next write raises :class:`BrokenPipeError` (exit code 141). A
    non-blocking stream (inherited from a parent) that is only full is waited on, and
    flushed here: left in its buffer, the end met a full pipe at exit and was lost."""
    view = memoryview(data).cast("B")
    while view:
        try:
            written = stream.write(view) or 0
        except BlockingIOError as exc:
            written = exc.characters_written
        if not written and not _wait_writable(stream):
            raise BrokenPipeError(errno.EPIPE, "the output took no more")
        view = view[written:]
    flush(stream)


def flush(stream: BinaryIO | TextIO) -> None:
    """Flush ``stream``, waiting while a non-blocking one is full (:func:`write_all`);
    :class:`BrokenPipeError` where it takes no more."""
    while True:
        try:
            stream.flush()
            return
        except BlockingIOError:
            if not _wait_writable(stream):
                raise BrokenPipeError(errno.EPIPE, "the output took no more") from None


def _wait_writable(stream: BinaryIO | TextIO) -> bool:
    """Wait until a non-blocking ``stream`` can take more; ``False`` for a blocking one
    (a write that took nothing there is a closed output)."""
    try:
        fd = stream.fileno()
        if os.get_blocking(fd):
            return False
    except (OSError, ValueError, AttributeError):
        return False
    select.select([], [fd], [])
    return True


def write_text(out: TextIO, text: str) -> None:
    """Write ``text`` to ``out`` whole (see :func:`write_all`), then flush it. Nothing,
    as ``print()`` writes, where ``out`` is ``None`` (the process started with standard
    output closed, ``>&-``)."""
    if out is None:  # (every --json command died with a traceback there)
        return
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a stream of text alone (io.StringIO)
        out.write(text)
        return
    flush(out)
    errors = out.errors if out.errors not in (None, "strict") else "backslashreplace"
    write_all(buffer, text.encode(out.encoding or "utf-8", errors))  # (never a traceback)


class WholeText(io.TextIOBase):
    """A text stream over ``out`` whose every write goes out whole or raises (see
    :func:`write_text`): ``print()`` into a full non-blocking stdout left only what the
    pipe held (``ls`` printed 64 KiB of its table and exited 0)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The encoding of the stream written to."""
        return self._out.encoding

    def write(self, text: str) -> int:
        """Write ``text`` whole; return its length."""
        write_text(self._out, text)
        return len(text)

    def flush(self) -> None:
        """Flush the stream written to, waiting while it is full."""
        flush(self._out)

    @property
    def buffer(self) -> BinaryIO | None:
        """The binary stream under the stream written to (``export -`` writes there);
        ``None`` where it has none (a ``StringIO``)."""
        return getattr(self._out, "buffer", None)

    def isatty(self) -> bool:
        """Whether the stream written to is a terminal."""
        return self._out.isatty()

    def fileno(self) -> int:
        """The descriptor of the stream written to."""
        return self._out.fileno()

    def writable(self) -> bool:
        """Always: it is an output."""
        return True

    def close(self) -> None:
        """Flush, and leave the stream written to open (it is standard output)."""
        if not self.closed:
            self.flush()
        super().close()


def open_output(path: str) -> Output:
    """Where ``path``'s output goes (:func:`.output_path.find_output`), opened before the
    data is made, as a shell's ``>`` is: a terminal is refused now (:class:`TerminalOutput`),
    not once a bundle of minutes was built. Raises :class:`OSError` too. Give the result to
    :func:`write_output`, or :meth:`~.output_path.Output.close` it."""
    output = find_output(path)
    if output.fd is not None and os.isatty(output.fd):
        output.close()
        raise TerminalOutput
    return output


def write_output(output: Output, data: bytes) -> str:
    """Write ``data`` where :func:`open_output` found, and close it; see
    :func:`replace_file` (what is returned, and how a file is replaced)."""
    try:
        if output.fd is not None:
            with os.fdopen(output.fd, "wb") as handle:
                output.fd = None  # closed with the handle
                write_all(handle, data)
            return ""
        _replace_in(output.folder, output.name, data)
        return output.link_replaced
    finally:
        output.close()


def replace_file(path: str, data: bytes) -> str:
    """Write ``data`` at ``path``; raises :class:`OSError`, or :class:`TerminalOutput`.

    A regular file (or none yet) is replaced whole through a temporary file beside it, so
    no reader sees half of it. A link, a device or a FIFO (``/dev/stdout``, ``/dev/full``)
    is followed or written into, as a shell's ``>`` does, only where nobody but this user
    or root can have put it (see :func:`.output_path.find_output`, which holds each folder
    open as it walks, so nothing can be swapped in between). Returns why a link at
    ``path`` was replaced rather than followed (``""``: there was none, or it was followed).
    A terminal is written nothing: :class:`TerminalOutput`.
    """
    return write_output(open_output(path), data)


def link_replaced(path: str, why: str) -> str:
    """The line that says a link at ``path`` was replaced, not followed (``why``: what
    :func:`replace_file` returned)."""
    return (
        f"runtime-cache: {clean(path)} was a link; replaced by what was written, not "
        f"followed, since another user may have put it there ({clean(why)})"
    )


def _replace_in(folder: int, name: str, data: bytes) -> None:
    """Replace ``name`` in the open ``folder`` with a file of ``data``, whole."""
    _remove_stale_temps(folder, name)
    # O_EXCL|O_NOFOLLOW: a link planted under the temporary name is never followed.
    temp = f"{_temp_stem(name)}{secrets.token_hex(_TEMP_RANDOM)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(temp, flags, 0o666, dir_fd=folder)  # the mode a plain open() gives
    except PermissionError:
        if _write_in_place(folder, name, data):
            return
        raise
    held = _hold(fd)
    try:
        _keep_mode(folder, name, fd)
        with os.fdopen(fd, "wb") as handle:
            write_all(handle, data)
        os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):  # (gone with a failed write: nothing to remove)
            os.unlink(temp, dir_fd=folder)
        raise
    finally:
        if held is not None:
            os.close(held)


def _write_in_place(folder: int, name: str, data: bytes) -> bool:
    """Write ``data`` into this user's regular file ``name`` of a folder this user may
    not write (no temporary file can go beside it), as a shell's ``>`` does: written over,
    then cut to its length, so a reader may see it half written; the room for it is
    taken first (``posix_fallocate``), so a full disk leaves the file as it was. Only a
    file of one name (no hard link to it elsewhere); whether it was written."""
    # Read too: where the file system has no fallocate, the C library's stand-in writes
    # a 0 into each block where it reads a 0 (or past the end); on a descriptor it may not
    # read, it would write over the file's own bytes.
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    readable = True
    try:
        fd = os.open(name, os.O_RDWR | flags, dir_fd=folder)
    except PermissionError:  # (a file of mode 0200: written over, with no room taken first)
        readable = False
        try:
            fd = os.open(name, os.O_WRONLY | flags, dir_fd=folder)
        except OSError:
            return False
    except OSError:
        return False  # none there (nothing to write into), a FIFO without a reader, ...
    with os.fdopen(fd, "r+b" if readable else "wb") as handle:
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_nlink == 1):
            return False
        os.set_blocking(fd, True)
        # The room first: a full disk or a quota fails here, with the file as it was (cut
        # first, a failed write left it short: the re-attack of session 43).
        if data and readable and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, len(data))
            except OSError:
                os.ftruncate(fd, st.st_size)  # (blocks taken past the end: given back)
                raise
        write_all(handle, data)
        handle.flush()
        os.ftruncate(fd, len(data))
    return True


def _keep_mode(folder: int, name: str, fd: int) -> None:
    """Give the file open as ``fd`` the mode of this user's regular file at ``name``, as a
    shell's ``>`` into it keeps it (a 0600 file made 0644, a script's ``x`` dropped: the
    re-attack review of session 41)."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            # Not set-user or set-group-ID: new bytes from a cache never run as another.
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    except OSError:
        pass  # none there (or gone): a new file's mode


def _hold(fd: int) -> int | None:
    """A second descriptor of ``fd``'s file holding its ``flock`` until it is closed (after
    the rename: closing the written file's own descriptor before that would let it go);
    ``None`` where there are no locks."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return None
    try:
        held = os.dup(fd)
    except OSError:
        return None
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(held)
        return None
    return held


#: Random bytes in a temporary file's name, written as hex after :func:`_temp_stem`.
_TEMP_RANDOM = 6


def _temp_stem(name: str) -> str:
    """How the names of ``name``'s temporary files begin (of ``name``, 32 characters at
    most: 128 bytes, well inside any file system's limit)."""
    return f".{name[:32]}."


def _temp_pattern(name: str) -> re.Pattern[str]:
    """The names :func:`_replace_in` gives its temporary files for ``name``."""
    hex_digits = 2 * _TEMP_RANDOM
    return re.compile(rf"{re.escape(_temp_stem(name))}[0-9a-f]{{{hex_digits}}}\.tmp", re.DOTALL)


def _remove_stale_temps(folder: int, name: str) -> None:
    """Remove the temporary files a killed writer of ``name`` left in ``folder``: only
    regular files of this user, named as ours are, and older than :data:`STALE_TEMP_SECONDS`,
    or than :data:`UNHELD_TEMP_SECONDS` with no writer holding them (a younger or held one
    may be another writer's, still at work). Best effort: a folder that cannot be listed,
    or a file that cannot be removed, is left as it is."""
    pattern = _temp_pattern(name)
    now = time.time()
    too_old = now - STALE_TEMP_SECONDS
    try:
        with os.scandir(folder) as entries:
            stale = [entry.name for entry in entries if pattern.fullmatch(entry.name)]
    except OSError:
        return
    for temp in stale:
        with contextlib.suppress(OSError):
            info = os.stat(temp, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                continue
            if info.st_mtime < too_old or (
                info.st_mtime < now - UNHELD_TEMP_SECONDS and _unheld(folder, temp)
            ):
                os.unlink(temp, dir_fd=folder)


def _unheld(folder: int, temp: str) -> bool:
    """Whether no writer holds ``temp``'s lock (its writer died); raises ``OSError``."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return False
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(temp, flags, dir_fd=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live writer holds it
    finally:
        os.close(fd)
    return True
