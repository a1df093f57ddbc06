"""Reading a bundle file for ``runtime-cache import``: a regular file (or standard input),
bounded in size and read as its own framing says, so a FIFO or a device is a clear error,
not a hang, and an endless stream costs no more than its header and entry lengths announce.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable

from ..codec import BUNDLE_HEADER_SIZE, BUNDLE_MAGIC, FLAG_SIGNED, Limits
from ..signing import SIG_SIZE
from .fmt import human_size

__all__ = ["BundleFileError", "max_bundle_size", "read_bundle_file"]


class BundleFileError(Exception):
    """A bundle file that cannot be written or read; the message names the user's file."""


def max_bundle_size(limits: Limits) -> int:
    """The largest bundle ``import`` reads: four times the largest entry value."""
    return 4 * limits.max_value_size


def _exact(read: Callable[[int], bytes], size: int) -> bytes:
    """Up to ``size`` bytes: fewer only at the end of the input."""
    chunks, got = [], 0
    while got < size:
        chunk = read(min(size - got, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_limited(
    read: Callable[[int], bytes],
    path: str,
    limits: Limits,
    known_size: int | None = None,
    signed_only: bool = False,
) -> bytes:
    """Read one bundle as its own framing says, and one byte more (trailing data).

    Nothing past what the header and the entry lengths announce is read (an endless
    stream costs no more than they announce), a count over ``limits.max_entries`` or a
    total over :func:`max_bundle_size` is refused, and short pieces are kept together
    (2**32 empty entries took 30x the file's size). What is announced within those limits
    is read, holes of a sparse file too: up to about twice the bundle's size in memory
    while it is read, and about three times while its entries are written. ``known_size``,
    a file's size, tells a length past it (a damaged header) from a bundle too large. With
    ``signed_only`` (a secret is set), a bundle whose header says it is unsigned is
    refused at its header: its checksum and entries could not make it any better.
    """
    limit = max_bundle_size(limits)
    head = _exact(read, BUNDLE_HEADER_SIZE)
    if head[: len(BUNDLE_MAGIC)] != BUNDLE_MAGIC:
        raise BundleFileError(f"{path} is not a valid bundle: bad magic")
    if len(head) < BUNDLE_HEADER_SIZE:
        return head
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
    chunks, small, size = [head], bytearray(), len(head)
    for _ in range(count):
        length = _exact(read, 8)
        small += length
        want = int.from_bytes(length, "little")
        size += 8 + want
        if len(length) < 8 or size > limit:
            break  # (the decoder names a short file; a long one is refused below)
        blob = _exact(read, want)
        if len(blob) < 1 << 16:
            small += blob
        else:
            chunks += [bytes(small), blob]
            small.clear()
        if len(blob) < want:
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
    small += _exact(read, 8 + (SIG_SIZE if flags & FLAG_SIGNED else 0) + 1)
    return b"".join([*chunks, small])


def read_bundle_file(path: str, limits: Limits, signed_only: bool) -> bytes:
    """The bundle at ``path`` (``-``: standard input), read as :func:`_read_limited` says;
    raises :class:`BundleFileError`."""
    limit = max_bundle_size(limits)
    if path == "-":
        return _read_limited(sys.stdin.buffer.read, "standard input", limits, None, signed_only)
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
            return _read_limited(handle.read, path, limits, info.st_size, signed_only)
        except OSError as exc:
            raise BundleFileError(f"cannot read {path}: {exc.strerror or exc}") from None
