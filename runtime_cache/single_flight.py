"""Single-flight within one process: one build per key at a time, shared by every thread.

The first thread to ask for a key leads: it looks the key up and builds on a
miss. Threads that ask meanwhile wait for the leader and share its value, or
its exception. Across processes, :mod:`runtime_cache.fleet` does the same job
with the backend's leases.

>>> flights = SingleFlight()
>>> flight, leader = flights.join("k")
>>> leader
True
>>> flights.finish("k", flight, value=b"v")
>>> flight.wait()
b'v'
"""

from __future__ import annotations

import threading

from .fork_locks import renew_in_child

__all__ = ["Flight", "SingleFlight"]


class Flight:
    """One build in progress: followers wait on it for the value or the error."""

    __slots__ = ("error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: bytes | None = None
        self.error: BaseException | None = None

    def wait(self) -> bytes:
        """Wait for the leader; return its value or raise its exception."""
        self.event.wait()
        if self.error is not None:
            raise self.error
        assert self.value is not None
        return self.value


class SingleFlight:
    """The builds in progress in this process, by key."""

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self._lock = threading.Lock()
        renew_in_child(self, "_lock", "_flights")  # (a forked child leads its own builds)

    def __len__(self) -> int:
        """How many builds are in flight now."""
        with self._lock:
            return len(self._flights)

    def join(self, key: str) -> tuple[Flight, bool]:
        """The flight for ``key`` and whether the caller leads it (and must :meth:`finish` it)."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None:
                return flight, False
            flight = self._flights[key] = Flight()
            return flight, True

    def finish(
        self,
        key: str,
        flight: Flight,
        *,
        value: bytes | None = None,
        error: BaseException | None = None,
    ) -> None:
        """End the leader's flight with its value or error, waking every follower."""
        flight.value, flight.error = value, error
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
        flight.event.set()
