"""The children's watchdog counts only the time this process ran (the fourth review: an app
suspended past LOAD_TIMEOUT killed a vetting child that did nothing wrong, and a good binary
was blocklisted and evicted). Real processes, real SIGSTOP and SIGCONT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from runtime_cache.opencl.watchdog import Watchdog, stopped

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_child_past_its_time_is_killed() -> None:
    child = _sleeper()
    try:
        dog = Watchdog(child, 0.5).start()
        assert child.wait(10) == -signal.SIGKILL
        assert dog.fired and not dog.child_stopped
    finally:
        child.kill()


def test_a_child_stopped_from_outside_is_said_so() -> None:
    child = _sleeper()
    try:
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        dog = Watchdog(child, 0.5).start()
        assert child.wait(10) == -signal.SIGKILL
        assert dog.fired and dog.child_stopped
    finally:
        child.kill()


_SUSPENDED = textwrap.dedent(
    """
    import subprocess, sys, time
    from runtime_cache.opencl.watchdog import Watchdog
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dog = Watchdog(child, 3.0).start()
    print("armed", flush=True)
    time.sleep(6.5)  # stopped for 5 s of these by the test: 1.5 s of its own
    print("fired" if dog.fired else "alive", child.poll(), flush=True)
    dog.cancel()
    child.kill()
    """
)


def test_time_this_process_was_stopped_is_not_counted() -> None:
    app = subprocess.Popen([sys.executable, "-c", _SUSPENDED], stdout=subprocess.PIPE, text=True)
    try:
        assert app.stdout is not None and app.stdout.readline().strip() == "armed"
        time.sleep(0.5)
        os.kill(app.pid, signal.SIGSTOP)  # the app suspended (Ctrl-Z, a scheduler)
        time.sleep(5.0)
        os.kill(app.pid, signal.SIGCONT)
        out, _ = app.communicate(timeout=30)
        assert out.split() == ["alive", "None"]  # a plain timer had fired at once
    finally:
        app.kill()
