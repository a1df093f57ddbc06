"""An entry's metadata: the msgpack map before the value, its fields and its limits.

Fields: ``k`` the key, ``p`` its parts, ``c`` created (Unix time), ``b`` build
seconds, ``v`` producer, ``n`` value length, and optionally ``x``, a small dict
of extras. :mod:`runtime_cache.codec` frames it; this module decodes and checks
it, and knows how it begins (:func:`meta_head`).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .errors import CorruptEntryError
from .packing import packb

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_BUILD_SECONDS",
    "MAX_CREATED_AT",
    "META_TIMES",
    "Entry",
    "Limits",
    "meta_head",
    "no_ext_type",
    "openers",
    "pack_meta",
    "time_problem",
    "unpack_meta",
]


@dataclass(frozen=True)
class Limits:
    """Decode limits, so a hostile blob cannot exhaust memory or the stack."""

    max_value_size: int = 1 << 30  # 1 GiB
    max_meta_size: int = 1 << 16  # 64 KiB
    max_entries: int = 1_000_000
    max_depth: int = 32


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Entry:
    """A decoded entry: the value and its metadata."""

    key: str
    parts: dict[str, Any]
    value: bytes
    created_at: float
    build_seconds: float
    producer: str
    signed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """The value's size in bytes."""
        return len(self.value)


def _within_depth(value: Any, left: int) -> bool:
    if left < 0:
        return False
    children = value.values() if type(value) is dict else value
    for child in children:
        if type(child) in (dict, list) and not _within_depth(child, left - 1):
            return False
    return True


#: Every byte that can open a msgpack map or array (fixmap, fixarray, array 16/32, map
#: 16/32) is kept by ``bytes.translate(None, _NOT_OPENERS)``; every other byte is deleted.
_NOT_OPENERS = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))


#: Maps each byte that could open a map or array to 1, every other byte to 0.
_OPENER_FLAGS = bytes(0 if b in _NOT_OPENERS else 1 for b in range(256))


def openers(raw: bytes) -> int:
    """How many bytes of ``raw`` could open a msgpack map or array: containers nested
    ``d`` deep in it need ``d + 1`` of them."""
    return raw.translate(_OPENER_FLAGS).count(1)


def _check_depth(value: Any, limit: int, raw: bytes | None = None) -> None:
    # When ``raw`` holds at most ``limit`` bytes that could open a container, the walk
    # cannot fail: skip it.
    if raw is not None and openers(raw) <= limit:
        return
    if not _within_depth(value, limit):
        raise CorruptEntryError(f"metadata is nested deeper than {limit} levels")


#: Creation times must fall in [0, this): about the year 2514, far beyond any real clock.
MAX_CREATED_AT = float(2**34)
#: Build times must fall in [0, this] seconds (about three years).
MAX_BUILD_SECONDS = 1e8


def time_problem(created_at: Any, build_seconds: Any) -> str | None:
    """Why these times cannot be an entry's (NaN, inf, negative, absurdly large), or ``None``."""
    if not (math.isfinite(created_at) and 0.0 <= created_at < MAX_CREATED_AT):
        return f"created_at {created_at!r} is not a plausible Unix time"
    if not (math.isfinite(build_seconds) and 0.0 <= build_seconds <= MAX_BUILD_SECONDS):
        return f"build_seconds {build_seconds!r} is not 0 to {MAX_BUILD_SECONDS:g} seconds"
    return None


