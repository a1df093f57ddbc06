"""A watchdog over a child process that counts only the time this process ran.

Build workers and vetting children get a limited time to answer (a start, a trial
load, a trial launch); past it the child is killed, and a child that hung loading a
binary condemns that binary. A plain timer (``threading.Timer``) counts on while this
process is stopped: an app suspended for a while (Ctrl-Z, a job scheduler's
``SIGSTOP``/``SIGCONT``) found every timer past its time when it went on, killed a
child that had done nothing wrong, and blocklisted and evicted a good binary.

So a :class:`Watchdog` looks every :data:`TICK` seconds and counts only the time
between looks that came when they should: a look that comes much later than asked
(this process was stopped, or the machine slept) counts one tick. And a child that
is itself stopped when its time runs out (``SIGSTOP`` from outside: state ``T`` in
``/proc``) is killed all the same, but :attr:`Watchdog.child_stopped` says so, so
that the caller counts it as stopped from outside, not as hung.
"""

from __future__ import annotations

import subprocess
import threading
import time

__all__ = ["LATE", "TICK", "Watchdog", "stopped"]

#: Seconds between the watchdog's looks.
TICK = 0.25
#: Seconds past a tick after which a look counts as late (this process did not run).
LATE = 2.0


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (by a signal, or a tracer); ``False`` where
    there is no ``/proc`` to tell, or the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return bool(fields) and fields[0] in (b"T", b"t")


class Watchdog:
    """Kills ``process`` once this process has run ``seconds`` since :meth:`start`
    without a :meth:`cancel`."""

    def __init__(self, process: subprocess.Popen[bytes], seconds: float) -> None:
        self._process = process
        self._seconds = seconds
        self._done = threading.Event()
        #: Whether it killed the child for running past its time.
        self.fired = False
        #: Whether the child was stopped (from outside) when it was killed.
        self.child_stopped = False

    def start(self) -> Watchdog:
        """Start counting (on a daemon thread); returns itself."""
        threading.Thread(target=self._run, name="runtime-cache-watchdog", daemon=True).start()
        return self

    def cancel(self) -> None:
        """Stop counting: the child answered in time."""
        self._done.set()

    def _run(self) -> None:
        counted = 0.0
        last = time.monotonic()
        while not self._done.wait(min(TICK, max(self._seconds - counted, 0.0))):
            now = time.monotonic()
            gap, last = now - last, now
            counted += gap if gap < TICK + LATE else TICK  # late: this process was stopped
            if counted >= self._seconds:
                self.child_stopped = stopped(self._process.pid)
                self.fired = True
                self._process.kill()
                return
