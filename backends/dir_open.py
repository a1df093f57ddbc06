"""The ``dir://`` backends open in this process: their hits are flushed at exit, and a
forked child reopens their roots.

:class:`~runtime_cache.backends.directory.DirectoryBackend` registers itself with
:func:`track` when it opens; the set holds it weakly, so a backend that is no longer
used is not kept alive by it.

"At exit" is :func:`runtime_cache.process_exit.at_exit`'s: a ``multiprocessing`` child
started by ``fork`` or ``forkserver`` (a ``Pool`` worker) ends with ``os._exit`` and runs
no ``atexit`` handler, and its hits, fewer than a batch, were lost. Its finalizers are
registered in the child itself, so :func:`flush_at_exit` is called where hits are
counted (a batch's first).
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol

from runtime_cache.process_exit import at_exit

__all__ = ["EXIT_PRIORITY", "Tracked", "flush_at_exit", "track"]

#: Among a ``multiprocessing`` child's finalizers (higher runs first): after the write-behind
#: queues (10), before ``multiprocessing``'s own (0 and below).
EXIT_PRIORITY = 5


class Tracked(Protocol):
    """What the process-wide hooks call on each open backend."""

    def flush_hits(self) -> None:
        """Write the hits noted since the last flush."""

    def reopen_after_fork(self) -> None:
        """In a forked child: fresh locks and a root descriptor of its own."""


_OPEN: weakref.WeakSet[Tracked] = weakref.WeakSet()


def track(backend: Tracked) -> None:
    """Flush ``backend``'s hits at exit, and reopen its root in a forked child."""
    _OPEN.add(backend)


def _flush_all() -> None:
    for backend in list(_OPEN):
        backend.flush_hits()


def flush_at_exit() -> None:
    """Have the open backends' hits flushed when this process ends, a ``multiprocessing``
    child too (cheap to call again: call it where hits are counted)."""
    at_exit(_flush_all, priority=EXIT_PRIORITY)


flush_at_exit()


def _after_fork() -> None:
    for backend in list(_OPEN):
        backend.reopen_after_fork()


os.register_at_fork(after_in_child=_after_fork)
