"""Cache keys: a stable digest of module id + runtime + purpose + device + extras.

The digest is xxh3-128 over a canonical msgpack encoding of the parts and the
key-schema version, so the same inputs give the same key in any process, on
any machine and in any Python version. Dict order does not matter.

>>> key = make_key(module_id="m@1", runtime="opencl", purpose="program-binary",
...                device={"vendor": "V", "name": "N", "driver": "1.0"})
>>> str(key).startswith("opencl/program-binary/")
True
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgpack
import xxhash

from .packing import packb

__all__ = [
    "KEY_SCHEMA_VERSION",
    "CacheKey",
    "canonical_bytes",
    "check_named_parts",
    "encode_parts",
    "encoded_part",
    "make_key",
    "module_id_from_sources",
    "parts_head",
]

#: Bump only with a migration note: it changes every key.
KEY_SCHEMA_VERSION = 1

_NAME = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,63}\Z")  # \Z: no trailing newline
_MAX_DEPTH = 32
_RESERVED = ("module_id", "runtime", "purpose", "device")


def _canonical(value: Any, where: str, depth: int) -> Any:
    """Return ``value`` in a form whose msgpack encoding does not depend on dict order."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"key part {where!r} is nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, str, bytes)):
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
            raise TypeError(f"key part {where!r} is an integer outside 64 bits")
        return value
    if isinstance(value, float):
        # One NaN, and 0.0 == -0.0 for keys: numerically equal options give one key.
        if math.isnan(value):
            return float("nan")
        return value + 0.0
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"key part {where!r} has a non-str dict key {k!r}")
            items.append((k, _canonical(v, f"{where}.{k}", depth + 1)))
        items.sort(key=lambda kv: kv[0])
        # A dict is encoded as a tagged list of pairs so it can never equal a list.
        return ["\x00dict", [[k, v] for k, v in items]]
    raise TypeError(
        f"key part {where!r} has unsupported type {type(value).__name__}; "
        "use str, int, float, bool, None, bytes, or lists and dicts of these"
    )


def _plain(value: Any) -> Any:
    """A deep copy of ``value`` with mappings as dicts and sequences as lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def _prepare(parts: Mapping[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """Return the canonical encoding of ``parts`` and a private deep copy of them."""
    try:
        body, copy = _walk(dict(parts), 0)
    except (_Unsupported, TypeError):
        # Subclasses of built-in types, or a bad part: the slow walk names the part.
        body = _canonical(dict(parts), "parts", 0)
        copy = _plain(parts)
    packed: bytes = packb(["runtime-cache-key", KEY_SCHEMA_VERSION, body])
    return packed, copy


def canonical_bytes(parts: Mapping[str, Any]) -> bytes:
    """Return the canonical msgpack encoding that a key's digest is taken over."""
    return _prepare(parts)[0]


_PACKER = msgpack.Packer(use_bin_type=True)
#: The encoding's bytes before its pairs: ``["runtime-cache-key", version, ["\x00dict", [``.
_HEAD = b"".join(
    (
        _PACKER.pack_array_header(3),
        _PACKER.pack("runtime-cache-key"),
        _PACKER.pack(KEY_SCHEMA_VERSION),
        _PACKER.pack_array_header(2),
        _PACKER.pack("\x00dict"),
    )
)


def encoded_part(name: str, value: Any) -> tuple[bytes, Any]:
    """One key part's bytes in :func:`canonical_bytes`, and a private copy of its value.

    The encoding holds the parts as ``[name, value]`` pairs sorted by name, and a
    pair's bytes do not depend on the others: :func:`encode_parts` splices them.
    Raises ``TypeError`` naming the part for a value keys cannot hold.
    """
    try:
        canon, copy = _walk(value, 1)
    except (_Unsupported, TypeError):
        canon, copy = _canonical(value, f"parts.{name}", 1), _plain(value)
    packed: bytes = packb([name, canon])
    return packed, copy


