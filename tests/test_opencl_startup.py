"""A process's first cached program: the registry, the default backend's import, read-ahead.

On real PoCL (or the driver under test) and a real ``dir://`` cache.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import generated_sources, run_kernel, run_python

import runtime_cache as rc
from runtime_cache import registry as reg
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.opencl import OpenCLModule, opencl_stats, reset_opencl_stats
from runtime_cache.opencl.child import child_path
from runtime_cache.opencl.prefetch import ReadAhead


class Elsewhere(MemoryBackend):
    scheme = "elsewhere"


def test_a_builtin_scheme_resolves_from_the_own_distribution() -> None:
    fresh = reg.Registry()
    assert fresh.resolve("memory") is MemoryBackend
    assert fresh.resolve("DIR") is DirectoryBackend
    assert not fresh._discovered  # nobody else's entry points were read
    assert {"dir", "memory", "redis"} <= set(fresh.names())  # discovery still works


def test_a_registration_made_first_still_wins() -> None:
    fresh = reg.Registry()
    fresh.register("dir", Elsewhere, replace=True)
    assert fresh.resolve("dir") is Elsewhere
    with pytest.raises(rc.errors.UnknownBackendError):
        reg.Registry().resolve("no-such-scheme")


def _imports(tmp_path: Path, env: dict[str, str], statement: str) -> str:
    code = (
        f"import sys; sys.path[:] = {child_path()!r}\n"
        f"{statement}\n"
        "print('runtime_cache.backends.directory' in sys.modules)\n"
    )
    done = run_python(code, tmp_path, env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_looking_up_a_builder_imports_the_default_backend(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if k != "RUNTIME_CACHE"}
    builder = "from runtime_cache.opencl import OpenCLModule"
    assert _imports(tmp_path, base, builder) == "True"  # the embedded default: dir://
    assert _imports(tmp_path, base, "from runtime_cache.opencl import build_program") == "True"
    assert _imports(tmp_path, {**base, "RUNTIME_CACHE": f"dir://{tmp_path}/c"}, builder) == "True"
    assert _imports(tmp_path, {**base, "RUNTIME_CACHE": "memory://"}, builder) == "False"
    # A setting that cannot open is left for get_cache() to report: the import works.
    assert _imports(tmp_path, {**base, "RUNTIME_CACHE": "no-such-scheme://x"}, builder) == "False"
    assert _imports(tmp_path, {**base, "RUNTIME_CACHE": "off"}, builder) == "False"
    # The package alone, and install(), which opens the cache at the first build only.
    alone = "import runtime_cache.opencl as o; o.install(); o.uninstall()"
    assert _imports(tmp_path, base, alone) == "False"


# ------------------------------------------------------------------------------ read-ahead
def _works(ctx: Any, module: OpenCLModule, names: list[str]) -> None:
    data = np.arange(16, dtype=np.float32)
    for name in names:
        i = int(name[1:])
        out = run_kernel(ctx, module.kernel(name), data)
        np.testing.assert_array_equal(out, data * (i + 2) + 3)


def _warm(ctx: Any, cache: rc.Cache, count: int) -> tuple[dict[str, str], OpenCLModule]:
    """``count`` programs (the sources _works checks) stored in ``cache``, and a new module
    of them that has loaded nothing yet; the counters reset."""
    sources = generated_sources(count, salt=3)
    OpenCLModule(ctx, sources, cache=cache).build_all()
    reset_opencl_stats()
    return sources, OpenCLModule(ctx, sources, cache=cache)


def _count_reads(cache: rc.Cache) -> list[tuple[int, int]]:
    """Record (thread, number of keys) of each real ``get_many_views`` call on ``cache``."""
    calls: list[tuple[int, int]] = []
    views = cache.get_many_views

    def counted(keys: Any, **options: Any) -> Any:  # the real call, counted
        keys = list(keys)
        calls.append((threading.get_ident(), len(keys)))
        return views(keys, **options)

    cache.get_many_views = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.opencl
def test_lazy_programs_after_the_first_come_from_the_read_ahead(ctx: Any, cache: rc.Cache) -> None:
    sources, module = _warm(ctx, cache, 40)
    calls = _count_reads(cache)
    names = list(sources)
    module.program(names[5])  # the first asked for: read ahead from the next one on
    for name in names[6:] + names[:5]:
        module.program(name)
    stats = opencl_stats()
    assert (stats.binary_loads, stats.source_builds) == (40, 0)
    # Each entry read once; the read-ahead thread read several programs per backend call.
    assert sum(count for _, count in calls) == 40
    me = threading.get_ident()
    assert any(who != me and count > 1 for who, count in calls)
    _works(ctx, module, names)


@pytest.mark.opencl
@pytest.mark.parametrize("value", ["0", "off"])
def test_read_ahead_can_be_turned_off(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_READ_AHEAD", value)
    sources, module = _warm(ctx, cache, 6)
    calls = _count_reads(cache)
    names = list(sources)
    for name in names:
        module.program(name)
    assert module._ahead is None
    assert calls == [(threading.get_ident(), 1)] * 6  # one program at a time, on this thread
    assert (opencl_stats().binary_loads, opencl_stats().source_builds) == (6, 0)
    _works(ctx, module, names)


@pytest.mark.opencl
def test_a_tampered_entry_read_ahead_is_still_refused(ctx: Any, cache: rc.Cache) -> None:
    sources = generated_sources(6, salt=3)
    first = OpenCLModule(ctx, sources, cache=cache)
    first.build_all()
    victim = first._plan("k4").keys
    assert victim is not None
    blob = cache.backend.get(str(victim[0]))
    assert blob is not None
    torn = bytearray(blob)
    torn[-1] ^= 0xFF
    cache.backend.set(str(victim[0]), bytes(torn))  # the checksum no longer matches
    reset_opencl_stats()
    misses = cache.stats().misses
    module = OpenCLModule(ctx, sources, cache=cache)
    for name in sources:
        module.program(name)
    stats = opencl_stats()
    assert stats.binary_loads == 5 and stats.source_builds == 1
    assert cache.stats().corrupt == 1
    assert cache.stats().misses - misses == 1  # once: not by the thread, then by the caller
    _works(ctx, module, list(sources))


@pytest.mark.opencl
def test_a_missing_entry_read_ahead_counts_one_miss(ctx: Any, cache: rc.Cache) -> None:
    sources = generated_sources(6, salt=3)
    OpenCLModule(ctx, sources, cache=cache).build_all()
    module = OpenCLModule(ctx, sources, cache=cache)
    victim = module._plan("k4").keys
    assert victim is not None and cache.delete(victim[0])
    before = cache.stats()
    names = list(sources)
    module.program(names[0])
    module.program(names[1])  # the thread begins, and reads the rest (k4 missing) ...
    assert module._ahead is not None and module._ahead.begun and module._ahead.join(30)
    for name in names[2:]:  # ... before the caller asks: k4 is then read again, here
        module.program(name)
    after = cache.stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (5, 1)


@pytest.mark.opencl
def test_a_program_read_ahead_and_never_asked_for_is_no_hit(ctx: Any, cache: rc.Cache) -> None:
    """Hits, bytes read and seconds saved count the programs taken, not those read ahead."""
    sources = generated_sources(8, salt=5)
    OpenCLModule(ctx, sources, cache=cache).build_all()
    module = OpenCLModule(ctx, sources, cache=cache)
    before = cache.stats()
    names = list(sources)
    module.program(names[0])
    module.program(names[1])  # the thread begins and reads the other six
    assert module._ahead is not None and module._ahead.begun and module._ahead.join(30)
    assert module._ahead.held > 0  # six programs read, none taken yet
    after = cache.stats()
    assert (after.hits - before.hits, after.misses - before.misses) == (2, 0)
    one_read = (after.bytes_read - before.bytes_read) / 2
    module.program(names[4])  # taken from what was read ahead: counted now
    taken = cache.stats()
    assert taken.hits - before.hits == 3
    assert taken.bytes_read - before.bytes_read == pytest.approx(3 * one_read, rel=0.05)
    assert taken.seconds_saved > after.seconds_saved


@pytest.mark.opencl
def test_build_all_after_a_lazy_program_stops_the_read_ahead(ctx: Any, cache: rc.Cache) -> None:
    _, module = _warm(ctx, cache, 30)
    module.program("k0")
    assert module.build_all() == 0
    assert opencl_stats().binary_loads == 30
    _works(ctx, module, ["k0", "k29"])


class _Plan:
    """A stand-in plan: only its keys matter to the read-ahead."""

    def __init__(self, name: str) -> None:
        self.keys = [rc.make_key(module_id="m", runtime="t", purpose="p", name=name)]


def _stored_plans(count: int, value: Any) -> tuple[rc.Cache, dict[str, Any]]:
    """A memory cache holding ``value(i)`` under the key of plan ``p<i>``, and the plans."""
    cache = rc.Cache(MemoryBackend())
    plans: dict[str, Any] = {f"p{i}": _Plan(f"p{i}") for i in range(count)}
    for i in range(count):
        cache.put(plans[f"p{i}"].keys[0], value(i))
    return cache, plans


def _noting_plans(plans: dict[str, Any]) -> tuple[list[str], Any]:
    """A ``plan_of`` for ``plans`` that notes each name it plans, and the list it notes in."""
    planned: list[str] = []

    def plan_of(name: str) -> Any:
        planned.append(name)
        return plans[name]

    return planned, plan_of


def _held_plans(
    plans: dict[str, Any], held: threading.Lock
) -> tuple[Any, threading.Event, threading.Event]:
    """A ``plan_of`` that, holding ``held``, says it has begun (``entered``) and waits for
    ``go_on`` before it plans; and those two events."""
    entered, go_on = threading.Event(), threading.Event()

    def plan_of(name: str) -> Any:
        with held:
            entered.set()
            go_on.wait(10)
            return plans[name]

    return plan_of, entered, go_on


def test_read_ahead_hands_out_each_program_once_and_never_blocks_an_unread_one() -> None:
    cache, plans = _stored_plans(40, lambda i: f"value {i}".encode())
    plan_of, entered, gate = _held_plans(plans, threading.Lock())
    ahead = ReadAhead(cache, list(plans), plan_of)
    ahead.start("p0")
    # The caller comes back for p39: not reached, it is the caller's to read, at once;
    # once read (begin), the thread starts on its first chunk.
    assert ahead.take("p39") is None
    ahead.begin()
    assert entered.wait(10)
    gate.set()
    got = ahead.take("p1")  # in the chunk being read: waits for it
    assert got is not None and bytes(got[1][str(plans["p1"].keys[0])]) == b"value 1"
    assert ahead.take("p1") is None  # handed out once
    assert ahead.take("p0") is None  # the first is the caller's own
    assert all(ahead.take(f"p{i}") is not None for i in range(2, 39))


def test_read_ahead_stops_when_it_holds_too_much(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime_cache.opencl import prefetch

    cache, plans = _stored_plans(30, lambda i: bytes(1000))
    # Chunks of 1, 2, 4... programs: passed by the first two chunks' 3000 bytes.
    monkeypatch.setattr(prefetch, "MAX_HELD", 1500)
    ahead = ReadAhead(cache, list(plans), plans.__getitem__)
    ahead.start("p0")
    assert ahead.take("p0") is None  # the first program's own: starts nothing
    assert ahead.take("nothing") is None  # another program, read by the caller
    ahead.begin()  # then the thread starts
    assert ahead.join(10)  # it stopped on its own, holding the first two chunks
    assert ahead.held == 3000
    assert all(ahead.take(f"p{i}") is not None for i in (1, 2, 3))
    assert all(ahead.take(f"p{i}") is None for i in range(4, 30))  # left to the caller
    assert ahead.held == 0


def test_read_ahead_starts_when_the_caller_comes_back_for_a_second_program() -> None:
    """Nothing is read while the first program loads; then the others, in order."""
    cache, plans = _stored_plans(40, lambda i: f"value {i}".encode())
    planned, plan_of = _noting_plans(plans)
    ahead = ReadAhead(cache, list(plans), plan_of)
    ahead.start("p0")
    assert ahead.take("p0") is None
    ahead.begin()  # the first program's own read: starts nothing
    time.sleep(0.2)
    assert planned == [] and not ahead.begun  # the first program has the process to itself
    assert ahead.take("p1") is None  # not read yet: the caller reads it itself
    assert not ahead.begun  # nor while the caller reads it
    ahead.begin()  # the caller's read is done: the thread reads on
    assert ahead.begun and ahead.join(10)
    assert planned == [f"p{i}" for i in range(2, 40)]  # the rest, from the next one on
    got = ahead.take("p2")
    assert got is not None and bytes(got[1][str(plans["p2"].keys[0])]) == b"value 2"
    assert all(ahead.take(f"p{i}") is not None for i in range(3, 40))


def test_read_ahead_skips_a_chunk_the_caller_emptied() -> None:
    """Programs taken by the caller before the thread began leave an empty chunk: skipped."""
    cache, plans = _stored_plans(4, lambda i: f"value {i}".encode())
    planned, plan_of = _noting_plans(plans)
    ahead = ReadAhead(cache, list(plans), plan_of)
    ahead.start("p0")
    assert ahead.take("p0") is None and ahead.take("p1") is None  # chunks: [p2], [p3]
    assert ahead.take("p2") is None  # not started: the caller's, and its chunk is empty
    ahead.begin()
    assert ahead.begun and ahead.join(10)
    assert planned == ["p3"]
    got = ahead.take("p3")
    assert got is not None and bytes(got[1][str(plans["p3"].keys[0])]) == b"value 3"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_read_ahead_in_a_forked_child_starts_nothing_and_never_waits() -> None:
    """A child forked while the parent's thread held the read-ahead's lock: the child's
    program() calls take() and begin(), and neither touches that lock or starts a thread."""
    cache, plans = _stored_plans(6, lambda i: f"value {i}".encode())
    ahead = ReadAhead(cache, list(plans), plans.__getitem__)
    ahead.start("p0")
    assert ahead.take("p0") is None
    with ahead._lock:  # as if the parent's thread held it at the fork
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if neither call blocks or starts a thread
            code = 1
            try:
                ok = ahead.take("p1") is None
                ahead.begin()
                code = 0 if ok and not ahead._begun else 1
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child blocked in take() or begin()")
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_chunk_being_read() -> None:
    """The thread plans under a lock (a module's plans do, while reading #include files).
    A fork at that moment would leave the child that lock held for ever, so the fork
    waits until the chunk is read, and the child finds the lock free."""
    cache, plans = _stored_plans(6, lambda i: f"value {i}".encode())
    held = threading.Lock()
    plan_of, entered, go_on = _held_plans(plans, held)
    ahead = ReadAhead(cache, list(plans), plan_of)
    ahead.start("p0")
    assert ahead.take("p1") is None
    ahead.begin()
    assert entered.wait(10)
    threading.Timer(0.3, go_on.set).start()
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the plan lock is free here
        os._exit(0 if held.acquire(timeout=2) else 1)
    assert go_on.is_set()  # the fork waited until the read was let go
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ahead.join(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_from_inside_a_read_does_not_wait_for_itself() -> None:
    """A backend that forks while the read-ahead thread reads through it: the fork goes on."""
    from runtime_cache.opencl.fork_gate import gate

    def read() -> None:
        with gate.reading():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "fork() waited for the read it was called from"


def test_read_ahead_with_nothing_left_to_read_starts_no_thread() -> None:
    """Two programs: the caller reads the second itself, and no thread starts for nothing."""
    cache, plans = _stored_plans(2, lambda i: f"value {i}".encode())
    ahead = ReadAhead(cache, list(plans), plans.__getitem__)
    ahead.start("p0")
    assert ahead.take("p0") is None
    assert ahead.take("p1") is None  # the caller's to read
    ahead.begin()
    assert not ahead.begun


def test_a_read_carries_its_standing_with_the_crash_guard() -> None:
    """What the thread read comes with the binaries' standing, looked up on the thread:
    unknown at first, known once vouched for under these keys."""
    from runtime_cache.opencl.guard import KNOWN, UNKNOWN, bindings, guard

    cache, plans = _stored_plans(4, lambda i: f"standing {i} {time.time()}".encode())
    ahead = ReadAhead(cache, list(plans), plans.__getitem__)
    ahead.start("p0")
    assert ahead.take("p1") is None
    ahead.begin()
    assert ahead.join(10)  # all read
    got = ahead.take("p2")
    assert got is not None and got[3] == UNKNOWN
    read = ahead.take("p3")
    assert read is not None and read[3] == UNKNOWN
    guard.vouch(bindings(plans["p3"].keys, read[2]))
    again = ReadAhead(cache, list(plans), plans.__getitem__)
    again.start("p0")
    assert again.take("p1") is None
    again.begin()
    assert again.join(10)
    assert again.take("p2") is not None
    known = again.take("p3")
    assert known is not None and known[3] == KNOWN
