"""Tuning records per subgraph symbol: the general form of a CLML-style tuning cache.

A runtime that tunes a model on the device (times candidate local sizes, tile
sizes and so on, then keeps the best) stores one small record per subgraph
symbol. :class:`TuningCache` keeps those records in any :class:`~runtime_cache.Cache`:

* one entry per symbol, keyed by module id + runtime + purpose + device + symbol,
  so a re-tune replaces the record and never appends a duplicate;
* records for another device or another module id are never returned, because
  they live under other keys;
* :meth:`TuningCache.dumps` gives all of a module's records as one checksummed
  blob (the form CLML keeps in one file), and :meth:`TuningCache.loads` merges
  such a blob back, accepting only records for this module and device.

Example::

    import runtime_cache as rc
    from runtime_cache.tuning import TuningCache

    tuning = TuningCache("resnet18@3f2a", "opencl", device_fingerprint)
    record = tuning.get_or_tune("conv2d_7", lambda: {"local_size": [8, 8], "tile": 4})
    record["tile"]  # 4, from the tuner the first time and from the cache after

Records are msgpack-able dicts with ``str`` keys. They come back in their
msgpack form: tuples come back as lists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from .cache import Cache
from .entry_meta import no_ext_type
from .errors import CorruptEntryError, InvalidRecordError, RuntimeCacheError
from .keys import CacheKey, make_key
from .provider import get_cache
from .stats import EntryInfo

__all__ = ["DEFAULT_MAX_RECORD_SIZE", "Record", "TuningCache"]

log = logging.getLogger(__name__)

#: The largest encoded record accepted, in bytes. Tuning records are small.
DEFAULT_MAX_RECORD_SIZE = 64 * 1024
_MAX_SYMBOL = 256
_MAX_DEPTH = 16

Record = dict[str, Any]


def _check_depth(value: Any) -> None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise InvalidRecordError(f"a tuning record is nested deeper than {_MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def decode_record(data: bytes, max_size: int = DEFAULT_MAX_RECORD_SIZE) -> Record:
    """Decode a stored record, enforcing the size and depth limits.

    Raises :class:`~runtime_cache.errors.CorruptEntryError` when ``data`` is not
    a msgpack map with ``str`` keys within the limits.
    """
    if len(data) > max_size:
        raise CorruptEntryError(f"tuning record of {len(data)} bytes exceeds {max_size}")
    try:
        record = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=max_size,
            max_str_len=max_size,
            max_array_len=max_size,
            max_map_len=max_size,
            max_ext_len=0,
            ext_hook=no_ext_type,
        )
        if not isinstance(record, dict):
            raise CorruptEntryError("a tuning record must be a map")
        _check_depth(record)
    except CorruptEntryError:
        raise
    except Exception as exc:  # msgpack raises many types for bad input
        raise CorruptEntryError(f"tuning record does not decode: {exc}") from None
    if not all(isinstance(k, str) for k in record):
        raise CorruptEntryError("a tuning record's keys must be str")
    return record


def encode_record(record: Mapping[str, Any], max_size: int = DEFAULT_MAX_RECORD_SIZE) -> bytes:
    """Encode ``record`` with msgpack after checking it; return the bytes.

    Raises :class:`~runtime_cache.errors.InvalidRecordError` when ``record`` is
    not a mapping with ``str`` keys of msgpack-able values (no ext types), is
    nested too deep, or encodes to more than ``max_size`` bytes.
    """
    if not isinstance(record, Mapping):
        raise InvalidRecordError(f"a tuning record must be a dict, not {type(record).__name__}")
    if not all(isinstance(k, str) for k in record):
        raise InvalidRecordError("a tuning record's keys must be str")
    try:
        data: bytes = msgpack.packb(dict(record), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRecordError(f"a tuning record must be msgpack-able: {exc}") from None
    if len(data) > max_size:
        raise InvalidRecordError(f"tuning record of {len(data)} bytes exceeds {max_size}")
    try:
        decode_record(data, max_size)
    except CorruptEntryError as exc:
        # e.g. a nested dict with int keys, or one nested too deep: it would not read back.
        raise InvalidRecordError(f"tuning record would not read back: {exc}") from None
    return data


def _check_symbol(symbol: object) -> str:
    if not isinstance(symbol, str) or not symbol or len(symbol) > _MAX_SYMBOL:
        raise InvalidRecordError(
            f"a subgraph symbol must be a str of 1 to {_MAX_SYMBOL} characters, not {symbol!r}"
        )
    return symbol


class TuningCache:
    """Tuning records of one module on one device, one record per subgraph symbol.

    Args:
        module_id: the module (model) the subgraphs belong to, e.g. from
            :func:`runtime_cache.module_id_from_sources`.
        runtime: the runtime that tuned them, e.g. ``"opencl"`` or ``"clml"``.
        device: the device fingerprint (a dict of plain values); another device,
            or a new driver version, has other records.
        purpose: the key purpose; ``"tuning"`` unless one runtime keeps several kinds.
        cache: the :class:`~runtime_cache.Cache` to use; ``None`` means the
            process-wide one, :func:`runtime_cache.get_cache`, looked up at each call.
        max_record_size: the largest encoded record accepted, in bytes. A stored record
            over it (another user's, with a larger limit) is a miss here and stays: what
            this reader tunes in its place is kept in this object, not stored.
    """

    def __init__(
        self,
        module_id: str,
        runtime: str,
        device: Any,
        *,
        purpose: str = "tuning",
        cache: Cache | None = None,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    ) -> None:
        self.module_id = module_id
        self.runtime = runtime
        self.device = device
        self.purpose = purpose
        self.max_record_size = max_record_size
        self._cache = cache
        self._here: dict[str, Record] = {}  # tuned where the stored record is over the limit
        # Fail early on bad parts (unsupported device types, bad names).
        self.key("probe")

    @property
    def cache(self) -> Cache:
        """The cache the records live in."""
        return self._cache if self._cache is not None else get_cache()

    def key(self, symbol: str) -> CacheKey:
        """The cache key of ``symbol``'s record."""
        return make_key(
            module_id=self.module_id,
            runtime=self.runtime,
            purpose=self.purpose,
            device=self.device,
            symbol=_check_symbol(symbol),
        )

    def __repr__(self) -> str:
        return (
            f"<TuningCache module_id={self.module_id!r} runtime={self.runtime!r} "
            f"purpose={self.purpose!r}>"
        )

    # ------------------------------------------------------------ one record
    def get(self, symbol: str) -> Record | None:
        """Return ``symbol``'s record, or ``None`` when it was never tuned here.

        A stored record that does not decode is deleted and reported as missing; one
        larger than this reader's ``max_record_size`` (another user's) is missing here,
        and kept.
        """
        key = self.key(symbol)
        cache = self.cache  # (once: the provider may change meanwhile)
        data = cache.get(key)
        if data is None:
            return None
        if self._over_limit(key, data):
            cache.took_back(key, data, corrupt=False)
            return self._here.get(symbol)
        return self._decode_or_discard(cache, key, data)

    def _over_limit(self, key: CacheKey, data: bytes) -> bool:
        """Whether ``data`` is larger than this reader takes: a record another user of the
        store with a larger ``max_record_size`` stored. A miss here, neither removed nor
        replaced (it is good for its writer)."""
        if len(data) <= self.max_record_size:
            return False
        log.info(
            "runtime-cache: tuning record %s of %d bytes is over this reader's limit of %d; "
            "tuning here without replacing it",
            key,
            len(data),
            self.max_record_size,
        )
        return True

    def _decode_or_discard(self, cache: Cache, key: CacheKey, data: bytes) -> Record | None:
        """``data``'s record; ``None`` for a bad one, deleted and counted as a miss."""
        try:
            return decode_record(data, self.max_record_size)
        except CorruptEntryError as exc:
            log.warning("runtime-cache: bad tuning record %s (%s); deleting it", key, exc)
            cache.took_back(key, data)  # (a miss, not a hit that saved its tuning time)
            cache.delete_if_holds(key, data)  # (not a good record stored since)
            return None

    def put(self, symbol: str, record: Mapping[str, Any], *, tune_seconds: float = 0.0) -> bool:
        """Store ``record`` for ``symbol``, replacing any earlier one; return whether it stored.

        ``tune_seconds`` is how long tuning took; hits count it as time saved.
        Raises :class:`~runtime_cache.errors.InvalidRecordError` for a bad record.
        """
        data = encode_record(record, self.max_record_size)
        return self.cache.put(self.key(symbol), data, tune_seconds)

    def get_or_tune(self, symbol: str, tune: Callable[[], Mapping[str, Any]]) -> Record:
        """Return ``symbol``'s record, calling ``tune()`` and storing its result on a miss.

        Within one process, threads asking for the same symbol at once share
        one ``tune()`` call (and its exception, if it raises).
        """
        key = self.key(symbol)
        cache = self.cache

        def build() -> bytes:
            return encode_record(tune(), self.max_record_size)

        def here() -> Record:  # tuned once for this reader, which cannot take the stored one
            if symbol not in self._here:
                self._here[symbol] = decode_record(build(), self.max_record_size)
            return self._here[symbol]

        first = cache.get(key)
        if first is not None:
            if self._over_limit(key, first):
                cache.took_back(key, first, corrupt=False)
                return here()
            record = self._decode_or_discard(cache, key, first)
            if record is not None:
                return record
        data = cache.get_or_build(key, build, after_miss=True)  # (the read above: one count)
        if self._over_limit(key, data):  # (stored by another user meanwhile, read as a hit)
            cache.took_back(key, data, corrupt=False)
            return here()
        try:
            return decode_record(data, self.max_record_size)
        except CorruptEntryError:
            # Read as a hit: the bad record read first, which could not be removed (a
            # read-only store), or one another process stored since. Taken back; tune anew.
            cache.took_back(key, data, corrupt=data != first)  # (the first was counted)
            data = build()
            cache.put(key, data)
            return decode_record(data, self.max_record_size)

    def delete(self, symbol: str) -> bool:
        """Remove ``symbol``'s record; return whether it was there."""
        self._here.pop(symbol, None)
        return self.cache.delete(self.key(symbol))

    # ------------------------------------------------------------ all records
    def symbols(self) -> list[str]:
        """The symbols that have a record for this module and device, sorted. In a cache
        with a secret, only those whose record reads back signed (as :meth:`records`):
        a writer of a shared store without the secret cannot add to the list."""
        listed = self._listed()
        return sorted(self._read(listed) if self.cache.signed else listed)

    def records(self) -> dict[str, Record]:
        """All records of this module and device, by symbol, read as looks (no hit counted).
        Those that do not decode are left out, as are those over this reader's limit, but
        for one this reader tuned itself in their place (as :meth:`get` gives)."""
        listed = self._listed()
        out = {s: self._here[s] for s in listed if s in self._here}
        for symbol, data in self._read(listed).items():
            try:
                out[symbol] = decode_record(data, self.max_record_size)
            except CorruptEntryError:
                continue
        return dict(sorted(out.items()))

    def _listed(self) -> dict[str, EntryInfo]:
        # This module's entries on this device, by symbol, from their heads alone.
        found = {}
        for info in self.cache.entries(self.runtime, self.purpose, self.module_id):
            symbol = info.parts.get("symbol")
            if not isinstance(symbol, str):
                continue
            try:
                if str(self.key(symbol)) == info.key:  # same device, same everything
                    found[symbol] = info
            except (InvalidRecordError, TypeError, ValueError):
                continue
        return found

    def _read(self, listed: dict[str, EntryInfo]) -> dict[str, bytes]:
        # The values of ``listed`` that pass the cache's check, by symbol: of those whose
        # heads say signed (with a secret) and whose files a record can fill (a planted 16 MB
        # value was read whole), read in batches as looks (no hit, no eviction order moved).
        most = self.max_record_size + self.cache.limits.max_meta_size + 4096
        signed = self.cache.signed
        ordered = sorted(
            s for s, i in listed.items() if (i.signed or not signed) and i.stored_size <= most
        )
        found: dict[str, bytes] = {}
        for at in range(0, len(ordered), 64):
            keys = {str(self.key(symbol)): symbol for symbol in ordered[at : at + 64]}
            try:
                blobs = self.cache.backend.peek_many(keys)
            except RuntimeCacheError as exc:
                if self.cache.strict:
                    raise
                log.warning("runtime-cache: tuning records of %s not read: %s", self.module_id, exc)
                break  # (those read before stand)
            for skey, blob in blobs.items():
                try:
                    found[keys[skey]] = self.cache.decode(skey, blob).value
                except CorruptEntryError:
                    continue
        return found

    def clear(self) -> int:
        """Delete every record of this module and device, those over this reader's limit
        too (the module's, whoever stored them; unsigned ones in a cache with a secret
        as well); return how many were removed."""
        self._here.clear()
        return sum(self.delete(symbol) for symbol in self._listed())

    def dumps(self) -> bytes:
        """All of this module's records on this device as one blob.

        The blob is a runtime-cache bundle: magic, format version and checksum
        (and an HMAC when the cache has a secret); each record inside keeps its
        key parts, so the module id and device travel with it.
        """
        return self.cache.dumps(keys=[self.key(symbol) for symbol in self.symbols()])

    def loads(self, data: bytes) -> int:
        """Merge a blob from :meth:`dumps`; return how many records were accepted.

        Only records for this module id, runtime, purpose and device are
        accepted; others are skipped, as are single records that fail their
        checksum or signature. A malformed blob raises
        :class:`~runtime_cache.errors.InvalidBundleError`, as does, when the cache has
        a secret, a blob not signed with it (refused as a whole, as ``Cache.loads`` does).

        A cache without a secret over a shared store (``insecure=1``) writes
        nothing: unsigned records are not passed on to other users, as with
        :meth:`~runtime_cache.Cache.loads`. It logs a warning and returns 0.
        """
        cache = self.cache
        accepted = 0
        if not cache.signed and cache.backend.shared:
            log.warning(
                "runtime-cache: not writing unsigned tuning records to the shared store %r",
                cache.backend,
            )
            return 0
        for blob in cache.unbundle(data):  # with a secret, the bundle's own HMAC too
            try:
                # The one entry check (signature with the cache's secret, key against parts).
                entry = cache.check(None, blob).entry()
                symbol = entry.parts.get("symbol")
                if not isinstance(symbol, str) or str(self.key(symbol)) != entry.key:
                    continue  # another module, device, runtime or purpose
                record = decode_record(entry.value, self.max_record_size)
                # Inside the try: a record can re-encode larger than it came (msgpack
                # float32 read back as float64) and fail the size limit; skip it.
                stored = self.put(symbol, record, tune_seconds=entry.build_seconds)
            except (CorruptEntryError, InvalidRecordError) as exc:
                log.warning("runtime-cache: skipped a tuning record while loading: %s", exc)
                continue
            if stored:
                accepted += 1
        return accepted
