"""The entry and bundle formats: magic, version, checksums, optional signature, limits.

Entry layout (all integers little-endian)::

    offset size  field
    0      4     magic b"RCE\\x01"
    4      1     format version (1)
    5      1     flags (bit 0: signed)
    6      2     reserved, zero
    8      4     metadata length M
    12     8     value length V
    20     8     xxh3-64 of the metadata
    28     8     xxh3-64 of the value
    36     M     metadata (a msgpack map)
    36+M   V     value
    ...    32    HMAC-SHA256 over everything before it (only when signed)

The metadata sits before the value so that listings read only the head of a
blob. Nothing here uses pickle: metadata is msgpack of plain types only. The
frame (header and signature) is :mod:`runtime_cache.entry_frame`'s, the
metadata :mod:`runtime_cache.entry_meta`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from .entry_frame import (
    ENTRY_HEADER,
    ENTRY_MAGIC,
    ENTRY_VERSION,
    FLAG_SIGNED,
    HEADER_SIZE,
    entry_span,
    frame_entry,
    parse_header,
)
from .entry_meta import (
    DEFAULT_LIMITS,
    Entry,
    Limits,
    meta_head,
    pack_meta,
    time_problem,
    unpack_meta,
)
from .errors import (
    CorruptEntryError,
    InvalidBundleError,
    InvalidValueError,
    SignatureError,
)
from .packing import packb
from .signing import SIG_SIZE, Secret, SecretKeys, normalize_secret, sign, signed_by, signing_keys

__all__ = [
    "BUNDLE_HEADER_SIZE",
    "BUNDLE_MAGIC",
    "DEFAULT_LIMITS",
    "ENTRY_HEADER",
    "ENTRY_MAGIC",
    "ENTRY_VERSION",
    "FLAG_SIGNED",
    "HEADER_SIZE",
    "UNSIGNED_ENTRY",
    "Entry",
    "Limits",
    "Secret",
    "SecretKeys",
    "bundle_count",
    "bundle_signed",
    "decode_bundle",
    "decode_entry",
    "decode_meta",
    "decode_view",
    "encode_bundle",
    "encode_entry",
    "encode_packed",
    "entry_span",
    "frame_entry",
    "meta_head",
    "normalize_secret",
    "verify_entry",
]

BUNDLE_MAGIC = b"RCB\x01"
#: Why an entry without a signature is refused where a secret is set.
UNSIGNED_ENTRY = "entry is not signed, and a secret is set"
BUNDLE_VERSION = 1
_BUNDLE_HEADER = struct.Struct("<4sBBHI")  # magic, version, flags, reserved, count
BUNDLE_HEADER_SIZE = _BUNDLE_HEADER.size
_LEN = struct.Struct("<Q")
_CHECK = struct.Struct("<Q")


def encode_entry(
    key: str,
    parts: Mapping[str, Any],
    value: bytes,
    *,
    created_at: float,
    build_seconds: float = 0.0,
    producer: str = "",
    secret: bytes | SecretKeys | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode one entry; sign it when ``secret`` is given (with its first key).

    Raises :class:`InvalidValueError` for a non-finite or out-of-range time.
    """
    packed_parts = packb(dict(parts))
    return encode_packed(
        key,
        packed_parts,
        value,
        created_at=created_at,
        build_seconds=build_seconds,
        producer=producer,
        secret=secret,
        extra=extra,
    )


