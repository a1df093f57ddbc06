"""Waiting for an ``flock`` without blocking: polled up to a deadline.

A process stopped while it holds a lock (``SIGSTOP``, a debugger, a frozen container)
must not stop the others for longer than they choose to wait, so no caller blocks in
``flock``: each polls with ``LOCK_NB`` and gives up at its deadline.
"""

from __future__ import annotations

import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["flock_within"]


def flock_within(fd: int, seconds: float, *, shared: bool = False, pause: float = 0.002) -> bool:
    """Take an ``flock`` on ``fd`` (exclusive, or ``shared``), trying again every ``pause``
    seconds for up to ``seconds``; whether it was taken. ``True`` where there are no
    ``flock`` calls at all (not POSIX). An error other than the lock being held (a file
    system without locks) raises ``OSError``."""
    if fcntl is None:  # pragma: no cover - not on POSIX
        return True
    kind = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, kind)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
