"""Run a hook when this process ends normally, a ``multiprocessing`` child included.

An ordinary process runs its ``atexit`` handlers at the end. A ``multiprocessing``
child started by ``fork`` or ``forkserver`` (Linux's default start methods before
Python 3.14), a ``Pool`` worker among them, ends with ``os._exit`` once its target
returns: it runs no ``atexit`` handler, only ``multiprocessing``'s own finalizers
that have an ``exitpriority`` (``Process._bootstrap`` runs them). A ``spawn`` child
runs both. :func:`at_exit` registers a hook for both ends, and runs it at most once
per process, whichever end comes first.

Neither runs on a signal's default action (``SIGTERM``, ``SIGKILL``) nor after
``os._exit`` called by the program itself.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["at_exit"]

_lock = threading.Lock()
_registered: set[Callable[[], None]] = set()  # hooks given to atexit (a fork inherits them)
_finalized: set[tuple[int, Callable[[], None]]] = set()  # (pid, hook) given to multiprocessing
_ran: set[tuple[int, Callable[[], None]]] = set()  # (pid, hook) that ran


def at_exit(hook: Callable[[], None], *, priority: int) -> None:
    """Have ``hook`` run once when this process ends normally, also where it is a
    ``multiprocessing`` child. Cheap to call again (call it where the work that
    ``hook`` finishes is queued). ``priority``: among ``multiprocessing``'s
    finalizers, higher runs first (its own are 0 and below); under ``atexit``,
    the last hook registered runs first, as ever."""
    with _lock:
        first = hook not in _registered
        _registered.add(hook)
        mark = (os.getpid(), hook)
        finalize = mark not in _finalized and _in_child()
        if finalize:
            _finalized.add(mark)
    if first:
        atexit.register(_once, hook)
    if finalize:
        from multiprocessing import util

        util.Finalize(None, _once, args=(hook,), exitpriority=priority)


def _in_child() -> bool:
    # A child's bootstrap imported multiprocessing; an ordinary process keeps atexit alone.
    process = sys.modules.get("multiprocessing.process")
    return process is not None and process.parent_process() is not None


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it through the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _once(hook: Callable[[], None]) -> None:
    mark = (os.getpid(), hook)
    with _lock:
        if mark in _ran:
            return
        _ran.add(mark)
    hook()
