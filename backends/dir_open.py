"""The ``dir://`` backends open in this process: their hits are flushed at exit, and a
forked child reopens their roots.

:class:`~runtime_cache.backends.directory.DirectoryBackend` registers itself with
:func:`track` when it opens; the set holds it weakly, so a backend that is no longer
used is not kept alive by it.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Protocol

__all__ = ["Tracked", "track"]


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


@atexit.register
def _flush_all() -> None:
    for backend in list(_OPEN):
        backend.flush_hits()


def _after_fork() -> None:
    for backend in list(_OPEN):
        backend.reopen_after_fork()


os.register_at_fork(after_in_child=_after_fork)
