"""Build once, store, serve: :meth:`Builds.get_or_build`, the front's call that consumers make.

:class:`Builds` gives :class:`~runtime_cache.cache.Cache` this method. Within a process one
build runs per key at a time (:mod:`.single_flight`); across processes, one process builds
under a lease while the others wait for its entry (:mod:`.fleet`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from .api import SPAN_HEAD, Backend
from .codec import Entry
from .errors import RejectedEntryError
from .fleet import Fleet
from .inventory import KeyLike
from .keys import CacheKey
from .refused_heads import RefusedHeads
from .single_flight import SingleFlight
from .stats import CacheStats, Counters

__all__ = ["Builds"]


class _Host(Protocol):
    """What :class:`Builds` uses of the cache it belongs to."""

    enabled: bool
    fleet: Fleet
    _backend: Backend
    _counters: Counters[CacheStats]
    _flights: SingleFlight
    _heads: RefusedHeads

    def get(self, key: KeyLike) -> bytes | None: ...
    def _read_parts(self, skey: str) -> tuple[bytes, ...] | None: ...
    def put(
        self,
        key: CacheKey,
        value: bytes,
        build_seconds: float = 0.0,
        *,
        extra: Mapping[str, Any] | None = None,
    ) -> bool: ...
    def decode(self, skey: str, blob: bytes) -> Entry: ...
    def refused(self, key: KeyLike) -> bool: ...


class Builds:
    """The build method of :class:`~runtime_cache.cache.Cache`."""

    def get_or_build(
        self: _Host,
        key: CacheKey,
        build: Callable[[], bytes],
        *,
        extra: Mapping[str, Any] | None = None,
        after_miss: bool = False,
    ) -> bytes:
        """Return the cached value for ``key``, or call ``build()`` and store its result.

        Within one process only one ``build()`` runs per key at a time: other
        threads asking for the same key wait and share its result (or its
        exception). Across processes, where the backend offers leases
        (``dir://``, ``redis://``), one process builds while the others wait
        for its entry, up to a deadline (see :mod:`runtime_cache.fleet`).

        ``after_miss``: the caller's own read of ``key`` just before counted a miss
        (nothing there it could use); this call counts as that lookup, not as another.
        """
        skey = str(key)
        flight, leader = self._flights.join(skey)
        if not leader:
            value = flight.wait()
            # Served without a build of its own: a hit, so every lookup is a hit or a miss.
            self._counters.add(hits=1)
            if after_miss:
                self._counters.take_back(misses=1)
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

        refused_heads: dict[bytes, None] = {}  # the first bytes of the last blobs refused

        def fetch() -> bytes | None:
            # Another process's entry, read after this call's miss: that miss becomes a hit
            # (one lookup, one count). A blob that fails its check was counted at the miss;
            # one refused by its head is not read whole again (see .refused_heads). Nor is
            # one this wait refused whole, while its first bytes are still there: a store
            # that reads values whole (Redis) read a planted 64 MiB value on every poll
            # (its head holds its metadata, the value's checksum among them).
            blob = None
            try:
                if refused_heads and self._backend.head(skey, SPAN_HEAD) in refused_heads:
                    return None
                pieces = self._read_parts(skey)
                if pieces is None or self._heads.kept_head(pieces) is not None:
                    return None
                blob = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                entry = self.decode(skey, blob)
            except Exception as exc:
                if blob is not None:
                    if len(refused_heads) >= 64:  # the oldest goes
                        del refused_heads[next(iter(refused_heads))]
                    refused_heads[bytes(blob[:SPAN_HEAD])] = None
                    if isinstance(exc, RejectedEntryError):
                        self._heads.remember(skey, blob)
                return None
            if blob is None or entry is None:
                return None
            self._counters.add(hits=1, bytes_read=len(blob), seconds_saved=entry.build_seconds)
            self._counters.take_back(misses=1)  # (none below zero: a reset between)
            return entry.value

        try:
            if after_miss:  # this read repeats the caller's: its miss (and any entry it
                # refuses again) counted there; a hit stands for that miss
                with self._counters.muted("misses", "rejected", "corrupt"):
                    found = self.get(key)
                if found is not None:
                    self._counters.take_back(misses=1)
            else:
                found = self.get(key)
            if found is not None:
                value = found
            elif self.enabled:
                refused = partial(self.refused, skey)
                value = self.fleet.build_once(self._backend, key, fetch, build_and_store, refused)
            else:
                value = build_and_store()
        except BaseException as exc:
            self._flights.finish(skey, flight, error=exc)
            raise
        self._flights.finish(skey, flight, value=value)
        return value
