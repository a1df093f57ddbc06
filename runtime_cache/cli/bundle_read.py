"""Reading a bundle file for ``runtime-cache import``: a regular file (or standard input),
bounded in size and read as its own framing says, so a FIFO or a device is a clear error,
not a hang, and an endless stream costs no more than its header and entry lengths announce.
The bundle is held in memory once, whole (standard input kept in a temporary file first).
"""

from __future__ import annotations

import os
import select
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator

from ..codec import BUNDLE_HEADER_SIZE, BUNDLE_MAGIC, FLAG_SIGNED, Limits
from ..signing import SIG_SIZE
from .fmt import human_size

__all__ = ["BundleFileError", "max_bundle_size", "read_bundle_file"]


class BundleFileError(Exception):
    """A bundle file that cannot be written or read; the message names the user's file."""


def max_bundle_size(limits: Limits) -> int:
    """The largest bundle ``import`` reads: four times the largest entry value."""
    return 4 * limits.max_value_size


def _pieces(read: Callable[[int], bytes], size: int) -> Iterator[bytes]:
    """Up to ``size`` bytes, in pieces of at most 1 MiB: fewer only at the end of the input."""
    while size > 0:
        piece = read(min(size, 1 << 20))
        if not piece:
            return
        size -= len(piece)
        yield piece


def _exact(read: Callable[[int], bytes], size: int) -> bytes:
    """Up to ``size`` bytes (a few: a header, a length): fewer only at the end of the input."""
    return b"".join(_pieces(read, size))


def _framed(
    read: Callable[[int], bytes],
    path: str,
    limits: Limits,
    known_size: int | None = None,
    signed_only: bool = False,
) -> Iterator[bytes]:
    """One bundle as its own framing says, and one byte more (trailing data), in pieces
    of at most 1 MiB, none kept here.

    Nothing past what the header and the entry lengths announce is read (an endless
    stream costs no more than they announce), and a count over ``limits.max_entries`` or a
    total over :func:`max_bundle_size` is refused. What is announced within those limits
    is read, holes of a sparse file too. ``known_size``, a file's size, tells a length past
    it (a damaged header) from a bundle too large. With ``signed_only`` (a secret is set),
    a bundle whose header says it is unsigned is refused at its header: its checksum and
    entries could not make it any better.
    """
    limit = max_bundle_size(limits)
    head = _exact(read, BUNDLE_HEADER_SIZE)
    if head[: len(BUNDLE_MAGIC)] != BUNDLE_MAGIC:
        raise BundleFileError(f"{path} is not a valid bundle: bad magic")
    yield head
    if len(head) < BUNDLE_HEADER_SIZE:
        return
    flags, count = head[5], int.from_bytes(head[8:12], "little")
    if signed_only and not flags & FLAG_SIGNED:
        raise BundleFileError(
            f"{path} is not a valid bundle: bundle is not signed, and a secret is set"
        )
    if count > limits.max_entries:
        raise BundleFileError(
            f"{path} is not a valid bundle: it claims {count} entries, over the limit "
            f"{limits.max_entries}"
        )
    size = len(head)
    for _ in range(count):
        length = _exact(read, 8)
        if len(length) < 8:
            yield length  # (cut in a length: the decoder names the file's whole size)
            break
        want = int.from_bytes(length, "little")
        size += 8 + want
        if size > limit:
            break  # (refused below)
        yield length
        got = 0
        for piece in _pieces(read, want):
            got += len(piece)
            yield piece
        if got < want:
            break
    if size > limit and known_size is not None:
        raise BundleFileError(
            f"{path} is not a valid bundle: its entries claim {size} bytes, and the file "
            f"holds {known_size}"
        )
    if size > limit:
        raise BundleFileError(
            f"{path} claims more than {human_size(limit)} (not a valid bundle, or too large);"
            " refusing it"
        )
    yield from _pieces(read, 8 + (SIG_SIZE if flags & FLAG_SIGNED else 0) + 1)


def read_bundle_file(path: str, limits: Limits, signed_only: bool) -> bytes:
    """The bundle at ``path`` (``-``: standard input), read as :func:`_framed` says; raises
    :class:`BundleFileError`.

    It is held once, whole, as its checks need it: a file is walked first, keeping
    nothing, then read in one piece of the size its framing gave; standard input is first
    kept in a private temporary file (``tempfile.TemporaryFile``: ``O_TMPFILE``, or an
    unlinked one, in the system's temporary folder, ``TMPDIR``: on a tmpfs its pages are
    memory too), then read from there the same way.
    Before, the pieces read were kept, then joined: twice the bundle's size in memory,
    before its checksum or signature was checked (a stream of a 1 GB entry, 1.98 GB).
    """
    limit = max_bundle_size(limits)
    if path == "-":
        if sys.stdin is None:  # (started with it closed: <&-)
            raise BundleFileError("cannot read standard input: it is closed")
        stream = sys.stdin.buffer
        try:
            fd: int | None = stream.fileno()
        except (OSError, ValueError):  # (not a file: io.UnsupportedOperation)
            fd = None
        return _spooled(_reading(stream.read, "standard input", fd), limits, signed_only)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BundleFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, FIFO or device (before fdopen refuses it)
        os.close(fd)
        raise BundleFileError(f"cannot read {path}: not a regular file")
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise BundleFileError(f"{path} is larger than {human_size(limit)}; refusing it")
        try:
            framed = _framed(handle.read, path, limits, info.st_size, signed_only)
            size = sum(map(len, framed))
            handle.seek(0)
            return handle.read(size)
        except OSError as exc:
            raise BundleFileError(f"cannot read {path}: {exc.strerror or exc}") from None


def _spooled(read: Callable[[int], bytes], limits: Limits, signed_only: bool) -> bytes:
    """The bundle of standard input (``read``), kept in a temporary file as
    :func:`_framed` reads it, then read from there in one piece. Where no temporary file
    can be made (a container whose file systems are all read-only), its pieces are kept
    in memory instead, then joined: twice its size for a moment, as before."""
    path = "standard input"
    framed = _framed(read, path, limits, None, signed_only)
    try:
        where = tempfile.gettempdir()
        spool = tempfile.TemporaryFile(prefix="runtime-cache-import-")  # noqa: SIM115
    except OSError:  # (FileNotFoundError: no temporary folder this user may write)
        return b"".join(framed)
    size = 0
    try:
        with spool:
            for piece in framed:
                spool.write(piece)
                size += len(piece)
            spool.seek(0)
            return spool.read(size)
    except OSError as exc:  # (the temporary file's: a full disk)
        raise BundleFileError(f"cannot keep {path} in {where}: {exc.strerror or exc}") from None


def _reading(
    read: Callable[[int], bytes | None], path: str, fd: int | None = None
) -> Callable[[int], bytes]:
    """``read``, its failure a :class:`BundleFileError` that names ``path``. A stream left
    non-blocking (by a parent) that has nothing yet answers ``None``, which is no end of
    it: waited on (``fd``), and read again."""

    def reading(size: int) -> bytes:
        while True:
            try:
                piece = read(size)
            except BlockingIOError:
                piece = None
            except OSError as exc:
                raise BundleFileError(f"cannot read {path}: {exc.strerror or exc}") from None
            if piece is not None or fd is None:
                return piece or b""
            select.select([fd], [], [])

    return reading
