"""Entries as a hostile or broken writer makes them: valid framing, hostile metadata.

The codec refuses to encode such entries, so this helper frames them itself
with the documented entry layout (header, msgpack metadata, value, optional
32-byte HMAC), checksums included, so that only the metadata is wrong.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import xxhash

import runtime_cache as rc
from runtime_cache.codec import ENTRY_MAGIC

#: magic, version, flags, reserved, meta length, value length, meta xxh3, value xxh3
HEADER = struct.Struct("<4sBBHIQQQ")
FLAG_SIGNED = 1


def forge(
    key: rc.CacheKey,
    value: bytes = b"payload",
    *,
    created_at: float = 1.7e9,
    build_seconds: float = 0.5,
    producer: str = "forged",
    signature: bytes | None = None,
) -> bytes:
    """An entry blob for ``key`` with the given metadata and, optionally, a raw signature."""
    meta: dict[str, Any] = {
        "k": str(key),
        "p": dict(key.parts),
        "c": float(created_at),
        "b": float(build_seconds),
        "v": producer,
        "n": len(value),
    }
    packed = msgpack.packb(meta, use_bin_type=True)
    flags = FLAG_SIGNED if signature is not None else 0
    header = HEADER.pack(
        ENTRY_MAGIC,
        1,
        flags,
        0,
        len(packed),
        len(value),
        xxhash.xxh3_64_intdigest(packed),
        xxhash.xxh3_64_intdigest(value),
    )
    return header + packed + value + (signature or b"")
