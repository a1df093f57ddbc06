"""Where the command line's output goes: all of it or an error, and files replaced whole."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from typing import BinaryIO, TextIO

__all__ = ["replace_file", "write_all", "write_text"]


def write_all(stream: BinaryIO, data: bytes | memoryview) -> None:
    """Write every byte of ``data`` to ``stream``, or raise.

    A buffered write of more than the pipe holds, into a pipe whose reader closes, returns
    a short count instead of raising: `export - | head -c 10` said "exported 3000 entries"
    and exited 0. The next write raises :class:`BrokenPipeError` (exit code 141)."""
    view = memoryview(data).cast("B")
    while view:
        written = stream.write(view)
        if not written:  # (None: a non-blocking stream that took nothing)
            raise BrokenPipeError(errno.EPIPE, "the output took no more")
        view = view[written:]


def write_text(out: TextIO, text: str) -> None:
    """Write ``text`` to ``out`` whole (see :func:`write_all`), then flush it."""
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a stream of text alone (io.StringIO)
        out.write(text)
        return
    out.flush()
    write_all(buffer, text.encode(out.encoding or "utf-8", out.errors or "strict"))
    buffer.flush()


def replace_file(path: str, data: bytes) -> None:
    """Write ``data`` at ``path``; raises :class:`OSError`.

    A regular file (or none yet) is replaced whole through a temporary file beside it, so
    no reader sees half of it. A device, a FIFO or a socket is written into, as a shell's
    ``>`` does: it was replaced by a regular file (`export /dev/full` made ``/dev/full``
    one, and said it had exported). A link of this user's or root's (``/dev/stdout``) is
    followed, and stays a link. Anyone else's link, FIFO or socket (planted in a shared
    folder: a link to a file of this user's) is never followed or written into: it is
    replaced, as a file would be.
    """
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        info = None
    trusted = (os.geteuid(), 0) if hasattr(os, "geteuid") else ()
    follow = info is not None and stat.S_ISLNK(info.st_mode) and info.st_uid in trusted
    if follow:
        path = os.path.realpath(path)
        try:
            info = os.stat(path)
        except FileNotFoundError:
            info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
    special = info is not None and not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode))
    if special and info is not None and info.st_uid in trusted:  # (anyone else's: replaced)
        with open(path, "wb") as handle:
            write_all(handle, data)
        return
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