def no_ext_type(code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook`` where no ext type is taken: raises :class:`ValueError`.
    (``max_ext_len=0`` lets one of 0 bytes through.)"""
    raise ValueError(f"an ext type ({code}) where none is taken")


def unpack_meta(raw: bytes | memoryview, limits: Limits) -> dict[str, Any]:
    """Decode and check an entry's metadata map (its bytes passed their checksum).

    Raises :class:`CorruptEntryError` for anything but a map of the fields and
    types the codec writes, within ``limits``.
    """
    raw = raw if type(raw) is bytes else bytes(raw)
    try:
        meta = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            max_bin_len=limits.max_meta_size,
            max_str_len=limits.max_meta_size,
            max_array_len=limits.max_meta_size,
            max_map_len=limits.max_meta_size,
            max_ext_len=0,
            ext_hook=no_ext_type,
        )
    except Exception as exc:  # msgpack raises many types for bad input
        raise CorruptEntryError(f"metadata does not decode: {exc}") from None
    if not isinstance(meta, dict):
        raise CorruptEntryError("metadata is not a map")
    _check_depth(meta, limits.max_depth, raw)
    get = meta.get
    if not (
        isinstance(get("k"), str)
        and isinstance(get("p"), dict)
        and isinstance(get("c"), float)
        and isinstance(get("b"), float)
        and isinstance(get("v"), str)
        and isinstance(get("n"), int)
    ):
        for name, kind in _FIELDS:  # say which
            if not isinstance(get(name), kind):
                raise CorruptEntryError(f"metadata field {name!r} is missing or mistyped")
    if "x" in meta and not isinstance(meta["x"], dict):
        raise CorruptEntryError("metadata field 'x' is mistyped")
    # NaN or inf here would crash listings and poison seconds_saved sums.
    created, built = meta["c"], meta["b"]
    if not (0.0 <= created < MAX_CREATED_AT and 0.0 <= built <= MAX_BUILD_SECONDS):
        problem = time_problem(created, built)  # NaN fails the comparisons too
        raise CorruptEntryError(f"metadata field {problem}")
    return meta


_FIELDS = (("k", str), ("p", dict), ("c", float), ("b", float), ("v", str), ("n", int))


def meta_head(key: str, packed_parts: bytes) -> bytes:
    """The bytes that follow the map header in the metadata of every entry this module
    encodes for ``key`` with parts that pack to ``packed_parts``: its key, then its parts.

    >>> meta_head("a/b/c", b"\\x80") == b"\\xa1k" + msgpack.packb("a/b/c") + b"\\xa1p\\x80"
    True
    """
    # msgpack's str header, written here: a Packer per call costs more than the rest of a
    # read's checks. A mistake could only make a good entry take the slow binding check.
    raw = key.encode()
    size = len(raw)
    if size < 32:
        mark = bytes((0xA0 | size,))
    elif size < 256:
        mark = bytes((0xD9, size))
    elif size < 65536:
        mark = b"\xda" + size.to_bytes(2, "big")  # keys are at most 1,024 characters
    else:
        mark = b"\xdb" + size.to_bytes(4, "big")
    return b"".join((b"\xa1k", mark, raw, b"\xa1p", packed_parts))


#: The creation time's field name and float marker, ending :func:`meta_head` + ``b"\\xa1p"`` +
#: parts; then the creation time, the build seconds' name and marker, and the build seconds.
_CREATED = b"\xa1c\xcb"
META_TIMES = struct.Struct(">d3sd")
_BUILT = b"\xa1b\xcb"


def pack_meta(
    key: str,
    packed_parts: bytes,
    created_at: float,
    build_seconds: float,
    producer: str,
    value_len: int,
    extra: dict[str, Any] | None = None,
) -> bytes:
    """The metadata of an entry, byte for byte what msgpack makes of the map
    ``{"k": key, "p": parts, "c": created_at, "b": build_seconds, "v": producer,
    "n": value_len}`` (and ``"x": extra`` when given), from the parts already packed.

    >>> meta = pack_meta("a/b/c", msgpack.packb({"i": 1}), 1.5, 0.0, "me", 3, {"f": 2})
    >>> meta == msgpack.packb({"k": "a/b/c", "p": {"i": 1}, "c": 1.5, "b": 0.0, "v": "me",
    ...                        "n": 3, "x": {"f": 2}}, use_bin_type=True)
    True
    """
    return b"".join(
        (
            b"\x87" if extra else b"\x86",
            meta_head(key, packed_parts),
            _CREATED,
            META_TIMES.pack(created_at, _BUILT, build_seconds),
            b"\xa1v",
            packb(producer),
            b"\xa1n",
            packb(value_len),
            b"\xa1x" + packb(extra) if extra else b"",
        )
    )
