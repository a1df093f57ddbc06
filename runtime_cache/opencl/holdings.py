"""Things held by name until they are let go of: build leases, program names.

A builder that hands a program to another thread or process holds something for
it (the fleet's lease in :mod:`.sharing`, the program's name in
:mod:`.worker_builds`) until the result is in; :class:`Holdings` keeps them, so
each is released once, and all of them after an error.
"""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar

__all__ = ["Holdings", "Releasable"]


class Releasable(Protocol):
    """Anything held that :meth:`release` lets go of."""

    def release(self) -> None: ...


R = TypeVar("R", bound=Releasable)


class Holdings(Generic[R]):
    """What is held, by name; thread-safe."""

    def __init__(self) -> None:
        self._held: dict[str, R] = {}
        self._lock = threading.Lock()

    def put(self, name: str, thing: R) -> None:
        """Keep ``thing``, held for ``name``."""
        with self._lock:
            self._held[name] = thing

    def pop(self, name: str) -> R | None:
        """Stop keeping what is held for ``name`` and return it, still held (or ``None``)."""
        with self._lock:
            return self._held.pop(name, None)

    def release(self, name: str) -> None:
        """Let go of what is held for ``name``, if anything."""
        thing = self.pop(name)
        if thing is not None:
            thing.release()

    def release_all(self) -> None:
        """Let go of everything still held (after an error)."""
        with self._lock:
            things, self._held = list(self._held.values()), {}
        for thing in things:
            thing.release()