def encode_parts(pairs: Mapping[str, bytes]) -> bytes:
    """:func:`canonical_bytes` of the parts whose :func:`encoded_part` bytes are ``pairs``."""
    names = sorted(pairs)
    return b"".join((parts_head(len(names)), *(pairs[n] for n in names)))


def parts_head(count: int) -> bytes:
    """The bytes of :func:`canonical_bytes` before its ``count`` pairs: what
    :func:`encode_parts` puts before the pairs, sorted by name, that it joins."""
    header: bytes = _PACKER.pack_array_header(count)
    return _HEAD + header


class _Unsupported(Exception):
    """Raised by the fast walk; the slow walk then names the offending part."""


_SCALARS = (str, int, bool, bytes, type(None))


def _walk(value: Any, depth: int) -> tuple[Any, Any]:
    """One pass over the parts: ``(canonical form, private deep copy)``.

    The fast path for exact built-in types; anything unusual raises
    :class:`_Unsupported` so :func:`_canonical` can name the part.
    """
    kind = type(value)
    if kind in _SCALARS:
        if kind is int and not -(2**63) <= value < 2**64:
            raise _Unsupported
        return value, value
    if depth > _MAX_DEPTH:
        raise _Unsupported
    if kind is dict:
        pairs = []
        copy = {}
        for k in sorted(value):  # raises TypeError for mixed key types: handled by the caller
            if type(k) is not str:
                raise _Unsupported
            item = value[k]
            item_kind = type(item)
            if item_kind in _SCALARS and (
                item_kind is not int or -(2**63) <= item < 2**64
            ):  # the scalar case, inline
                copy[k] = item
                pairs.append([k, item])
                continue
            canon, copy[k] = _walk(item, depth + 1)
            pairs.append([k, canon])
        return ["\x00dict", pairs], copy
    if kind is list or kind is tuple:
        walked = [_walk(v, depth + 1) for v in value]
        return [c for c, _ in walked], [v for _, v in walked]
    if kind is float:
        return (float("nan") if math.isnan(value) else value + 0.0), value
    raise _Unsupported


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class CacheKey:
    """An immutable, hashable cache key.

    ``str(key)`` is ``"<runtime>/<purpose>/<32 hex digits>"``; it is also the
    storage key that backends see. Equality and hashing use that string only.
    """

    runtime: str
    purpose: str
    digest: str
    _parts: Mapping[str, Any] = field(repr=False, compare=False, hash=False)

    @property
    def parts(self) -> dict[str, Any]:
        """A fresh copy of the parts the key was made from, for inspection."""
        return dict(_thaw(self._parts))

    @property
    def module_id(self) -> str:
        """The module id part."""
        return str(self._parts["module_id"])

    def __str__(self) -> str:
        return self._storage_key

    @cached_property
    def _storage_key(self) -> str:
        # Made once: every read and write of the key asks for it.
        return f"{self.runtime}/{self.purpose}/{self.digest}"

    @cached_property
    def packed_parts(self) -> bytes:
        """The parts as msgpack, as an entry's metadata holds them (computed once)."""
        packed: bytes = packb(self._parts)
        return packed

    def made_from(self, parts: Mapping[str, Any]) -> bool:
        """Whether ``parts`` (as read back from an entry) hash to this key.

        Parts that encode to the same msgpack bytes as this key's own parts are
        the same values, type for type, so they hash alike: that costs one
        encoding, not a key derivation. Anything else is hashed in full.
        """
        try:
            if packb(parts) == self.packed_parts:
                return True
            return str(CacheKey.from_parts(parts)) == str(self)
        except (TypeError, ValueError, OverflowError):
            return False

    @classmethod
    def from_parts(cls, parts: Mapping[str, Any]) -> CacheKey:
        """Rebuild a key from its parts (as kept in an entry's metadata)."""
        check_named_parts(parts)
        packed, copy = _prepare(parts)
        return cls.made(parts["runtime"], parts["purpose"], xxhash.xxh3_128_hexdigest(packed), copy)

    @classmethod
    def made(
        cls,
        runtime: str,
        purpose: str,
        digest: str,
        parts: Mapping[str, Any],
        packed_parts: bytes | None = None,
    ) -> CacheKey:
        """The key of checked ``parts`` (a private copy, in name order) and their ``digest``,
        with its storage string and packed parts (``packed_parts``: msgpack of ``parts``,
        when the caller has it) made now: every read and write asks for them, and this
        spares them ``cached_property``'s lock."""
        if packed_parts is None:
            packed_parts = packb(parts)
        # The fields set as the frozen dataclass's __init__ sets them, without its four
        # object.__setattr__ calls: a key is made per program on a process's first loads.
        key = object.__new__(cls)
        key.__dict__.update(
            runtime=runtime,
            purpose=purpose,
            digest=digest,
            _parts=parts,
            _storage_key=f"{runtime}/{purpose}/{digest}",
            packed_parts=packed_parts,
        )
        return key


