"""A cache's own entries: written from the key's remembered bytes, and checked quickly.

A cache mostly reads back entries that it wrote, for a key the caller holds.
Their metadata is then known byte for byte but for three fields: it is what
:func:`~runtime_cache.entry_meta.pack_meta` makes of the key, its packed parts,
the cache's producer and no extras, with only the creation time, the build
seconds and the value's length free. :class:`OwnEntries` remembers the fixed
bytes per key, writes entries from them (:meth:`OwnEntries.encode`, byte for
byte :func:`~runtime_cache.codec.encode_packed`), and accepts a blob
(:meth:`OwnEntries.match`) whose metadata is exactly those bytes (times in
range, the header's length), whose header is well formed, whose two checksums
match and, when a secret is set, whose signature is good. That check decodes no
msgpack and builds no dict: it is what makes a hit cheap. The header and metadata
that passed it are remembered per key (as is what a put wrote): the same bytes read
again pass those checks again, so only the value's length, its checksum (against
that header) and the signature are checked.

It accepts only blobs that :func:`~runtime_cache.check.check_entry` accepts,
with the same value and build seconds: the fixed bytes pass
:func:`~runtime_cache.entry_meta.unpack_meta` once per producer and limits (a
sample), the key's parts are within the nesting limit (counted, or else checked
on a sample too), a :class:`~runtime_cache.keys.CacheKey`'s parts have str map
keys (``make_key`` refuses others), and metadata that begins with the key and
its parts is bound to that key (as ``check_entry`` holds). It answers ``None``
for anything else (another producer, extras, a damaged or forged blob), and the
caller then runs the full check, which says what is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from .codec import encode_packed
from .entry_frame import (
    HEADER_SIZE,
    frame_entry,
    header_fits,
)
from .entry_meta import (
    DEFAULT_LIMITS,
    MAX_BUILD_SECONDS,
    MAX_CREATED_AT,
    META_TIMES,
    Limits,
    meta_head,
    openers,
    pack_meta,
    time_problem,
    unpack_meta,
)
from .errors import CorruptEntryError, InvalidValueError
from .keys import CacheKey
from .packing import packb
from .signing import SIG_SIZE, SecretKeys, signed_by

__all__ = ["Found", "OwnEntries"]

#: What a good blob gives: the value (as read, or a view into the blob), its build seconds,
#: and the blob's size.
Found = tuple["bytes | memoryview", float, int]
_BUILT = b"\xa1b\xcb"
_CREATED = b"\xa1c\xcb"
_TIMES = META_TIMES.size
#: The header's fixed fields (magic to the value's length), and its two checksums after them.
_LEAD = struct.Struct("<4sBBHIQ")
_LEAD_SIZE = _LEAD.size
_SUMS = struct.Struct("<QQ")
_xxh3 = xxhash.xxh3_64_intdigest
#: What a good header's fixed fields give: where the value starts, its length, the
#: signature's, the metadata's bytes after the times, and where the times lie.
_Shape = tuple[int, int, int, bytes, int]
#: A header and metadata that passed the quick form's checks for a key: those bytes, the
#: key's packed parts, the value's length, the signature's, the value's checksum, the
#: build seconds, and the whole entry's size.
_Seen = tuple[bytes, bytes, int, int, int, float, int]
#: A backend's read of an entry's value alone (:meth:`~runtime_cache.api.Backend.get_range`).
RangeRead = Callable[[str, int, int, int], "tuple[bytes, bytes] | None"]


class OwnEntries:
    """The fixed bytes of one cache's entries, per key (see the module documentation).

    Remembers up to :attr:`bound` keys; all are forgotten when the cache's
    producer or limits change.
    """

    __slots__ = ("_by_key", "_ends", "_limits", "_producer", "_seen", "_shapes", "_tail")

    #: Keys (and value lengths) remembered before the memo starts over.
    bound = 4096

    def __init__(self) -> None:
        self._producer = ""
        self._limits: Limits | None = None
        #: The producer's bytes and the length's name: the metadata's end, but for the length.
        self._tail: bytes | None = None
        #: Metadata ends by value length (a cache's values take few lengths, mostly).
        self._ends: dict[int, bytes] = {}
        #: Storage key -> (the key's packed parts, the metadata's bytes before the times,
        #: where the times lie when they pass the full check, else 0).
        self._by_key: dict[str, tuple[bytes, bytes, int]] = {}
        #: A good header's fields from the magic to the value's length -> its shape.
        self._shapes: dict[bytes, _Shape] = {}
        #: Storage key -> the header and metadata last checked for it (see ``_Seen``).
        self._seen: dict[str, _Seen] = {}

    def _reset(self, producer: str, limits: Limits) -> None:
        # Everything new before the producer and limits that say it is: a thread that sees
        # them sees the rest (one that does not resets again).
        tail: bytes | None = None
        try:  # the full check, once, on a sample of the fixed bytes
            unpack_meta(pack_meta("", b"\x80", 0.0, 0.0, producer, 0), limits)
            tail = b"\xa1v" + packb(producer) + b"\xa1n"
        except (CorruptEntryError, TypeError, ValueError, OverflowError):
            pass  # such entries fail the full check: no quick form
        self._by_key, self._ends, self._tail = {}, {}, tail
        self._shapes, self._seen = {}, {}
        self._producer, self._limits = producer, limits

    def _prefix(self, skey: str, packed: bytes, limits: Limits) -> tuple[bytes, bytes, int]:
        # (packed, the metadata's bytes before the times, where the times lie in the blob
        # when the full check passes such metadata under the limits, else 0), for a key
        # whose parts pack to ``packed``.
        size = len(name := skey.encode())
        if 32 <= size < 256:  # storage keys are "<runtime>/<purpose>/<32 hex digits>"
            prefix = b"".join((b"\x86\xa1k\xd9", bytes((size,)), name, b"\xa1p", packed, _CREATED))
        else:
            prefix = b"".join((b"\x86", meta_head(skey, packed), _CREATED))
        # Containers nested d deep in the metadata need d + 1 bytes that could open one: the
        # map's own and d in the parts (no other field is one). With few, it is within the
        # nesting limit; else a sample says.
        within = openers(packed) < limits.max_depth
        if not within:
            try:
                unpack_meta(pack_meta(skey, packed, 0.0, 0.0, self._producer, 0), limits)
                within = True
            except CorruptEntryError:
                pass
        if len(self._by_key) >= self.bound:
            self._by_key = {}
        known = self._by_key[skey] = (packed, prefix, HEADER_SIZE + len(prefix) if within else 0)
        return known

    def _end(self, value_len: int) -> bytes:
        # The metadata's bytes after the times, for a value of ``value_len`` bytes.
        end: bytes = (self._tail or b"") + packb(value_len)
        if len(self._ends) >= self.bound:
            self._ends = {}
        self._ends[value_len] = end
        return end

    def encode(
        self,
        key: CacheKey,
        value: bytes | bytearray | memoryview,
        created_at: float,
        build_seconds: float,
        extra: Mapping[str, Any] | None,
        producer: str,
        secret: SecretKeys | None,
    ) -> bytes:
        """The entry of ``value`` under ``key``, as :func:`~runtime_cache.codec.encode_packed`
        writes it; remembers the key's fixed bytes for :meth:`match`.

        Raises :class:`TypeError` for a key that is not a ``CacheKey`` or a value
        that is not bytes, and :class:`~runtime_cache.errors.InvalidValueError` for
        a bad time.
        """
        if not isinstance(key, CacheKey):
            raise TypeError(f"put needs a CacheKey from make_key(), not {type(key).__name__}")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"a cache value must be bytes, not {type(value).__name__}")
        value = bytes(value)
        skey, packed = str(key), key.packed_parts
        created_at, build_seconds = float(created_at), float(build_seconds)
        if producer is not self._producer or self._limits is None:
            self._reset(producer, self._limits or DEFAULT_LIMITS)
        known = self._by_key.get(skey)
        if known is None or known[0] != packed:
            known = self._prefix(skey, packed, self._limits or DEFAULT_LIMITS)
        if extra or self._tail is None:
            return encode_packed(
                skey,
                packed,
                value,
                created_at=created_at,
                build_seconds=build_seconds,
                producer=producer,
                secret=secret,
                extra=extra,
            )
        problem = time_problem(created_at, build_seconds)
        if problem is not None:
            raise InvalidValueError(problem)
        size = len(value)
        times = META_TIMES.pack(created_at, _BUILT, build_seconds)
        meta = b"".join((known[1], times, self._ends.get(size) or self._end(size)))
        blob = frame_entry(meta, value, secret)
        limits = self._limits or DEFAULT_LIMITS
        if known[2] and len(meta) <= limits.max_meta_size and size <= limits.max_value_size:
            # What _check_head finds in these bytes (made so; times checked above), for a
            # read of them that may follow.
            cut = HEADER_SIZE + len(meta)
            value_sum = _SUMS.unpack_from(blob, _LEAD_SIZE)[1]
            sig_len = len(blob) - cut - size
            self._remember(
                skey, (blob[:cut], packed, size, sig_len, value_sum, build_seconds, len(blob))
            )
        return blob

    def _shape(self, head: bytes, limits: Limits) -> _Shape | None:
        # What the header ``head`` begins with gives, when it is good under ``limits`` and
        # entries of this producer have a quick form; else None.
        if len(head) < HEADER_SIZE or self._tail is None:
            return None
        magic, version, flags, reserved, meta_len, value_len = _LEAD.unpack_from(head)
        if not header_fits(magic, version, flags, reserved, meta_len, value_len, limits):
            return None
        tail = self._ends.get(value_len) or self._end(value_len)
        cut = HEADER_SIZE + meta_len
        shape = (cut, value_len, SIG_SIZE if flags else 0, tail, cut - _TIMES - len(tail))
        if len(self._shapes) >= self.bound:
            self._shapes = {}
        self._shapes[head[:_LEAD_SIZE]] = shape
        return shape

    def _check_head(self, key: CacheKey, skey: str, head: bytes, limits: Limits) -> _Seen | None:
        # Every check of the quick form that reads the header and metadata alone; what
        # passes is remembered for ``skey`` by the caller once the value passed too, so
        # that the same bytes read again need only the value's checks.
        if type(head) is not bytes:
            return None
        shape = self._shapes.get(head[:_LEAD_SIZE]) or self._shape(head, limits)
        if shape is None:
            return None
        cut, value_len, sig_len, tail, at = shape
        known = self._by_key.get(skey)
        if known is None or known[0] != key.packed_parts:
            known = self._prefix(skey, key.packed_parts, limits)
        # The times lie where this key's metadata puts them (0: not within the limits).
        if known[2] != at or len(head) < cut:
            return None
        created, built_mark, built = META_TIMES.unpack_from(head, at)
        meta_sum, value_sum = _SUMS.unpack_from(head, _LEAD_SIZE)
        if not (
            head.startswith(known[1], HEADER_SIZE)
            and head.endswith(tail, 0, cut)
            and built_mark == _BUILT
            and 0.0 <= created < MAX_CREATED_AT
            and 0.0 <= built <= MAX_BUILD_SECONDS
            and _xxh3(head[HEADER_SIZE:cut]) == meta_sum
        ):
            return None
        checked = head if len(head) == cut else head[:cut]
        return (checked, known[0], value_len, sig_len, value_sum, built, cut + value_len + sig_len)

    def _remember(self, skey: str, seen: _Seen) -> _Seen:
        if len(self._seen) >= self.bound:
            self._seen = {}
        self._seen[skey] = seen
        return seen

    def read_known(
        self,
        skey: str,
        packed: bytes,
        producer: str,
        limits: Limits,
        secret: SecretKeys | None,
        read: RangeRead,
    ) -> tuple[bytes, float, int] | bool:
        """``(value, build_seconds, blob_size)`` of the entry of ``skey`` (a key whose parts
        pack to ``packed``) last checked or written here for ``producer`` and ``limits``,
        read with ``read(skey, start, end, size)`` (as
        :meth:`~runtime_cache.api.Backend.get_range`) from where its value starts, when the
        value and signature pass the checks of the header remembered for it: the value's
        length and checksum, and the signature when ``secret`` is set. Else ``True`` when
        nothing was read (no header remembered, a ``None`` or failed read), and ``False``
        when what was read failed those checks (its use was counted). The caller then reads
        the entry whole, and that read fails, and counts, as it does."""
        if producer is not self._producer or limits is not self._limits:
            return True
        seen = self._seen.get(skey)
        if seen is None or seen[1] != packed:
            return True
        head, _, value_len, sig_len, value_sum, built, size = seen
        cut = len(head)
        try:
            parts = read(skey, cut, cut + value_len, size)
        except Exception:
            return True
        if parts is None:
            return True
        if not (
            type(parts) is tuple
            and len(parts) == 2
            and type(value := parts[0]) is bytes is type(sig := parts[1])
            and len(value) == value_len
            and len(sig) == sig_len
            and _xxh3(value) == value_sum
            and (secret is None or (sig_len and signed_by(secret, head, sig, (value,))))
        ):
            self._failed(skey)
            return False
        return value, built, size

    def match(
        self,
        key: CacheKey,
        skey: str,
        pieces: tuple[bytes, ...],
        secret: SecretKeys | None,
        producer: str,
        limits: Limits,
    ) -> Found | None:
        """``(value, build_seconds, blob_size)`` when ``pieces`` (as
        :meth:`~runtime_cache.api.Backend.get_parts` returns them) are a good entry of
        ``key`` (stored under ``skey``, its ``str``) as a cache with ``producer``
        writes it, checked under ``limits`` and ``secret``; ``None`` when the full
        check must judge them."""
        # Few steps, each in C where it can be: this is every hit's cost.
        if producer is not self._producer or limits is not self._limits:
            self._reset(producer, limits)
        # The header and metadata as last checked for this key, byte for byte, or checked now;
        # then the value's length, checksum and signature.
        seen = self._seen.get(skey)
        fresh = False  # (a header checked now is remembered once the value passed too)
        if len(pieces) == 3:
            head, value, sig = pieces
            if seen is None or head != seen[0] or seen[1] != key.packed_parts:
                seen = self._check_head(key, skey, head, limits)
                if seen is None or len(head) != len(seen[0]):
                    return None
                fresh = True
            _, _, value_len, sig_len, value_sum, built, size = seen
            if not (
                len(value) == value_len
                and len(sig) == sig_len
                and type(value) is bytes is type(sig)
                and _xxh3(value) == value_sum
                and (secret is None or (sig_len and signed_by(secret, head, sig, (value,))))
            ):
                self._failed(skey)
                return None
            if fresh:
                self._remember(skey, seen)
            return value, built, size
        if len(pieces) != 1 or type(blob := pieces[0]) is not bytes:
            return None
        if seen is None or not blob.startswith(seen[0]) or seen[1] != key.packed_parts:
            seen = self._check_head(key, skey, blob, limits)
            if seen is None:
                return None
            fresh = True
        _, _, value_len, sig_len, value_sum, built, size = seen
        cut = size - value_len - sig_len
        if len(blob) != size:
            self._failed(skey)
            return None
        whole = memoryview(blob)
        view = whole[cut : cut + value_len]
        if _xxh3(view) != value_sum or (
            secret is not None
            and not (
                sig_len and signed_by(secret, whole[:cut], bytes(whole[cut + value_len :]), (view,))
            )
        ):
            self._failed(skey)
            return None
        if fresh:
            self._remember(skey, seen)
        return view, built, size

    def _failed(self, skey: str) -> None:
        # What was read is not the entry checked or written here: forgotten, so that the
        # next read of ``skey`` goes through the front's span (an entry refused there is
        # not read whole again: see runtime_cache.refused_heads).
        self._seen.pop(skey, None)
