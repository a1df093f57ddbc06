"""The framing between a parent and its build or vetting child: length-prefixed msgpack.

Each message is an 8-byte little-endian length and a msgpack body of plain
types. A message over 2 GiB, or a stream that ends inside one, reads as end of
input (``EOFError``), so a child that dies mid-answer never hangs its parent.
"""

from __future__ import annotations

import struct
from typing import IO, Any

import msgpack

__all__ = ["read_message", "write_message"]

_LEN = struct.Struct("<Q")
_MAX_MESSAGE = 1 << 31


def write_message(stream: IO[bytes], value: Any) -> None:
    """Write one framed msgpack message and flush."""
    body = msgpack.packb(value, use_bin_type=True)
    stream.write(_LEN.pack(len(body)) + body)
    stream.flush()


def _read_exact(stream: IO[bytes], size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_message(stream: IO[bytes]) -> Any:
    """Read one framed message; raise ``EOFError`` at end of stream."""
    head = _read_exact(stream, _LEN.size)
    if head is None:
        raise EOFError
    (size,) = _LEN.unpack(head)
    if size > _MAX_MESSAGE:
        raise EOFError
    body = _read_exact(stream, size)
    if body is None:
        raise EOFError
    return msgpack.unpackb(body, raw=False, strict_map_key=True)
