"""Vettings in progress, shared between threads: eight threads asking for one unknown
program start one vetting child, not eight, and the others wait for its word.

A vetting is named by its binaries' marks (each binary under its key, see
:func:`~runtime_cache.opencl.guard.bindings`). :meth:`Flights.claim` splits the
programs a thread must vet into those it vets itself and those another thread is
vetting already; :meth:`Flights.release` publishes the outcomes to the waiters.
"""

from __future__ import annotations

import os
import threading
from typing import Generic, TypeVar

__all__ = ["Entry", "Flight", "Flights", "Pending"]

T = TypeVar("T")

#: A program to vet: its index among the items, its binaries' digests, and their marks.
Entry = tuple[int, list[str], list[str]]
Pending = list[Entry]


class Flight(Generic[T]):
    """One vetting of a set of binaries in progress, for other threads that need it too."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.outcome: T | None = None


class Flights(Generic[T]):
    """The vettings in progress in this process, by their binaries' marks."""

    def __init__(self) -> None:
        self._flights: dict[tuple[str, ...], Flight[T]] = {}
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        # In a forked child: none of the parent's vetting threads, and a lock of its own
        # (another thread may have held the parent's at the fork).
        self._flights = {}
        self._lock = threading.Lock()

    def claim(self, pending: Pending) -> tuple[Pending, list[tuple[Entry, Flight[T]]]]:
        """Split ``pending`` into the programs this thread vets and those another thread
        is vetting already, each with the flight to wait on."""
        mine: Pending = []
        waits: list[tuple[Entry, Flight[T]]] = []
        with self._lock:
            for entry in pending:
                name = tuple(entry[2])
                flight = self._flights.get(name)
                if flight is None:
                    self._flights[name] = Flight()
                    mine.append(entry)
                else:
                    waits.append((entry, flight))
        return mine, waits

    def release(self, mine: Pending, results: list[T] | None, failed: T) -> None:
        """Publish the outcomes of the programs this thread claimed (``results`` in the
        order of ``mine``; ``None`` when it failed: the waiters then see ``failed``)."""
        with self._lock:
            for position, (_, _, marks) in enumerate(mine):
                flight = self._flights.pop(tuple(marks), None)
                if flight is not None:
                    flight.outcome = results[position] if results is not None else failed
                    flight.done.set()
