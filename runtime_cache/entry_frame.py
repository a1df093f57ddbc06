"""An entry's frame: the fixed header before its metadata and value, the signature after.

The layout is :mod:`runtime_cache.codec`'s; this module packs the frame
around metadata already packed, parses the header and says where the value
lies, for the codec and for the front's quick check
(:mod:`runtime_cache.own_entries`).
"""

from __future__ import annotations

import struct
from functools import partial

import xxhash

from .api import framing_span
from .entry_meta import Limits
from .errors import CorruptEntryError, NewerFormatError, OverLimitError
from .signing import SIG_SIZE, SecretKeys, sign, signing_keys

__all__ = [
    "ENTRY_HEADER",
    "ENTRY_MAGIC",
    "ENTRY_VERSION",
    "FLAG_SIGNED",
    "HEADER_SIZE",
    "entry_span",
    "entry_tail",
    "frame_entry",
    "header_fits",
    "parse_header",
]

ENTRY_MAGIC = b"RCE\x01"
ENTRY_VERSION = 1
FLAG_SIGNED = 1
#: The entry header: magic, version, flags, reserved, metadata and value lengths, and the
#: xxh3-64 of the metadata and of the value.
ENTRY_HEADER = struct.Struct("<4sBBHIQQQ")
HEADER_SIZE = ENTRY_HEADER.size
_LENGTHS = struct.Struct("<4s4xIQ")  # the magic, and the metadata and value lengths


def frame_entry(meta: bytes, value: bytes, secret: bytes | SecretKeys | None = None) -> bytes:
    """The entry blob of packed metadata ``meta`` and ``value``; signed with the first
    key of ``secret`` when one is given."""
    signing = signing_keys(secret)
    header = ENTRY_HEADER.pack(
        ENTRY_MAGIC,
        ENTRY_VERSION,
        FLAG_SIGNED if signing else 0,
        0,
        len(meta),
        len(value),
        xxhash.xxh3_64_intdigest(meta),
        xxhash.xxh3_64_intdigest(value),
    )
    if signing:  # signed over the pieces: the value is copied once, into the blob
        return b"".join((header, meta, value, sign(signing[0], header, meta, value)))
    return b"".join((header, meta, value))


def header_fits(
    magic: bytes,
    version: int,
    flags: int,
    reserved: int,
    meta_len: int,
    value_len: int,
    limits: Limits,
) -> bool:
    """Whether a header's fixed fields are this format's and its lengths within ``limits``."""
    return (
        magic == ENTRY_MAGIC
        and version == ENTRY_VERSION
        and flags <= FLAG_SIGNED
        and not reserved
        and meta_len <= limits.max_meta_size
        and value_len <= limits.max_value_size
    )


def parse_header(
    blob: bytes | memoryview, limits: Limits, size: int | None = None
) -> tuple[int, int, int, int, int]:
    """``(flags, meta_len, value_len, meta_sum, value_sum)`` of an entry's header.

    Raises :class:`~runtime_cache.errors.CorruptEntryError` (or
    :class:`~runtime_cache.errors.NewerFormatError`) saying what is wrong. With
    ``size``, the whole entry's, lengths over ``limits`` that do not add up to it
    are corrupt, not an entry for a reader with larger limits (kept, and read again).
    """
    if len(blob) < HEADER_SIZE:
        raise CorruptEntryError(f"entry is {len(blob)} bytes, shorter than its header")
    magic, version, flags, reserved, meta_len, value_len, meta_sum, value_sum = (
        ENTRY_HEADER.unpack_from(blob)
    )
    if header_fits(magic, version, flags, reserved, meta_len, value_len, limits):
        return flags, meta_len, value_len, meta_sum, value_sum
    # Something is wrong: say what, in order.
    if magic != ENTRY_MAGIC:
        raise CorruptEntryError("not a runtime-cache entry (bad magic)")
    if version > ENTRY_VERSION:
        raise NewerFormatError(f"entry format version {version} is newer than this reader's")
    if version != ENTRY_VERSION:
        raise CorruptEntryError(f"unsupported entry format version {version}")
    if flags & ~FLAG_SIGNED or reserved:
        raise CorruptEntryError(f"unknown entry flags {flags:#x}/{reserved:#x}")
    declared = HEADER_SIZE + meta_len + value_len + (SIG_SIZE if flags & FLAG_SIGNED else 0)
    if size is not None and size != declared:
        raise CorruptEntryError(f"entry is {size} bytes, its header says {declared}")
    if meta_len > limits.max_meta_size:
        raise OverLimitError(f"metadata of {meta_len} bytes exceeds {limits.max_meta_size}")
    if value_len > limits.max_value_size:
        raise OverLimitError(f"value of {value_len} bytes exceeds {limits.max_value_size}")
    return flags, meta_len, value_len, meta_sum, value_sum


def entry_tail(head: bytes) -> int | None:
    """How many bytes follow the value in an entry of this format version whose blob begins
    with ``head``: its signature's, or none; ``None`` for another version or no header."""
    if len(head) < HEADER_SIZE or head[4] != ENTRY_VERSION:
        return None
    return SIG_SIZE if head[5] & FLAG_SIGNED else 0


# Framing: what follows an entry's value (its signature, 32 bytes) stays within SPAN_HEAD
# bytes in any later format version too, or dir:// readers of this one take it for junk.
@partial(framing_span, tail=entry_tail)
def entry_span(head: bytes) -> tuple[int, int] | None:
    """Where the value lies in an entry whose blob begins with ``head``: ``(start, end)``.

    ``None`` when ``head`` is not the start of an entry. Unchecked: the span
    :meth:`~runtime_cache.api.Backend.get_parts` cuts at, so the value is read
    as a ``bytes`` of its own; ``codec.decode_view`` checks the pieces.
    """
    if len(head) < HEADER_SIZE:
        return None
    magic, meta_len, value_len = _LENGTHS.unpack_from(head)
    return (
        None
        if magic != ENTRY_MAGIC
        else (HEADER_SIZE + meta_len, HEADER_SIZE + meta_len + value_len)
    )
