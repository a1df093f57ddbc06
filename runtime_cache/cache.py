"""The front: :class:`Cache` encodes, checks and signs entries over any backend.

The front is pure and in memory; all I/O happens in the backend it wraps. A
backend failure is logged once per outage, counted, and treated as a miss or a
skipped store, unless ``strict=True`` (:mod:`.failure_policy`). Every blob read
passes :func:`runtime_cache.check.check_entry` (or its quick form for the cache's own
entries, :mod:`.own_entries`): a corrupt entry is counted, removed (only those bytes) and
treated as a miss, so the caller rebuilds it; one not the entry its key names is a
``rejected`` miss. A value read again by a cache that checked its entry is checked
against the header it checked then (:meth:`~runtime_cache.api.Backend.get_range`).

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
from collections.abc import Mapping
from typing import Any

from ._version import __version__
from .api import Backend, reads_ranges
from .batch_reads import BatchReads, read_again
from .builds import Builds
from .check import Checked, check_entry, refused_head, screen
from .codec import DEFAULT_LIMITS, Entry, Limits, Secret, normalize_secret
from .failure_policy import FailurePolicy
from .fleet import Fleet
from .fork_locks import renew_in_child
from .inventory import Inventory, KeyLike, key_text
from .keys import CacheKey
from .null import NullBackend
from .own_entries import OwnEntries
from .refusals import Refusals
from .refused_heads import RefusedHeads, cuts_heads
from .removals import Removals
from .signing import SecretKeys
from .single_flight import SingleFlight
from .stats import CacheStats, Counters
from .trust import entrust, require_secret
from .writes import Writes

__all__ = ["Cache", "KeyLike"]

log = logging.getLogger(__name__)


class Cache(Inventory, BatchReads, Builds, Removals, Writes):
    """A cache of key/value blobs with metadata, over a pluggable :class:`Backend`.

    Args:
        backend: where the bytes live; ``None`` makes a disabled cache that
            never hits and never stores.
        strict: raise backend errors instead of counting them as misses.
        secret: a shared secret; entries written are signed with HMAC-SHA256,
            and entries without a valid signature are rejected. A list
            ``[new, old]`` signs with the first and accepts any (key rotation).
            Required over a shared store (see :mod:`runtime_cache.trust`).
        producer: a label stored with each entry (defaults to this library's
            name and version).
        limits: decode limits for entries and bundles.
        insecure: use a shared store without a secret, on purpose (logs one warning).

    Listing and bundles (:meth:`entries`, :meth:`info`, :meth:`dumps`,
    :meth:`loads`) come from :class:`~runtime_cache.inventory.Inventory`, and
    :meth:`get_many` and :meth:`get_many_views` from
    :class:`~runtime_cache.batch_reads.BatchReads`, :meth:`get_or_build` from
    :class:`~runtime_cache.builds.Builds`, and :meth:`delete`, :meth:`delete_if_holds` and
    :meth:`delete_if_unchanged` from :class:`~runtime_cache.removals.Removals`, and
    :meth:`refused` from :class:`~runtime_cache.writes.Writes`.

    Raises :class:`~runtime_cache.errors.InsecureStoreError` for a shared store
    without a secret, and :class:`~runtime_cache.errors.InvalidSecretError` for an
    empty or blank secret.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        strict: bool = False,
        secret: Secret = None,
        producer: str | None = None,
        limits: Limits = DEFAULT_LIMITS,
        insecure: bool = False,
    ) -> None:
        if backend is not None and not isinstance(backend, Backend):
            hint = " (open it with runtime_cache.open_backend(url))" * isinstance(backend, str)
            raise TypeError(f"a Cache needs a Backend, not {type(backend).__name__}{hint}")
        self.enabled = backend is not None
        self._backend: Backend = backend if backend is not None else NullBackend()
        self._secret = normalize_secret(secret)
        require_secret(self._backend, self._secret is not None, insecure)
        self._promotion_check = entrust(self._backend, self._secret, limits)  # (held weakly)
        self._policy = FailurePolicy(
            log, repr(self._backend), "carrying on without the cache", strict=strict
        )
        self.producer = producer or f"runtime-cache {__version__}"
        #: Heads refused unread, and the span the store's reads take (see .refused_heads).
        self._heads = RefusedHeads(self._secret is not None, limits, cuts_heads(self._backend))
        self._counters = Counters()
        self._flights = SingleFlight()
        self._own = OwnEntries()
        #: The backend's read of a value alone, where it has one (see Backend.get_range).
        self._ranges = self._backend.get_range if reads_ranges(self._backend) else None
        #: The backend's own attributes: a ``get_parts`` set there takes every read.
        self._patched: Mapping[str, object] = getattr(self._backend, "__dict__", {})
        self._refusals = Refusals()
        #: Build leases across processes: policy, expected build times (see :mod:`.fleet`).
        self.fleet = Fleet(self._counters)
        self._state_lock = threading.Lock()
        renew_in_child(self, "_state_lock")
        self._generation = 0
        self._saved_generation = 0

    @property
    def backend(self) -> Backend:
        """The backend this cache stores into."""
        return self._backend

    @property
    def limits(self) -> Limits:
        """The limits entries are checked against (see :class:`~runtime_cache.codec.Limits`)."""
        return self._heads.limits

    @limits.setter
    def limits(self, value: Limits) -> None:
        self._heads.limits = value

    @property
    def strict(self) -> bool:
        """Whether backend errors raise instead of counting as misses."""
        return self._policy.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self._policy.strict = value

    @property
    def signed(self) -> bool:
        """Whether a secret is set (entries are signed and verified)."""
        return self._secret is not None

    def secret_keys(self) -> SecretKeys | None:
        """The secret's keys (the first signs), or ``None``: for a child process that
        stores into this cache on its behalf. Hand them over a pipe, never on a
        command line or in a log."""
        return self._secret

    @property
    def generation(self) -> int:
        """A counter that grows with every store, delete or accepted bundle."""
        return self._generation

    @property
    def dirty(self) -> bool:
        """Whether anything changed since the last unfiltered :meth:`dumps` (an app that
        keeps the bytes itself saves only when this is true)."""
        return self._generation != self._saved_generation

    def stats(self) -> CacheStats:
        """A snapshot of this cache's counters in this process."""
        return self._counters.snapshot()

    @property
    def last_error(self) -> str | None:
        """The latest backend failure this cache counted in ``stats().errors``, as
        ``"op: Type: message"`` (``None`` before any): why a store or read did not happen."""
        return self._policy.last_error

    def reset_stats(self) -> None:
        """Set every counter back to zero (and forget :attr:`last_error`)."""
        self._counters.reset()
        self._policy.last_error = None

    def close(self) -> None:
        """Close the backend."""
        self._backend.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "" if self.enabled else " disabled"
        return f"<Cache{state} backend={self._backend!r}>"

    def _failed(self, op: str, exc: Exception) -> None:
        self._counters.add(errors=1)
        self._policy.note(op, exc)  # (before failed(), which re-raises when strict)
        self._policy.failed(op, exc)

    def _succeeded(self, side: str = "read") -> None:
        self._policy.succeeded(side)

    def _bump(self) -> None:
        with self._state_lock:
            self._generation += 1

    def decode(self, skey: str, blob: bytes) -> Entry:
        """Check ``blob`` stored under ``skey`` with this cache's secret and limits.

        This is :func:`runtime_cache.check.check_entry`. Raises
        :class:`CorruptEntryError` (or a subclass: see :mod:`runtime_cache.check`)
        when it is malformed, unsigned while a secret is set, or not the entry
        of ``skey``.
        """
        return self.check(skey, blob).entry()

    def check(self, skey: str | None, blob: bytes | memoryview) -> Checked:
        """:func:`runtime_cache.check.check_entry` with this cache's secret and limits
        (``skey`` is ``None`` for an entry out of a bundle: it has no storage key)."""
        return check_entry(skey, blob, secret=self._secret, limits=self.limits)

    def get_entry(self, key: KeyLike) -> Entry | None:
        """Return the whole entry (value and metadata) for ``key``, or ``None``."""
        checked = self._read(key)
        return None if checked is None else checked.entry()

    def took_back(self, key: KeyLike, value: bytes, corrupt: bool = True) -> None:
        """Count a hit of ``key`` whose ``value`` its caller could not use (a record that does
        not decode; ``corrupt=False``: one over the caller's own limit) as a miss: the hit,
        and the build time it counted as saved (read again from the entry, uncounted), taken
        back; ``corrupt`` counted where it is bad. For the rare path: it reads the entry."""
        skey, saved = key_text(key), 0.0
        try:
            blob = self._backend.peek(skey)
            entry = None if blob is None else self.decode(skey, blob)
            saved = entry.build_seconds if entry is not None and entry.value == value else 0.0
        except Exception:  # (gone, or bad by now: nothing more to take back)
            pass
        self._counters.add(misses=1, corrupt=int(corrupt))
        self._counters.take_back(hits=1, seconds_saved=saved)

    def _fetch(self, skey: str, count_use: bool = True) -> tuple[bytes, ...] | None:
        # One read, in pieces where the backend can (the value then needs no copy);
        # a failure or no entry counts as a miss. Not ``count_use``: a use was counted.
        try:
            if count_use:
                pieces = self._read_parts(skey)
            else:
                blob = self._backend.peek(skey)
                pieces = None if blob is None else (blob,)
        except Exception as exc:
            self._counters.add(misses=1)
            self._failed("get", exc)
            return None
        if self._policy.failing_sides:  # (a call saved on every hit)
            self._policy.succeeded()
        if pieces is None:
            self._counters.add(misses=1)
        return pieces

    def _read_parts(self, skey: str) -> tuple[bytes, ...] | None:
        # One read through this cache's span (a use counted); a head the store cut for a
        # key it was not refused under is read whole for this one (see .refused_heads).
        pieces = self._backend.get_parts(skey, self._heads.span)
        if pieces and len(pieces) == 2 and self._heads.whole_again(skey, pieces):
            blob = self._backend.peek(skey)
            pieces = None if blob is None else (blob,)
        return pieces

    def _read(self, key: KeyLike) -> Checked | None:
        skey = key_text(key)
        pieces = self._fetch(skey)
        return None if pieces is None else self._screen(key, skey, pieces)

    def _screen(
        self, key: KeyLike, skey: str, pieces: tuple[bytes, ...], again: bool = True
    ) -> Checked | None:
        # Through the one check; counts the hit or the miss. A corrupt entry (once removed)
        # or a rejected one is read ``again``: a tier below may hold a good copy (see
        # batch_reads). The head alone of an entry refused by it (see .refused_heads) is
        # counted unchecked, as the entry's check would count it.
        checked: Checked | str | None = None
        if len(pieces) == 2:  # (only a head cut alone is two pieces)
            checked = refused_head(skey, pieces, self._heads.kept_head)
        if checked is None:
            asked = key if isinstance(key, CacheKey) else None
            refused = self._heads.remember
            checked = screen(skey, pieces, self._secret, self.limits, asked, self._discard, refused)
        if (checked == "corrupt" or checked == "rejected") and again:
            self._counters.add(**{checked: 1})
            past = {skey: b"".join(pieces)}
            retry = read_again(self._backend, past, self._heads).get(skey)
            if retry is not None:
                return self._screen(key, skey, (retry,), again=False)
            self._counters.add(misses=1)
            return None
        if isinstance(checked, str):
            counts = {"misses": 1} if checked == "misses" else {"misses": 1, checked: 1}
            self._counters.add(**counts)
            return None
        self._counters.hit(sum(map(len, pieces)), checked.meta["b"])
        return checked

    def _discard(self, skey: str, blob: bytes) -> None:
        # Best effort, the read being a miss either way: never raised, even when strict (a
        # strict get of a corrupt entry with Redis down raised; get_or_build never built).
        try:
            self._backend.delete_if(skey, blob)  # only the bytes judged bad
        except Exception as exc:
            if self._policy.strict:
                self._counters.add(errors=1)
                self._policy.note("delete", exc)
                log.debug("runtime-cache: could not remove the bad entry %s: %s", skey, exc)
            else:
                self._failed("delete", exc)

    def get(self, key: KeyLike) -> bytes | None:
        """Return the value stored for ``key``, or ``None`` on a miss."""
        skey = str(key) if type(key) is CacheKey else key_text(key)
        unread = True
        if type(key) is CacheKey and self._ranges is not None and "get_parts" not in self._patched:
            # An entry checked or written here before: its value alone, against the header
            # remembered for it (own_entries); else, or when that fails, read whole below.
            own = self._own.read_known(
                skey, key.packed_parts, self.producer, self.limits, self._secret, self._ranges
            )
            if type(own) is tuple:
                if self._policy.failing_sides:
                    self._policy.succeeded()
                self._counters.hit(own[2], own[1])
                return own[0]
            unread = own is True
        pieces = self._fetch(skey, unread)
        if pieces is None:
            return None
        if type(key) is CacheKey:
            # An entry as this cache writes it passes the check's quick form (own_entries).
            found = self._own.match(key, skey, pieces, self._secret, self.producer, self.limits)
            if found is not None:
                value, saved, size = found
                self._counters.hit(size, saved)
                return value if type(value) is bytes else bytes(value)
        checked = self._screen(key, skey, pieces)
        if checked is None:
            return None
        view = checked.value
        whole = view.obj  # a value read as a bytes of its own is returned as it is
        return whole if type(whole) is bytes and len(whole) == len(view) else bytes(view)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (CacheKey, str)) and self._read(key) is not None

    def _encode(
        self, key: CacheKey, value: bytes, build_seconds: float, extra: Mapping[str, Any] | None
    ) -> bytes:
        now = time.time()
        return self._own.encode(key, value, now, build_seconds, extra, self.producer, self._secret)

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
