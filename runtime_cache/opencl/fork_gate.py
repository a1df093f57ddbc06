"""Holds ``fork()`` and the interpreter's exit back while a background thread is inside
the cache or the driver.

A forked child has only the thread that forked. A lock another thread held at the fork
(a module's plan lock while it reads ``#include`` files, the cache's, the backend's, the
driver's own while it loads a program) stays locked in the child for ever. The read-ahead
thread (:mod:`.prefetch`) enters :meth:`ForkGate.reading` around each chunk's read and
each load, and ``fork()`` waits for those to end. At the exit, :meth:`ForkGate.close`
waits for them too: the driver's own exit handlers must not run while a thread is still
inside a load.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

from ..fork_holds import ForkHold

__all__ = ["FORK_WAIT", "ForkGate", "GateClosed", "close_at_exit", "gate"]

#: Seconds a ``fork()`` waits for reads and loads in progress on other threads.
FORK_WAIT = 10.0


class GateClosed(RuntimeError):
    """A load asked to begin after the exit's :meth:`ForkGate.close`."""


class ForkGate(ForkHold):
    """Holds ``fork()`` back while a read-ahead thread is inside the cache.

    A child has only the thread that forked; a lock that a reading thread held at the fork
    (a module's plan lock while it reads ``#include`` files, the cache's, the backend's)
    would stay locked there for ever. So ``fork()`` waits until no other thread is in
    :meth:`reading` (a chunk's read), at most :data:`FORK_WAIT` seconds, and no thread
    enters one until it is done. A fork from inside a read (a backend that forks) does
    not wait for itself.
    """

    def __init__(self) -> None:
        self._cond: threading.Condition
        self._inside: dict[int, int]  # reads and loads in progress, per thread
        self._loads: dict[int, int]  # of those, loads
        self._forking: bool
        self._reset()

    def _reset(self) -> None:
        # A new lock (in a child, the parent's is held through the fork), no reads going on.
        self._cond = threading.Condition(threading.Lock())
        self._inside = {}
        self._loads = {}
        self._forking = False
        self._closed = False  # at the exit: no load begins

    @contextlib.contextmanager
    def reading(self, *, load: bool = False) -> Iterator[None]:
        """The span of one chunk's read, or (``load``) of one load into the driver, on a
        read-ahead thread. A load after :meth:`close` raises :class:`GateClosed`."""
        me = threading.get_ident()
        with self._cond:
            while self._forking:
                self._cond.wait()
            if load and self._closed:
                raise GateClosed("the interpreter is exiting")
            self._inside[me] = self._inside.get(me, 0) + 1
            if load:
                self._loads[me] = self._loads.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                for spans in (self._inside, self._loads) if load else (self._inside,):
                    spans[me] -= 1
                    if not spans[me]:
                        del spans[me]
                self._cond.notify_all()

    def close(self, timeout: float = FORK_WAIT) -> None:
        """Wait (at most ``timeout`` seconds) for other threads' loads in progress, and
        let none begin after (reads go on): called at the interpreter's exit."""
        me = threading.get_ident()
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closed = True
            while any(who != me for who in self._loads):
                left = deadline - time.monotonic()
                if left <= 0:  # a load that hangs: exit anyway
                    break
                self._cond.wait(left)

    def in_flight_at_fork(self) -> bool:
        """Whether another thread is inside a read or a load (a fork from inside one does
        not wait for itself)."""
        me = threading.get_ident()
        return any(who != me for who in self._inside)

    def before_fork(self) -> None:
        """Wait (at most :data:`FORK_WAIT` seconds: a read that hangs on a dead network
        file system does not stop the fork) for other threads' reads in progress; hold the
        gate shut through the fork."""
        self.hold_for_fork(time.monotonic() + FORK_WAIT)

    def after_fork_in_parent(self) -> None:
        """Open the gate again."""
        self.release_after_fork()

    def after_fork_in_child(self) -> None:
        """A fresh gate: the child has none of the parent's reading threads."""
        self._reset()


gate = ForkGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=gate.before_fork,
        after_in_parent=gate.after_fork_in_parent,
        after_in_child=gate.after_fork_in_child,
    )

_closes: set[int] = set()  # the processes (pids) whose exit closes the gate


def close_at_exit() -> None:
    """Have the exit wait for a load on a read-ahead thread to end (:meth:`ForkGate.close`).
    Called when a thread that loads starts: registered after the package's own exit
    handlers, it runs before them. A ``multiprocessing`` child ends with ``os._exit``,
    which runs no exit handler, so there it is one of ``multiprocessing``'s finalizers."""
    pid = os.getpid()
    if pid in _closes:
        return
    _closes.add(pid)
    atexit.register(gate.close)
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        util.Finalize(None, gate.close, exitpriority=100)
