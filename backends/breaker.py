"""A small circuit breaker for backends that talk to a server.

While the server is down, paying a connect or read timeout on every call would
turn a cache outage into an application slowdown. The breaker remembers the
failure: for a back-off window every call fails fast with
:class:`~runtime_cache.errors.BackendUnavailableError`, without touching the
network. When the window ends, one call is let through as a probe. A probe that
fails doubles the window (up to a cap); one that succeeds closes the breaker.

It logs once per outage: a warning when it opens and an info line when it
closes, never once per call. A failure soon after recovering (within the last
window) is a relapse of the same outage, as when one node of a cluster is still
down: the window keeps growing and nothing new is logged.

Example::

    breaker = CircuitBreaker("redis://cache:6379/0")
    breaker.before_call()          # raises BackendUnavailableError while open
    try:
        reply = talk_to_server()
    except ConnectionError as exc:
        breaker.failure(exc)
        raise
    breaker.success()
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime_cache.errors import BackendUnavailableError
from runtime_cache.fork_locks import renew_in_child

__all__ = ["BreakerStats", "CircuitBreaker"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BreakerStats:
    """Counters of one breaker: how often it opened, probed and failed fast."""

    state: str
    opened: int
    probes: int
    fast_failures: int
    delay: float


class CircuitBreaker:
    """Fail fast while a server is known to be down; probe again after a growing back-off.

    Args:
        name: what the breaker guards, for log lines (e.g. a URL without password).
        backoff: the first window, in seconds, after a failure.
        max_backoff: the cap the window doubles up to while probes keep failing.
        clock: a monotonic clock (seconds); tests may pass their own.

    States: ``closed`` (calls go through), ``open`` (calls fail fast until the
    window ends), ``probing`` (one call is in flight to test the server; the
    others keep failing fast).
    """

    def __init__(
        self,
        name: str,
        *,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if backoff <= 0 or max_backoff < backoff:
            raise ValueError("need 0 < backoff <= max_backoff")
        self.name = name
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._clock = clock
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")
        self._state = "closed"
        self._delay = backoff
        self._retry_at = 0.0
        self._probe_thread: int | None = None
        self._opened = 0
        self._probes = 0
        self._fast_failures = 0
        self._last_error = ""
        self._calm_until = 0.0
        self._announced_close = False

    @property
    def state(self) -> str:
        """``"closed"``, ``"open"`` or ``"probing"``."""
        return self._state

    @property
    def is_open(self) -> bool:
        """Whether calls are being refused (open or probing)."""
        return self._state != "closed"

    def stats(self) -> BreakerStats:
        """A snapshot of the counters."""
        with self._lock:
            return BreakerStats(
                self._state, self._opened, self._probes, self._fast_failures, self._delay
            )

    def before_call(self) -> None:
        """Let a call through, or raise :class:`BackendUnavailableError` without I/O."""
        if self._state == "closed":
            return
        with self._lock:
            if self._state == "closed":
                return
            now = self._clock()
            if self._state == "probing" and self._probe_thread == threading.get_ident():
                return  # the probe itself may need several round trips
            if now >= self._retry_at:
                # A probe that never reported back (its thread died) is replaced
                # once its own window has passed.
                self._state = "probing"
                self._probe_thread = threading.get_ident()
                self._retry_at = now + self._delay
                self._probes += 1
                return
            self._fast_failures += 1
            wait = max(0.0, self._retry_at - now)
            error = self._last_error
        raise BackendUnavailableError(
            f"{self.name} is unavailable (circuit open, next probe in {wait:.2f}s; "
            f"last error: {error})"
        )

    def success(self) -> None:
        """Record a call that reached the server; closes the breaker if it was open."""
        if self._state == "closed":
            return
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
            self._probe_thread = None
            # Until a quiet window has passed, a new failure is a relapse of this
            # outage (e.g. one node of a cluster still down), not a new one.
            self._calm_until = self._clock() + self._delay
            announce, self._announced_close = not self._announced_close, True
        if announce:
            log.info("runtime-cache: %s is reachable again; circuit closed", self.name)
        else:
            log.debug("runtime-cache: %s answered again after a relapse", self.name)

    def now(self) -> float:
        """The breaker's clock; pass a reading taken before a call to :meth:`failure`."""
        return self._clock()

    def failure(self, exc: BaseException, started: float | None = None) -> None:
        """Record a failed call: open the breaker, or lengthen the window after a failed probe.

        ``started`` is :meth:`now` when the call began; a slow call that began soon
        after a recovery is then still seen as a relapse of the same outage.
        """
        with self._lock:
            now = self._clock()
            self._last_error = f"{type(exc).__name__}: {exc}"
            first = relapse = False
            if self._state == "closed":
                relapse = min(now, now if started is None else started) < self._calm_until
                if relapse:
                    self._delay = min(self._delay * 2, self.max_backoff)
                else:
                    self._delay = self.backoff
                    self._opened += 1
                    self._announced_close = False
                    first = True
            elif self._state == "probing":
                self._delay = min(self._delay * 2, self.max_backoff)
            self._state = "open"
            self._probe_thread = None
            self._retry_at = now + self._delay
        if first:
            log.warning(
                "runtime-cache: %s is unavailable (%s); failing fast, probing again every "
                "%.2f-%.0fs",
                self.name,
                self._last_error,
                self.backoff,
                self.max_backoff,
            )
        elif relapse:
            log.debug("runtime-cache: %s failed again soon after recovering", self.name)

    def reset(self) -> None:
        """Close the breaker and forget its history (e.g. in a forked child)."""
        with self._lock:
            self._state = "closed"
            self._delay = self.backoff
            self._retry_at = 0.0
            self._calm_until = 0.0
            self._probe_thread = None

    def __repr__(self) -> str:
        return f"<CircuitBreaker {self.name} {self._state}>"
