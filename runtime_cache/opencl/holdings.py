"""Things held by name until they are let go of: build leases, program names.

A builder that hands a program to another thread or process holds something for
it (the fleet's lease in :mod:`.sharing`, the program's name in
:mod:`.worker_builds`) until the result is in; :class:`Holdings` keeps them, so
each is released once, and all of them after an error. A program's name is held
by a :class:`NameLock`, which says when it is let go of.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Holdings", "NameLock", "Releasable"]


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


class NameLock:
    """The lock a program's name is held by while it is loaded or built; a plain lock,
    which calls ``let_go(name)`` each time it is released (on the releasing thread).
    ``let_go`` is a bound method of the lock's owner, held weakly: the owner's locks
    keep it from no collection."""

    __slots__ = ("_let_go", "_lock", "_name")

    def __init__(self, name: str, let_go: Callable[[str], None]) -> None:
        self._lock = threading.Lock()
        self._name = name
        self._let_go = weakref.WeakMethod(let_go)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock, as :meth:`threading.Lock.acquire`."""
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        """Let go of it (any thread may), then call ``let_go``."""
        self._lock.release()
        let_go = self._let_go()
        if let_go is not None:
            let_go(self._name)

    def locked(self) -> bool:
        """Whether some thread holds it."""
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