def encode_packed(
    key: str,
    packed_parts: bytes,
    value: bytes,
    *,
    created_at: float,
    build_seconds: float = 0.0,
    producer: str = "",
    secret: bytes | SecretKeys | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """:func:`encode_entry` with the key's parts already packed (``CacheKey.packed_parts``)."""
    created_at, build_seconds = float(created_at), float(build_seconds)
    problem = time_problem(created_at, build_seconds)
    if problem is not None:
        raise InvalidValueError(problem)
    meta_bytes = pack_meta(
        key,
        packed_parts,
        created_at,
        build_seconds,
        producer,
        len(value),
        dict(extra) if extra else None,
    )
    return frame_entry(meta_bytes, value, secret)


def decode_meta(head: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[dict[str, Any], int, bool]:
    """Decode the metadata from the head of an entry blob, without the value.

    Returns ``(meta, needed, signed)``; when ``head`` is too short, ``meta`` is
    empty and ``needed`` says how many bytes to read instead.
    """
    flags, meta_len, value_len, meta_sum, _ = parse_header(head, limits)
    needed = HEADER_SIZE + meta_len
    if len(head) < needed:
        return {}, needed, bool(flags & FLAG_SIGNED)
    raw = memoryview(head)[HEADER_SIZE:needed]
    if xxhash.xxh3_64_intdigest(raw) != meta_sum:
        raise CorruptEntryError("metadata checksum mismatch")
    meta = unpack_meta(raw, limits)
    if meta["n"] != value_len:
        raise CorruptEntryError("metadata size disagrees with header")
    return meta, needed, bool(flags & FLAG_SIGNED)


def decode_view(
    blob: bytes | memoryview | tuple[bytes, ...],
    *,
    secret: bytes | SecretKeys | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> tuple[dict[str, Any], memoryview, bool]:
    """Verify one entry and return ``(metadata, value, signed)`` without copying the value.

    ``blob`` is the entry, or the pieces that join to it, as
    :meth:`~runtime_cache.api.Backend.get_parts` returns them. ``value`` is a
    read-only view into ``blob`` (into the middle piece). The checks and errors
    are those of :func:`decode_entry`.
    """
    meta, value, signed, _ = verify_entry(blob, secret=secret, limits=limits)
    return meta, value, signed


def verify_entry(
    blob: bytes | memoryview | tuple[bytes, ...],
    *,
    secret: bytes | SecretKeys | None = None,
    limits: Limits = DEFAULT_LIMITS,
    head: bytes | None = None,
) -> tuple[dict[str, Any], memoryview, bool, bool]:
    """:func:`decode_view`, and whether the metadata begins with ``head`` (see :func:`meta_head`).

    When it does, the entry's key and parts are byte for byte those ``head``
    was made from, so a caller who knows that key needs no other binding check.
    """
    if isinstance(blob, tuple) and len(blob) == 1:
        blob = blob[0]
    elif isinstance(blob, tuple):
        cut = _pieces(blob, limits)
        if isinstance(cut, tuple):
            start, value, tail, header = cut
            return _verify(start, value, tail, header, secret, limits, head)
        blob = cut
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise CorruptEntryError(f"entry must be bytes, not {type(blob).__name__}")
    view = memoryview(blob)
    if not view.readonly:
        view = view.toreadonly()
    header = parse_header(view, limits, len(view))
    meta_len, value_len = header[1], header[2]
    body_end = HEADER_SIZE + meta_len + value_len
    expected = body_end + (SIG_SIZE if header[0] & FLAG_SIGNED else 0)
    if len(view) != expected:
        raise CorruptEntryError(f"entry is {len(view)} bytes, expected {expected}")
    cut_at = HEADER_SIZE + meta_len
    return _verify(
        view[:cut_at], view[cut_at:body_end], view[body_end:], header, secret, limits, head
    )


_Header = tuple[int, int, int, int, int]


def _pieces(
    pieces: tuple[bytes, ...], limits: Limits
) -> bytes | tuple[memoryview, memoryview, memoryview, _Header]:
    # (head, value, tail) cut where the header says, with it; else the joined blob.
    if len(pieces) == 3 and all(type(p) is bytes for p in pieces) and len(pieces[0]) >= HEADER_SIZE:
        head, value, tail = pieces
        header = parse_header(head, limits, sum(map(len, pieces)))  # the joined blob's
        flags, meta_len, value_len = header[:3]
        signature = SIG_SIZE if flags & FLAG_SIGNED else 0
        if (len(head), len(value), len(tail)) == (HEADER_SIZE + meta_len, value_len, signature):
            return memoryview(head), memoryview(value), memoryview(tail), header
    if not all(isinstance(p, (bytes, bytearray, memoryview)) for p in pieces):
        raise CorruptEntryError("entry pieces must be bytes")
    return b"".join(pieces)


def _verify(
    head: memoryview,
    value: memoryview,
    tail: memoryview,
    header: _Header,
    secret: bytes | SecretKeys | None,
    limits: Limits,
    expected_head: bytes | None,
) -> tuple[dict[str, Any], memoryview, bool, bool]:
    # The checks on an entry cut into header and metadata, value, and signature.
    flags, _, value_len, meta_sum, value_sum = header
    signed = bool(flags & FLAG_SIGNED)
    meta_raw = head[HEADER_SIZE:]
    # Checksums first: damage is corrupt (removed); a forgery that fixed them is rejected.
    if xxhash.xxh3_64_intdigest(meta_raw) != meta_sum:
        raise CorruptEntryError("metadata checksum mismatch")
    if xxhash.xxh3_64_intdigest(value) != value_sum:
        raise CorruptEntryError("value checksum mismatch")
    if secret is not None:
        if not signed:
            raise SignatureError(UNSIGNED_ENTRY)
        if not signed_by(secret, head, bytes(tail), (value,)):
            raise SignatureError("entry signature does not match the secret")
    meta = unpack_meta(meta_raw, limits)
    if meta["n"] != value_len:
        raise CorruptEntryError("metadata size disagrees with header")
    known = expected_head is not None and meta_raw[1 : 1 + len(expected_head)] == expected_head
    return meta, value, signed, known


def decode_entry(
    blob: bytes,
    *,
    secret: bytes | SecretKeys | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Entry:
    """Decode and verify one entry.

    Raises :class:`CorruptEntryError` for any malformed blob, and
    :class:`SignatureError` when ``secret`` is set and the signature is missing
    or wrong.
    """
    meta, value, signed = decode_view(blob, secret=secret, limits=limits)
    return Entry(
        key=meta["k"],
        parts=meta["p"],
        value=bytes(value),
        created_at=meta["c"],
        build_seconds=meta["b"],
        producer=meta["v"],
        signed=signed,
        extra=meta.get("x", {}),
    )


def encode_bundle(blobs: Iterable[bytes], *, secret: bytes | SecretKeys | None = None) -> bytes:
    """Pack encoded entries into one bundle blob, with a checksum (and HMAC with a secret)."""
    items = list(blobs)
    signing = signing_keys(secret)
    flags = FLAG_SIGNED if signing else 0
    chunks = [_BUNDLE_HEADER.pack(BUNDLE_MAGIC, BUNDLE_VERSION, flags, 0, len(items))]
    for blob in items:
        chunks.append(_LEN.pack(len(blob)))
        chunks.append(blob)
    body = b"".join(chunks)
    tail = _CHECK.pack(xxhash.xxh3_64_intdigest(body))
    if signing:
        tail += sign(signing[0], body)
    return body + tail


def bundle_count(data: bytes | memoryview) -> int:
    """How many entries a bundle's header says it holds (unchecked; 0 if it has no header)."""
    if len(data) < _BUNDLE_HEADER.size or bytes(data[:4]) != BUNDLE_MAGIC:
        return 0
    return int(_BUNDLE_HEADER.unpack_from(data)[4])


def bundle_signed(data: bytes | memoryview) -> bool:
    """Whether a bundle's header says it is signed (unchecked; ``False`` without a header)."""
    if len(data) < _BUNDLE_HEADER.size or bytes(data[:4]) != BUNDLE_MAGIC:
        return False
    return bool(_BUNDLE_HEADER.unpack_from(data)[2] & FLAG_SIGNED)


def decode_bundle(
    data: bytes,
    *,
    secret: bytes | SecretKeys | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> list[bytes]:
    """Split a bundle into its entry blobs, verifying the bundle's checksum.

    The entries themselves are not decoded here; the caller decodes each one
    and may reject some while accepting the rest. Raises
    :class:`InvalidBundleError` for a malformed bundle, and when ``secret`` is set
    and the bundle's HMAC is missing or wrong.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidBundleError(f"bundle must be bytes, not {type(data).__name__}")
    view = memoryview(data)
    if len(view) < _BUNDLE_HEADER.size + _CHECK.size:
        raise InvalidBundleError(  # (its header, and the checksum that ends every one)
            f"bundle is {len(view)} bytes, shorter than its header and checksum "
            f"({_BUNDLE_HEADER.size + _CHECK.size}): truncated"
        )
    magic, version, flags, reserved, count = _BUNDLE_HEADER.unpack_from(view)
    if magic != BUNDLE_MAGIC:
        raise InvalidBundleError("not a runtime-cache bundle (bad magic)")
    if version != BUNDLE_VERSION:
        raise InvalidBundleError(f"unsupported bundle format version {version}")
    if flags & ~FLAG_SIGNED or reserved:
        raise InvalidBundleError(f"unknown bundle flags {flags:#x}/{reserved:#x}")
    if count > limits.max_entries:
        raise InvalidBundleError(
            f"bundle claims {count} entries, over the limit {limits.max_entries}"
        )
    signed = bool(flags & FLAG_SIGNED)
    body_end = len(view) - _CHECK.size - (SIG_SIZE if signed else 0)
    if body_end < _BUNDLE_HEADER.size:
        raise InvalidBundleError("bundle is truncated")
    (checksum,) = _CHECK.unpack_from(view, body_end)
    if xxhash.xxh3_64_intdigest(view[:body_end]) != checksum:
        raise InvalidBundleError("bundle checksum mismatch (truncated or altered)")
    if secret is not None:
        if not signed:
            raise InvalidBundleError("bundle is not signed, and a secret is set")
        mac = bytes(view[body_end + _CHECK.size :])
        if not signed_by(secret, view[:body_end], mac):
            raise InvalidBundleError("bundle signature does not match the secret")
    blobs: list[bytes] = []
    pos = _BUNDLE_HEADER.size
    max_blob = HEADER_SIZE + limits.max_meta_size + limits.max_value_size + SIG_SIZE
    for index in range(count):
        if pos + _LEN.size > body_end:
            raise InvalidBundleError(f"bundle ends inside entry {index}")
        (size,) = _LEN.unpack_from(view, pos)
        pos += _LEN.size
        if size > max_blob or pos + size > body_end:
            raise InvalidBundleError(f"entry {index} has an impossible length {size}")
        blobs.append(bytes(view[pos : pos + size]))
        pos += size
    if pos != body_end:
        raise InvalidBundleError("bundle has trailing bytes after its entries")
    return blobs
