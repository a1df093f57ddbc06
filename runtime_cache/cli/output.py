"""Where the command line's output goes: all of it or an error, and files replaced whole."""

from __future__ import annotations

import errno
import io
import os
import select
import stat
import tempfile
from typing import BinaryIO, TextIO

__all__ = ["WholeText", "flush", "replace_file", "write_all", "write_text"]


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
    """Write ``text`` to ``out`` whole (see :func:`write_all`), then flush it."""
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a stream of text alone (io.StringIO)
        out.write(text)
        return
    flush(out)
    write_all(buffer, text.encode(out.encoding or "utf-8", out.errors or "strict"))


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


def _safe_place(path: str, owner: int, trusted: tuple[int, ...]) -> bool:
    """Whether nobody but this user or root can swap the entry at ``path`` (its owner
    ``owner``): its folder is theirs, and others cannot write it, or it is sticky."""
    try:
        folder = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    locked = not folder.st_mode & 0o022 or bool(folder.st_mode & stat.S_ISVTX)
    return folder.st_uid in trusted and owner in trusted and locked


def replace_file(path: str, data: bytes) -> None:
    """Write ``data`` at ``path``; raises :class:`OSError`.

    A regular file (or none yet) is replaced whole through a temporary file beside it, so
    no reader sees half of it. A device, a FIFO or a link (``/dev/full``, ``/dev/stdout``,
    a FIFO in ``/tmp``) is written into or followed, as a shell's ``>`` does, where only
    this user or root can have put it there: the entry and its folder are theirs, and
    others cannot write the folder or it is sticky (`export /dev/full` made ``/dev/full`` a
    regular file, and said it had exported). Anywhere else such a name is replaced, as a
    file would be, never followed (a link planted in a shared folder, to a file of this
    user's, was written through by a first version of this fix).
    """
    trusted = (os.geteuid(), 0) if hasattr(os, "geteuid") else ()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
    special = info is not None and not stat.S_ISREG(info.st_mode)
    if special and info is not None and _safe_place(path, info.st_uid, trusted):
        try:
            target = os.stat(path)
        except FileNotFoundError:
            target = None
        if target is not None and stat.S_ISDIR(target.st_mode):
            raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
        if target is not None and not stat.S_ISREG(target.st_mode):
            with open(path, "wb") as handle:  # a device or FIFO (a link to one: followed)
                write_all(handle, data)
            return
        path = os.path.realpath(path)  # a link to a regular file: that file is replaced
    folder = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    # mkstemp opens O_CREAT|O_EXCL|O_NOFOLLOW: a link planted under any name is never followed.
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            mask = os.umask(0)
            os.umask(mask)
            os.fchmod(handle.fileno(), 0o666 & ~mask)  # as a plain open() would have made it
            write_all(handle, data)
        os.replace(temp, path)  # never a half-written file under the real name
    finally:
        try:
            os.unlink(temp)
        except OSError:
            pass  # renamed into place: nothing left to remove
