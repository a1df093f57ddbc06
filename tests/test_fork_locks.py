"""A forked child never waits for a lock another thread of its parent held at the fork.

Re-attack of session 42: a threaded app that forked (its threads putting entries, a
``tiered://memory://,redis+unix://`` store) had 47 of 60 children hang in ``Counters.add``,
whose lock a thread of the parent held at the fork: the child has no such thread, and the
lock stayed held there for good. Each lock of the cache's paths is made anew in the child
(:mod:`runtime_cache.fork_locks`).
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache import fork_locks

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def _held_by_a_thread(lock: Any) -> threading.Event:
    """Hold ``lock`` on another thread until the returned event is set."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(5)
    return done


def _child_ends(work: Any, seconds: float = 10.0) -> int | None:
    """Fork; the child runs ``work()`` and exits 0 (1 if it raised). The child's exit code,
    or None if it was still running after ``seconds`` (then killed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"f{i}", runtime="r", purpose="fork-locks")


@pytest.mark.parametrize(
    "which", ["counters", "failures", "flights", "state", "fleet", "memory", "tiered", "tier"]
)
def test_a_lock_held_at_the_fork_is_free_in_the_child(tmp_path: Path, which: str) -> None:
    backend = rc.open_backend(f"memory://,dir://{tmp_path / 'c'}")
    cache = rc.Cache(backend)
    assert cache.put(_key(0), b"zero")
    locks: dict[str, Any] = {
        "counters": lambda: cache._counters._lock,
        "failures": lambda: cache._policy._lock,
        "flights": lambda: cache._flights._lock,
        "state": lambda: cache._state_lock,
        "fleet": lambda: cache.fleet._lock,
        "memory": lambda: backend.tiers[0]._lock,
        "tiered": lambda: backend._lock,
        "tier": lambda: backend._tiers[0]._counts_lock,
    }
    lock = locks[which]()
    done = _held_by_a_thread(lock)
    try:

        def work() -> None:
            assert lock.acquire(timeout=5)  # (free: held by a thread the child has not)
            lock.release()
            assert cache.get(_key(0)) == b"zero"
            assert cache.put(_key(1), b"one") and cache.get_or_build(_key(2), lambda: b"2")
            assert cache.stats().stores >= 1

        assert _child_ends(work) == 0
    finally:
        done.set()


@pytest.mark.parametrize(
    ("name", "attribute"),
    [
        ("runtime_cache.provider", "_lock"),
        ("runtime_cache.trust", "_lock"),
        # Session 42's closing note: the OpenCL consumer's module locks were not renewed
        # (starting a build worker, the device's memo, install()).
        ("runtime_cache.opencl.child", "_lock"),
        ("runtime_cache.opencl.fingerprint", "_memo_lock"),
        ("runtime_cache.opencl.devices", "_lock"),
        ("runtime_cache.opencl.install", "_lock"),
        ("runtime_cache.opencl.capture", "_origins_lock"),
        ("runtime_cache.check", "_told_lock"),  # (re-attack of session 46's warn-once)
    ],
)
def test_module_locks_are_free_in_the_child(name: str, attribute: str) -> None:
    lock = getattr(importlib.import_module(name), attribute)
    done = _held_by_a_thread(lock)
    try:
        assert _child_ends(lambda: lock.acquire(timeout=5) or os._exit(3)) == 0
    finally:
        done.set()


def test_an_owner_that_goes_is_forgotten() -> None:
    class Owner:
        def __init__(self) -> None:
            self.lock = threading.Lock()
            fork_locks.renew_in_child(self, "lock")

    owner = Owner()
    assert id(owner) in fork_locks._owners
    key = id(owner)
    del owner
    assert key not in fork_locks._owners


def test_a_build_in_flight_at_the_fork_is_not_waited_for_in_the_child(tmp_path: Path) -> None:
    """A key another thread was building at the fork: the child, which has no such
    thread, joined that flight and waited for ever. It leads its own (a store whose leases
    other processes see has the child wait for the parent's entry there instead)."""
    cache = rc.Cache(rc.open_backend("memory://"))
    started, finish = threading.Event(), threading.Event()

    def slow() -> bytes:
        started.set()
        finish.wait(30)
        return b"parent's"

    builder = threading.Thread(target=lambda: cache.get_or_build(_key(9), slow), daemon=True)
    builder.start()
    assert started.wait(5)
    try:
        assert _child_ends(lambda: cache.get_or_build(_key(9), lambda: b"child's")) == 0
    finally:
        finish.set()
        builder.join(10)


def test_every_module_lock_is_renewed_in_a_child() -> None:
    """Each module-level lock of the package is one a forked child gets free: a lock added
    without :func:`~runtime_cache.fork_locks.renew_in_child` hung 22 of 200 children that
    forked while another thread held it (session 46's warn-once lock)."""
    import pkgutil

    import runtime_cache
    import runtime_cache.backends

    kinds = (type(threading.Lock()), type(threading.RLock()), threading.Condition)
    # Renewed by the module's own at-fork hook (a new lock in the child).
    own_hook = {"runtime_cache.process_exit._lock"}
    missing = []
    names = [
        info.name
        for package in (runtime_cache, runtime_cache.backends)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        if not info.name.endswith("__main__")  # (runs the CLI)
    ]
    assert len(names) > 100 and "runtime_cache.backends.directory" in names
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:  # (an optional part: pyopencl, redis)
            continue
        renewed = fork_locks._owners.get(id(module), (None, ()))[1]
        missing += [
            f"{name}.{attr}"
            for attr, value in vars(module).items()
            if isinstance(value, kinds) and attr not in renewed
        ]
    assert [name for name in missing if name not in own_hook] == []
