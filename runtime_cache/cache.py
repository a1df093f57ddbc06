"""The front: :class:`Cache` encodes, checks and signs entries over any backend.

The front is pure and in memory; all I/O happens in the backend it wraps. A
backend failure is logged once per outage, counted, and treated as a miss or a
skipped store, unless ``strict=True``. A corrupt entry is counted, deleted and
treated as a miss, so the caller rebuilds it.

>>> import runtime_cache as rc
>>> from runtime_cache.backends.memory import MemoryBackend
>>> cache = rc.Cache(MemoryBackend())
>>> key = rc.make_key(module_id="m", runtime="demo", purpose="doc", device=None)
>>> cache.get_or_build(key, lambda: b"built")
b'built'
>>> cache.get(key), cache.stats().hits
(b'built', 1)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

from ._version import __version__
from .api import Backend, StoredItem
from .codec import (
    DEFAULT_LIMITS,
    Entry,
    Limits,
    decode_bundle,
    decode_entry,
    decode_view,
    encode_bundle,
    encode_entry,
    normalize_secret,
)
from .errors import CorruptEntryError, RuntimeCacheError, SignatureError
from .fleet import Fleet
from .keys import CacheKey
from .listing import read_info, screen_bundle
from .single_flight import SingleFlight
from .stats import CacheStats, Counters, EntryInfo

__all__ = ["Cache", "KeyLike"]

log = logging.getLogger(__name__)

KeyLike = CacheKey | str
#: Told ``(key, reason)`` for each entry a listing or a dump leaves out as corrupt or unreadable.
OnSkip = Callable[[str, str], None]
#: Told ``(done, total)`` as a long operation advances.
OnProgress = Callable[[int, int], None]
#: Entries per backend round trip in :meth:`Cache.dumps` (and per progress step).
DUMP_BATCH = 256
_WRITES = frozenset({"set", "delete"})


class _NullBackend(Backend):
    """Stores nothing: the backend of a disabled cache."""

    scheme = "off"

    def get(self, key: str) -> bytes | None:
        return None

    def set(self, key: str, value: bytes) -> None:
        return None

    def delete(self, key: str) -> bool:
        return False

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter(())


class Cache:
    """A cache of key/value blobs with metadata, over a pluggable :class:`Backend`.

    Args:
        backend: where the bytes live; ``None`` makes a disabled cache that
            never hits and never stores.
        strict: raise backend errors instead of counting them as misses.
        secret: a shared secret; entries written are signed with HMAC-SHA256,
            and entries without a valid signature are rejected.
        producer: a label stored with each entry (defaults to this library's
            name and version).
        limits: decode limits for entries and bundles.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        strict: bool = False,
        secret: str | bytes | None = None,
        producer: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.enabled = backend is not None
        self._backend: Backend = backend if backend is not None else _NullBackend()
        self.strict = strict
        self._secret = normalize_secret(secret)
        self.producer = producer or f"runtime-cache {__version__}"
        self.limits = limits
        self._counters = Counters()
        self._flights = SingleFlight()
        #: Build leases across processes: policy, expected build times (see :mod:`.fleet`).
        self.fleet = Fleet(self._counters)
        self._state_lock = threading.Lock()
        self._failing: set[str] = set()
        self._generation = 0
        self._saved_generation = 0

    # ------------------------------------------------------------------ basics
    @property
    def backend(self) -> Backend:
        """The backend this cache stores into."""
        return self._backend

    @property
    def signed(self) -> bool:
        """Whether a secret is set (entries are signed and verified)."""
        return self._secret is not None

    @property
    def generation(self) -> int:
        """A counter that grows with every store, delete or accepted bundle."""
        return self._generation

    @property
    def dirty(self) -> bool:
        """Whether anything changed since the last unfiltered :meth:`dumps`.

        An app that keeps the bytes itself saves only when this is true.
        """
        return self._generation != self._saved_generation

    def stats(self) -> CacheStats:
        """A snapshot of this cache's counters in this process."""
        return self._counters.snapshot()

    def reset_stats(self) -> None:
        """Set every counter back to zero."""
        self._counters.reset()

    def close(self) -> None:
        """Close the backend."""
        self._backend.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "" if self.enabled else " disabled"
        return f"<Cache{state} backend={self._backend!r}>"

    # ------------------------------------------------------------ failure policy
    def _failed(self, op: str, exc: Exception) -> None:
        self._counters.add(errors=1)
        if self.strict:
            # The caller gets the error itself; "carrying on without the cache" would be untrue.
            log.debug("runtime-cache: %s failed on %r: %s", op, self._backend, exc)
            raise exc
        side = "write" if op in _WRITES else "read"
        with self._state_lock:
            first = side not in self._failing
            self._failing.add(side)
        if first:
            log.warning(
                "runtime-cache: %s failed on %r (%s: %s); carrying on without the cache "
                "until it recovers",
                op,
                self._backend,
                type(exc).__name__,
                exc,
            )
        else:
            log.debug("runtime-cache: %s failed again: %s", op, exc)

    def _succeeded(self, side: str = "read") -> None:
        # Reads and writes recover apart: a read-only store keeps failing writes
        # while reads succeed, and must not log once per call.
        if side in self._failing:
            with self._state_lock:
                was = side in self._failing
                self._failing.discard(side)
            if was:
                log.warning("runtime-cache: %ss on %r work again", side, self._backend)

    def _bump(self) -> None:
        with self._state_lock:
            self._generation += 1

    # ------------------------------------------------------------------ reading
    def decode(self, skey: str, blob: bytes) -> Entry:
        """Decode ``blob`` stored under ``skey`` with this cache's secret and limits.

        Raises :class:`CorruptEntryError` (or :class:`SignatureError`) when it is
        malformed, unsigned while a secret is set, or holds another key.
        """
        entry = decode_entry(blob, secret=self._secret, limits=self.limits)
        if entry.key != skey:
            raise CorruptEntryError(f"entry stored under {skey!r} holds key {entry.key!r}")
        return entry

    def get_entry(self, key: KeyLike) -> Entry | None:
        """Return the whole entry (value and metadata) for ``key``, or ``None``."""
        skey = str(key)
        try:
            blob = self._backend.get(skey)
        except Exception as exc:
            self._counters.add(misses=1)
            self._failed("get", exc)
            return None
        self._succeeded()
        if blob is None:
            self._counters.add(misses=1)
            return None
        try:
            entry = self.decode(skey, blob)
        except SignatureError as exc:
            # Not deleted: a fleet member with another secret must not erase our entries.
            self._counters.add(misses=1, rejected=1)
            log.warning("runtime-cache: rejected %s: %s", skey, exc)
            return None
        except CorruptEntryError as exc:
            self._counters.add(misses=1, corrupt=1)
            log.warning("runtime-cache: corrupt entry %s (%s); deleting it", skey, exc)
            self._discard(skey)
            return None
        self._counters.add(hits=1, bytes_read=len(blob), seconds_saved=entry.build_seconds)
        return entry

    def _discard(self, skey: str) -> None:
        try:
            self._backend.delete(skey)
        except Exception as exc:
            self._failed("delete", exc)

    def get(self, key: KeyLike) -> bytes | None:
        """Return the value stored for ``key``, or ``None`` on a miss."""
        entry = self.get_entry(key)
        return None if entry is None else entry.value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, (CacheKey, str)):
            return False
        return self.get_entry(key) is not None

    # ------------------------------------------------------------------ writing
    def _encode(
        self, key: CacheKey, value: bytes, build_seconds: float, extra: Mapping[str, Any] | None
    ) -> bytes:
        if not isinstance(key, CacheKey):
            raise TypeError(f"put needs a CacheKey from make_key(), not {type(key).__name__}")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"a cache value must be bytes, not {type(value).__name__}")
        return encode_entry(
            str(key),
            key.parts,
            bytes(value),
            created_at=time.time(),
            build_seconds=build_seconds,
            producer=self.producer,
            secret=self._secret,
            extra=extra,
        )

    def put(
        self,
        key: CacheKey,
        value: bytes,
        build_seconds: float = 0.0,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store ``value`` under ``key``; return whether it was stored.

        ``build_seconds`` is how long the value took to make; hits add it to
        ``stats().seconds_saved``. ``extra`` is a small msgpack-able dict kept
        in the metadata.
        """
        blob = self._encode(key, value, build_seconds, extra)
        if not self.enabled:
            return False
        return self._store({str(key): blob})

    def put_many(self, items: Mapping[CacheKey, bytes], build_seconds: float = 0.0) -> bool:
        """Store many values in one backend call (one round trip where supported)."""
        blobs = {str(k): self._encode(k, v, build_seconds, None) for k, v in items.items()}
        return self.enabled and bool(blobs) and self._store(blobs)

    def _store(self, blobs: Mapping[str, bytes]) -> bool:
        try:
            if len(blobs) == 1:
                ((skey, blob),) = blobs.items()
                self._backend.set(skey, blob)
            else:
                self._backend.set_many(blobs)
        except Exception as exc:
            self._failed("set", exc)
            return False
        self._succeeded("write")
        self._counters.add(stores=len(blobs), bytes_written=sum(map(len, blobs.values())))
        self._bump()
        return True

    def get_many(self, keys: Iterable[KeyLike]) -> dict[str, bytes]:
        """Fetch many values in one backend call; returns ``{str(key): value}`` for hits."""
        return {skey: bytes(view) for skey, view in self.get_many_views(keys).items()}

    def get_many_views(self, keys: Iterable[KeyLike]) -> dict[str, memoryview]:
        """Like :meth:`get_many`, but each value is a read-only view into the stored blob.

        Verified exactly as :meth:`get_many` does, without copying the values:
        for consumers that hand large values straight to a driver (a view keeps
        its whole blob alive while it lives).
        """
        wanted = [str(k) for k in keys]
        try:
            blobs = self._backend.get_many(wanted)
        except Exception as exc:
            self._counters.add(misses=len(wanted))
            self._failed("get_many", exc)
            return {}
        self._succeeded()
        found: dict[str, memoryview] = {}
        misses = rejected = corrupt = read = 0
        saved = 0.0
        for skey in wanted:
            blob = blobs.get(skey)
            if blob is None:
                misses += 1
                continue
            try:
                meta, value, _ = decode_view(blob, secret=self._secret, limits=self.limits)
                if meta["k"] != skey:
                    raise CorruptEntryError(f"entry stored under {skey!r} holds key {meta['k']!r}")
            except SignatureError:
                misses, rejected = misses + 1, rejected + 1
                continue
            except CorruptEntryError:
                misses, corrupt = misses + 1, corrupt + 1
                self._discard(skey)
                continue
            read += len(blob)
            saved += meta["b"]
            found[skey] = value
        self._counters.add(
            hits=len(found),
            misses=misses,
            rejected=rejected,
            corrupt=corrupt,
            bytes_read=read,
            seconds_saved=saved,
        )
        return found

    def delete(self, key: KeyLike) -> bool:
        """Remove ``key``; return whether it was there."""
        try:
            removed = self._backend.delete(str(key))
        except Exception as exc:
            self._failed("delete", exc)
            return False
        self._succeeded("write")
        if removed:
            self._bump()
        return removed

    def get_or_build(
        self,
        key: CacheKey,
        build: Callable[[], bytes],
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        """Return the cached value for ``key``, or call ``build()`` and store its result.

        Within one process only one ``build()`` runs per key at a time: other
        threads asking for the same key wait and share its result (or its
        exception). Across processes, where the backend offers leases
        (``dir://``, ``redis://``), one process builds while the others wait
        for its entry, up to a deadline (see :mod:`runtime_cache.fleet`).
        """
        skey = str(key)
        flight, leader = self._flights.join(skey)
        if not leader:
            value = flight.wait()
            # Served without a build of its own: a hit, so every lookup is a hit or a miss.
            self._counters.add(hits=1)
            return value

        def build_and_store() -> bytes:
            started = time.perf_counter()
            made = build()
            seconds = time.perf_counter() - started
            if not isinstance(made, (bytes, bytearray, memoryview)):
                raise TypeError(f"build() must return bytes, not {type(made).__name__}")
            made = bytes(made)
            self._counters.add(builds=1, build_seconds=seconds)
            self.fleet.record(key, seconds)
            self.put(key, made, seconds, extra=extra)
            return made

        def fetch() -> bytes | None:
            # Another process's entry, read after this call's miss: that miss becomes a hit
            # (one lookup, one count). A blob that fails its check was counted at the miss.
            try:
                blob = self._backend.get(skey)
                entry = None if blob is None else self.decode(skey, blob)
            except Exception:
                return None
            if blob is None or entry is None:
                return None
            self._counters.add(
                hits=1, misses=-1, bytes_read=len(blob), seconds_saved=entry.build_seconds
            )
            return entry.value

        try:
            found = self.get(key)
            if found is not None:
                value = found
            elif self.enabled:
                value = self.fleet.build_once(self._backend, key, fetch, build_and_store)
            else:
                value = build_and_store()
        except BaseException as exc:
            self._flights.finish(skey, flight, error=exc)
            raise
        self._flights.finish(skey, flight, value=value)
        return value

    # --------------------------------------------------------------- inspection
    def entries(
        self,
        runtime: str | None = None,
        purpose: str | None = None,
        module_id: str | None = None,
        *,
        on_skip: OnSkip | None = None,
    ) -> Iterator[EntryInfo]:
        """Iterate over entry metadata, filtered, without loading values.

        Entries that vanish while listing are left out. Entries that fail to
        decode, or that the backend cannot read, are left out too and told to
        ``on_skip(key, reason)`` when given. Use
        :func:`runtime_cache.maintenance.verify` to find and remove bad ones.
        """
        prefix = ""
        if runtime is not None:
            prefix = f"{runtime}/" if purpose is None else f"{runtime}/{purpose}/"
        try:
            items = list(self._backend.scan(prefix))
        except Exception as exc:
            self._failed("scan", exc)
            return
        for item in items:
            try:
                info = read_info(self._backend, item, self.limits)
            except KeyError:
                continue
            except RuntimeCacheError as exc:
                if on_skip is not None:
                    kind = "corrupt" if isinstance(exc, CorruptEntryError) else "unreadable"
                    on_skip(item.key, f"{kind}: {exc}")
                continue
            except Exception as exc:
                self._failed("head", exc)
                continue
            if info.key != item.key:
                if on_skip is not None:
                    on_skip(item.key, f"corrupt: holds key {info.key!r}")
                continue
            if purpose is not None and info.purpose != purpose:
                continue
            if module_id is not None and info.module_id != module_id:
                continue
            yield info

    def info(self, key: KeyLike) -> EntryInfo | None:
        """The metadata of one entry (never its value), or ``None`` when it is absent.

        Raises :class:`CorruptEntryError` when the entry's head does not decode
        or holds another key. The signature is not checked (see :meth:`decode`).
        """
        skey = str(key)
        stored = next((item for item in self._backend.scan(skey) if item.key == skey), None)
        try:
            info = read_info(self._backend, stored or StoredItem(skey, 0), self.limits)
        except KeyError:
            return None
        if info.key != skey:
            raise CorruptEntryError(f"entry stored under {skey!r} holds key {info.key!r}")
        return info

    # ------------------------------------------------------------------ bundles
    def dumps(
        self,
        runtime: str | None = None,
        purpose: str | None = None,
        module_id: str | None = None,
        keys: Iterable[KeyLike] | None = None,
        *,
        on_progress: OnProgress | None = None,
        on_skip: OnSkip | None = None,
    ) -> bytes:
        """Return a bundle of entries (all, or those matching the filters) as bytes.

        Entries keep their signatures; with a secret set, the bundle is signed
        too. An unfiltered dump clears :attr:`dirty`. Entries are read in
        batches of :data:`DUMP_BATCH`, after each of which ``on_progress(done,
        total)`` is told; corrupt or unreadable entries are left out and told
        to ``on_skip(key, reason)``.
        """
        generation = self._generation
        if keys is not None:
            wanted = [str(k) for k in keys]
        else:
            listed = self.entries(runtime, purpose, module_id, on_skip=on_skip)
            wanted = [info.key for info in listed]
        blobs: list[bytes] = []
        for start in range(0, len(wanted), DUMP_BATCH):
            batch = wanted[start : start + DUMP_BATCH]
            try:
                stored = self._backend.peek_many(batch)  # exporting is not a use
            except Exception as exc:
                self._failed("get_many", exc)
                stored = {}
            for skey in batch:
                blob = stored.get(skey)
                if blob is None:
                    continue
                try:
                    self.decode(skey, blob)
                except CorruptEntryError as exc:
                    if on_skip is not None:
                        on_skip(skey, f"corrupt: {exc}")
                    continue
                blobs.append(blob)
            if on_progress is not None:
                on_progress(start + len(batch), len(wanted))
        if keys is None and runtime is None and purpose is None and module_id is None:
            self._saved_generation = generation
        return encode_bundle(blobs, secret=self._secret)

    def loads(self, data: bytes, *, overwrite: bool = True) -> int:
        """Merge a bundle into the cache; return how many entries were accepted.

        The bundle must be well formed (else :class:`InvalidBundleError`); single
        entries that fail their checksum, signature, or whose key does not match
        their parts, are skipped and counted as corrupt or rejected.
        """
        blobs = decode_bundle(data, secret=self._secret, limits=self.limits)
        accepted, rejected, corrupt = screen_bundle(blobs, self._secret, self.limits)
        self._counters.add(rejected=rejected, corrupt=corrupt)
        if not overwrite and accepted:
            try:
                present = set(self._backend.peek_many(list(accepted)))  # a look, not a use
            except Exception as exc:
                self._failed("get_many", exc)
                present = set()
            accepted = {k: v for k, v in accepted.items() if k not in present}
        if not accepted or not self.enabled:
            return 0
        return len(accepted) if self._store(accepted) else 0
