"""Bounded reads of a file already open: never more than the caller's limit, never a FIFO.

The directory backend opens an entry file (:func:`.dir_fs.open_beneath`, ``O_NONBLOCK``:
a FIFO never blocks an open) and reads it here, by descriptor. A read of unknown size
checks the file with ``fstat`` first: only a regular file no larger than the caller's
bound is read (:func:`regular_size`, :func:`read_regular`); anything else is
:class:`Junk`. :func:`read_parts` reads an entry in the pieces the front asks for, and
:func:`read_range` reads a size it is told, and one byte more to see another size.
"""

from __future__ import annotations

import errno
import os
import stat

from runtime_cache.api import SPAN_HEAD, HeadOnly, Span, blob_tail, frames_blobs

__all__ = [
    "PARTS_FROM",
    "Junk",
    "fstat_or_none",
    "read_parts",
    "read_range",
    "read_regular",
    "read_to_end",
    "regular_size",
]

#: The smallest file :func:`read_parts` reads in pieces: below it, copying the part (in
#: memory malloc keeps at hand) costs less than the extra reads (measured on Linux).
PARTS_FROM = 32 * 1024


class Junk(Exception):
    """Something other than a readable entry file sits at an entry's name."""


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
