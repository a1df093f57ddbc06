"""A fleet's cold start builds each entry once: build leases across processes and machines.

On a miss, :meth:`Fleet.build_once` asks the backend for a lease on the key
(:meth:`runtime_cache.api.Backend.lease`; backends without leases build at
once, as before). The process that takes the lease builds and stores, then
releases it. The others wait for the entry, polling with backoff (20 ms
growing to 0.5 s; a poll reads only the entry's first byte). They build it
themselves when:

* the lease comes free without an entry (the holder died, or its build
  failed): a *takeover*. A killed holder frees a ``dir://`` lease at once and
  a ``redis://`` lease after at most ``LeasePolicy.ttl`` seconds;
* or the wait passes its deadline (the holder hangs or is too slow), also
  counted as a takeover.

The deadline is ``factor * expected + slack`` seconds, at most ``max_wait``.
``expected`` is the longest build this process has seen for the same
runtime, purpose and module (:meth:`Fleet.record`), or ``default_expected``
before any. So no process waits forever, and none fails because a lease
holder died: at worst an entry is built twice.

An entry the shared store refuses for its size (over its cap) never lands. Its
builder notes so beside the lease (:meth:`~runtime_cache.lease.Lease.note_unstored`,
for ``LeasePolicy.unstored_note`` seconds) before it releases it; a process that
then takes the lease and finds the note lets it go at once and builds, so the
waiters build side by side rather than one after another (docs/shared-cache.md).
A write that failed otherwise is not noted: the next taker's may land.

The fleet does no I/O itself: leases and reads go through the backend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .api import Backend, Lease
from .errors import ReadOnlyBackendError
from .fork_locks import renew_in_child
from .keys import CacheKey
from .stats import CacheStats, Counters

__all__ = ["Fleet", "LeasePolicy", "present"]

log = logging.getLogger(__name__)
_lease_failed = threading.Event()  # a lease failure has been logged in this process


@dataclass(frozen=True)
class LeasePolicy:
    """How long leases live and how long waiters wait (seconds)."""

    #: A holder renews every ttl/3; a holder that stopped renewing loses the lease after ttl.
    ttl: float = 15.0
    #: The expected build time before this process has seen one of the same kind.
    default_expected: float = 30.0
    factor: float = 3.0
    slack: float = 2.0
    max_wait: float = 900.0
    first_poll: float = 0.02
    max_poll: float = 0.5
    #: Seconds a builder's note that the store refused its entry holds: takers in
    #: that time build at once, side by side, instead of waiting on each other's builds.
    unstored_note: float = 60.0

    def deadline(self, expected: float) -> float:
        """How long to wait for a holder whose build is expected to take ``expected`` s."""
        return min(self.max_wait, self.factor * max(0.0, expected) + self.slack)


def _group(key: CacheKey | str) -> tuple[str, ...]:
    if isinstance(key, CacheKey):
        return (key.runtime, key.purpose, key.module_id)
    return tuple(str(key).split("/")[:2])


def present(backend: Backend, keys: Iterable[str]) -> bool:
    """Whether every key has a stored value (reads one byte of each; failures say no)."""
    try:
        return all(backend.head(k, 1) is not None for k in keys)
    except Exception:
        return False


def try_acquire(lease: Lease) -> bool | None:
    """Try to take ``lease`` once: taken, not taken, or ``None`` when the backend failed.

    On a failure the caller builds without a lease: waiting on a store that
    cannot answer would only delay the build.
    """
    try:
        return lease.acquire()
    except Exception as exc:
        # Said once per process: every later build goes on without a lease the same way.
        # A read-only store says so itself (its writes are skipped, nothing is shared).
        if isinstance(exc, ReadOnlyBackendError):
            log.debug("runtime-cache: no build lease on a read-only store (%s)", exc)
        elif not _lease_failed.is_set():
            _lease_failed.set()
            log.warning(
                "runtime-cache: cannot take a build lease (%s); building without one, so "
                "other processes may build the same programs",
                exc,
            )
        return None


class Fleet:
    """Build leases for one :class:`~runtime_cache.Cache`: policy, expected times, counters.

    ``counters`` are the cache's own, so ``stats()`` reports ``leases_won``,
    ``lease_waits``, ``wait_seconds`` and ``takeovers``.
    """

    def __init__(self, counters: Counters[CacheStats], policy: LeasePolicy | None = None) -> None:
        self.policy = policy or LeasePolicy()
        self._counters = counters
        self._times: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")
        self._local_leases = False

    def count(self, **amounts: float) -> None:
        """Add to the cache's fleet counters (``leases_won=1``, ``wait_seconds=0.2``...)."""
        self._counters.add(**amounts)

    def record(self, key: CacheKey | str, seconds: float) -> None:
        """Note that a build like ``key``'s (same runtime, purpose, module) took ``seconds``."""
        if self._local_leases:
            return  # no other process waits on this cache's builds
        group = _group(key)
        with self._lock:
            self._times[group] = max(self._times.get(group, 0.0), seconds)

    def expected(self, key: CacheKey | str) -> float:
        """The longest build seen like ``key``'s, or the policy's default."""
        with self._lock:
            return self._times.get(_group(key), self.policy.default_expected)

    def lease(self, backend: Backend, key: str) -> Lease | None:
        """The backend's lease on ``key``, or ``None`` (no leases, or the backend failed)."""
        try:
            return backend.lease(key, self.policy.ttl)
        except Exception:
            return None

    def build_once(
        self,
        backend: Backend,
        key: CacheKey,
        fetch: Callable[[], bytes | None],
        build: Callable[[], bytes],
        refused: Callable[[], bool] | None = None,
    ) -> bytes:
        """Return ``fetch()`` once someone stored the entry, else ``build()`` (which stores it).

        ``build()`` runs here only while this process holds the key's lease, or
        once the lease came free without an entry, or after the deadline, or after
        an earlier holder noted that the store refuses the entry. ``refused()``, asked
        after a build under the lease, says whether the store refused its value for
        its size: then the lease is noted so before it is released.
        """
        skey = str(key)
        if self._local_leases:
            return build()
        lease = self.lease(backend, skey)
        if lease is None or lease.local:
            # Threads of one process already share builds through single-flight.
            self._local_leases = lease is not None
            return build()
        won = try_acquire(lease)
        if won is None:
            return build()
        if won:
            with lease:
                # The holder before us may have stored and released since our miss: a
                # lease taken to load is not counted as won (``leases_won`` counts builds).
                value = fetch() if present(backend, [skey]) else None
                if value is not None:
                    return value
                self.count(leases_won=1)
                return self._build(lease, build, refused)
        self.count(lease_waits=1)
        started = time.monotonic()
        deadline = started + self.policy.deadline(self.expected(key))
        pause = self.policy.first_poll
        try:
            while won is False and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 1.5, self.policy.max_poll)
                if present(backend, [skey]):
                    value = fetch()
                    if value is not None:
                        return value
                won = try_acquire(lease)
        finally:
            self.count(wait_seconds=time.monotonic() - started)
        with lease:  # a no-op when the wait ended without the lease
            value = fetch() if won and present(backend, [skey]) else None
            if value is not None:
                return value
            self.count(takeovers=1)
            return self._build(lease, build, refused)

    def _build(
        self, lease: Lease, build: Callable[[], bytes], refused: Callable[[], bool] | None
    ) -> bytes:
        # Build under ``lease`` when it is held (after a deadline it is not).
        if lease.held and lease.unstored():
            # The store refused an earlier holder's entry: holding the lease through this
            # build would only make the next waiter wait for it. Let it in now.
            lease.release()
            self.count(unshared_builds=1)
        value = build()
        if lease.held and ((refused is not None and refused()) or lease.refused()):
            lease.note_unstored(self.policy.unstored_note)
        return value