def check_named_parts(parts: Mapping[str, Any]) -> None:
    """Check the parts every key has: ``module_id`` (a non-empty str), and ``runtime`` and
    ``purpose`` (1-64 characters of letters, digits, ``.``, ``_``, ``+`` or ``-``, not
    starting with ``.``); ``device`` must be present. Raises ``TypeError`` or ``ValueError``
    as :func:`make_key` does."""
    missing = [name for name in _RESERVED if name not in parts]
    if missing:
        raise TypeError(f"key parts lack {', '.join(missing)}")
    for name in ("runtime", "purpose"):
        value = parts[name]
        if not isinstance(value, str) or not _NAME.match(value):
            raise ValueError(
                f"{name} must be 1-64 characters of letters, digits, '.', '_', '+' "
                f"or '-', not starting with '.': {value!r}"
            )
    if not isinstance(parts["module_id"], str) or not parts["module_id"]:
        raise TypeError("key part 'module_id' must be a non-empty str")


def make_key(
    *,
    module_id: str,
    runtime: str,
    purpose: str,
    device: Any = None,
    **extra: Any,
) -> CacheKey:
    """Build a :class:`CacheKey` from its parts.

    ``device`` is usually a fingerprint dict (vendor, name, driver version...);
    any change to it (a driver update) gives a new key. ``extra`` holds
    anything else that changes the value, such as build options.

    Raises ``TypeError`` naming the part when a part has an unsupported type.
    """
    parts: dict[str, Any] = {
        "module_id": module_id,
        "runtime": runtime,
        "purpose": purpose,
        "device": device,
    }
    parts.update(extra)
    return CacheKey.from_parts(parts)


def module_id_from_sources(sources: str | bytes | Mapping[str, str | bytes], name: str = "") -> str:
    """Derive a module id from a module's sources: ``"<name>@<16 hex digits>"``.

    Equal sources give equal ids; any change to any source gives a new id.

    >>> module_id_from_sources({"add": "kernel void add() {}"}, name="demo")[:5]
    'demo@'
    """
    if isinstance(sources, (str, bytes)):
        body: Any = sources
    elif isinstance(sources, Mapping):
        body = dict(sources)
    else:
        raise TypeError(f"sources must be str, bytes or a mapping, not {type(sources).__name__}")
    digest = xxhash.xxh3_64_hexdigest(
        _flat_sources_bytes(body) or canonical_bytes({"sources": body})
    )
    return f"{name or 'module'}@{digest}"


def _flat_sources_bytes(body: Any) -> bytes | None:
    """:func:`canonical_bytes` of ``{"sources": body}`` for the usual case, a dict of str
    names to str or bytes sources, without the walk's per-part copy (a module of 100
    programs: 140 to 20 us); ``None`` for anything else."""
    if type(body) is not dict:
        return None
    for name, text in body.items():
        if type(name) is not str or (type(text) is not str and type(text) is not bytes):
            return None
    pairs = [[name, body[name]] for name in sorted(body)]
    canon = ["\x00dict", [["sources", ["\x00dict", pairs]]]]
    packed: bytes = packb(["runtime-cache-key", KEY_SCHEMA_VERSION, canon])
    return packed
