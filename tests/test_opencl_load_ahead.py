"""A lazy module's read-ahead thread also loads what it read, on the CPU drivers.

The thread hands programs to the driver beside the caller's own loads, never the caller's
next one, at most ``LOAD_WINDOW`` not yet taken; a program loaded ahead counts (hits,
loads) only when it is asked for. The ``ReadAhead`` tests use a stand-in loader; the
module tests run on the OpenCL driver under test, skipping where the thread only reads
(NVIDIA's driver serializes loads: ``LOADS_AHEAD``).
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import generated_sources, run_kernel, run_python

import runtime_cache as rc
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.opencl import (
    OpenCLModule,
    cached_load,
    opencl_stats,
    prefetch,
    reset_opencl_stats,
)
from runtime_cache.opencl.ahead_terms import NOT_HERE, Loaded, weakly
from runtime_cache.opencl.prefetch import LOAD_WINDOW, ReadAhead


class _Plan:
    """A stand-in plan: only its keys matter to the read-ahead."""

    def __init__(self, name: str) -> None:
        self.keys = [rc.make_key(module_id="m", runtime="t", purpose="p", name=name)]


def _ahead(count: int, load: Any) -> tuple[ReadAhead, rc.Cache]:
    """A read-ahead over ``count`` stored programs ``p0``.. with loader ``load``, begun
    as a module begins it: ``p0`` asked first, then ``p1`` (read by the caller)."""
    cache = rc.Cache(MemoryBackend())
    plans = {f"p{i}": _Plan(f"p{i}") for i in range(count)}
    for i, plan in enumerate(plans.values()):
        cache.put(plan.keys[0], f"value {i}".encode())
    ahead = ReadAhead(cache, list(plans), plans.__getitem__, load)
    ahead.start("p0")
    assert ahead.take("p0") is None and ahead.take("p1") is None
    ahead.begin()
    return ahead, cache


def test_the_thread_loads_at_most_a_window_ahead_then_gives_up_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 0.2)
    loaded: list[str] = []

    def load(name: str, read: Any) -> str:
        loaded.append(name)
        return f"program {name}"

    ahead, cache = _ahead(20, load)
    assert ahead.join(10)  # nothing taken: it stopped after LOAD_PATIENCE
    assert 1 <= len(loaded) <= LOAD_WINDOW
    assert cache.stats().hits == 0  # read and loaded ahead, not asked for: no hit
    got = ahead.take(loaded[0])
    assert isinstance(got, Loaded) and got.program == f"program {loaded[0]}"
    assert cache.stats().hits == 1
    for i in range(2, 20):  # the rest: loaded, read, or (not reached) the caller's
        name = f"p{i}"
        if name not in loaded:
            assert not isinstance(ahead.take(name), Loaded)


def test_a_program_the_loader_leaves_is_handed_out_as_read_and_a_refused_one_not() -> None:
    def load(name: str, read: Any) -> Any:
        return None if name == "p3" else NOT_HERE

    ahead, _ = _ahead(8, load)
    assert ahead.join(10)  # (every program read, none kept loaded: nothing to wait for)
    got = ahead.take("p2")
    assert got is not None and not isinstance(got, Loaded)
    assert bytes(next(iter(got[1].values()))) == b"value 2"
    assert ahead.take("p3") is None  # refused (its entries evicted): read again, a miss


def test_a_loader_that_raises_stops_the_thread_and_leaves_the_read() -> None:
    def load(name: str, read: Any) -> Any:
        raise RuntimeError("driver fault")

    ahead, _ = _ahead(8, load)
    assert ahead.join(10)
    got = ahead.take("p2")
    assert got is not None and not isinstance(got, Loaded)  # the caller's, as read


def test_the_thread_leaves_the_callers_next_programs_to_it() -> None:
    """The caller asks in order: the thread never loads a program within LEAD places
    after the one the caller took last."""
    taken_last: list[int] = [-1]
    too_close: list[str] = []
    lock = threading.Lock()

    def load(name: str, read: Any) -> str:
        with lock:
            if int(name[1:]) <= taken_last[0] + 1:
                too_close.append(name)
        return name

    ahead, _ = _ahead(30, load)
    for i in range(2, 30):
        with lock:
            taken_last[0] = i
        ahead.take(f"p{i}")
    assert ahead.join(10)
    assert too_close == []


class _Owner:
    """A stand-in module: the read-ahead holds it only weakly, through its methods."""

    def __init__(self, count: int, cache: rc.Cache) -> None:
        self.plans = {f"p{i}": _Plan(f"p{i}") for i in range(count)}
        for i, plan in enumerate(self.plans.values()):
            cache.put(plan.keys[0], f"value {i}".encode())
        self.loaded: list[str] = []

    def plan(self, name: str) -> _Plan:
        return self.plans[name]

    def load(self, name: str, read: Any) -> str:
        self.loaded.append(name)
        return name


def _window_full(ahead: ReadAhead) -> bool:
    """Wait until the thread has loaded a window ahead and waits for a take (no load of
    its own under way, so it holds no strong reference to its module)."""
    for _ in range(3000):
        with ahead._lock:
            if len(ahead._loaded) == LOAD_WINDOW and not ahead._loading:
                return True
        threading.Event().wait(0.01)
    return False


def _freed(gone: weakref.ref[Any]) -> bool:
    """Whether the object is freed within 10 s (the thread, planning its next chunk, may
    hold it for a moment; its patience is far longer). If not, what holds it is shown."""
    for _ in range(1000):
        if gone() is None:
            return True
        threading.Event().wait(0.01)
    holders = [type(r).__name__ for r in gc.get_referrers(gone())]
    raise AssertionError(f"still alive, held by {holders}")


def _owned_window() -> tuple[_Owner, ReadAhead]:
    """An owner of 20 programs and its read-ahead (holding it weakly), begun as a module
    begins it and waiting with a window loaded ahead."""
    cache = rc.Cache(MemoryBackend())
    owner = _Owner(20, cache)
    ahead = ReadAhead(cache, list(owner.plans), weakly(owner.plan), weakly(owner.load))
    ahead.start("p0", owner=owner)
    assert ahead.take("p0") is None and ahead.take("p1") is None
    ahead.begin()
    assert _window_full(ahead)
    return owner, ahead


def test_an_owner_dropped_while_the_thread_waits_is_freed_and_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 120.0)  # only the drop can end it early
    owner, ahead = _owned_window()
    loaded = owner.loaded
    gone = weakref.ref(owner)
    del owner
    assert _freed(gone)  # the thread held it only weakly
    assert ahead.join(10)  # and it ended without waiting out its patience
    assert len(loaded) == LOAD_WINDOW


def test_an_owner_dropped_on_a_thread_inside_the_lock_stops_it_without_a_deadlock() -> None:
    # The finalizer runs on whatever thread drops the module, maybe one holding the
    # read-ahead's lock: it sets a plain flag, and the thread sees it within its patience.
    owner, ahead = _owned_window()
    gone = weakref.ref(owner)
    with ahead._lock:
        del owner  # collected here, the finalizer run inside the lock
        assert gone() is None
    assert ahead.join(10)
    assert "stopped" in repr(ahead)


def test_a_weakly_held_method_raises_once_its_object_is_gone() -> None:
    owner = _Owner(1, rc.Cache(MemoryBackend()))
    call = weakly(owner.load, "p0")
    assert call("read") == "p0"
    del owner
    with pytest.raises(ReferenceError):
        call("read")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_a_load_on_the_thread() -> None:
    """The driver holds its own locks while it loads: a child forked meanwhile could not
    use it. The fork waits until the load is done."""
    entered, go_on = threading.Event(), threading.Event()

    def load(name: str, read: Any) -> str:
        entered.set()
        go_on.wait(10)
        return name

    ahead, _ = _ahead(8, load)
    assert entered.wait(10)
    threading.Timer(0.3, go_on.set).start()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert go_on.is_set()  # the fork waited for the load
    os.waitpid(pid, 0)
    ahead.stop()
    assert ahead.join(10)


# ------------------------------------------------------------------ on the driver under test
def _driver_loads_ahead(ctx: Any) -> bool:
    return {device.platform.name for device in ctx.devices} <= cached_load.LOADS_AHEAD


def _module(ctx: Any, cache: rc.Cache, count: int, salt: int) -> tuple[list[str], OpenCLModule]:
    if not _driver_loads_ahead(ctx):
        pytest.skip("this driver's read-ahead thread only reads (LOADS_AHEAD)")
    sources = generated_sources(count, salt=salt)
    OpenCLModule(ctx, sources, cache=cache).build_all()
    reset_opencl_stats()
    return list(sources), OpenCLModule(ctx, sources, cache=cache)


def _loads_by_thread(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each load the read-ahead makes (the real loads, noted)."""
    threads: list[int] = []
    real = cached_load.load_from_binaries

    def noted(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(cached_load, "load_from_binaries", noted)
    return threads


def _works(ctx: Any, module: OpenCLModule, names: list[str], salt: int) -> None:
    data = np.arange(16, dtype=np.float32)
    for name in names:
        out = run_kernel(ctx, module.kernel(name), data)
        np.testing.assert_array_equal(out, data * (int(name[1:]) + 2) + salt)


@pytest.mark.opencl
def test_lazy_programs_load_beside_the_caller(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    names, module = _module(ctx, cache, 12, salt=3)
    threads = _loads_by_thread(monkeypatch)
    before = cache.stats()
    for name in names:
        module.kernel(name)
    stats, after = opencl_stats(), cache.stats()
    assert (stats.binary_loads, stats.source_builds, stats.rejected_binaries) == (12, 0, 0)
    assert (after.hits - before.hits, after.misses - before.misses) == (12, 0)
    assert threads and threading.get_ident() not in threads  # the loads ahead are the thread's
    assert module.built == sorted(names)
    _works(ctx, module, names, 3)


@pytest.mark.opencl
def test_programs_loaded_ahead_and_never_asked_for_count_nothing(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 0.2)
    names, module = _module(ctx, cache, 10, salt=4)
    threads = _loads_by_thread(monkeypatch)
    module.program(names[0])
    module.program(names[1])  # the thread begins: reads, and loads a window ahead
    assert module._ahead is not None and module._ahead.join(30)
    assert 1 <= len(threads) <= LOAD_WINDOW
    assert opencl_stats().binary_loads == 2 and cache.stats().hits == 2
    assert module.built == sorted(names[:2])
    for name in names[2:]:  # the rest: loaded ahead, read ahead, or read here
        module.program(name)
    stats = opencl_stats()
    assert (stats.binary_loads, stats.source_builds) == (10, 0)
    assert cache.stats().hits == 10
    _works(ctx, module, names, 4)


@pytest.mark.opencl
def test_a_module_dropped_while_its_thread_waits_is_freed_at_once(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop of modules that each ask for a few kernels: the thread of a module dropped
    ends with it, and what it loaded for nobody goes too (it waited LOAD_PATIENCE)."""
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 120.0)
    names, module = _module(ctx, cache, 10, salt=6)
    threads = _loads_by_thread(monkeypatch)
    module.program(names[0])
    module.program(names[1])
    ahead = module._ahead
    assert ahead is not None
    assert _window_full(ahead)
    assert len([t for t in threads if t != threading.get_ident()]) == LOAD_WINDOW
    gone = weakref.ref(module)
    del module
    assert _freed(gone)
    assert ahead.join(10)
    assert opencl_stats().binary_loads == 2  # the loads ahead were never counted


@pytest.mark.opencl
def test_modules_asked_for_few_programs_stop_loading_ahead_until_those_are_used(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 0.05)
    monkeypatch.setattr(cached_load, "UNUSED_AHEAD", 4)
    names, first = _module(ctx, cache, 8, salt=7)
    kept = [first, *(OpenCLModule(ctx, first.sources, cache=cache) for _ in range(9))]
    for module in kept:  # each asked for two programs: its thread loads two for nobody
        module.program(names[0])
        module.program(names[1])
        assert module._ahead is not None and module._ahead.join(30)
    stats = opencl_stats()
    assert stats.loaded_ahead_used == 0
    assert 4 < stats.loaded_ahead <= 4 + LOAD_WINDOW  # then the new modules only read ahead
    assert kept[-1]._ahead is not None and kept[-1]._ahead.begun
    assert kept[-1]._ahead._load is None  # (a thread that only reads)
    for module in kept:  # asked for at last: used, so new modules load ahead again
        for name in names:
            module.program(name)
    stats = opencl_stats()
    assert stats.loaded_ahead_used == stats.loaded_ahead
    assert stats.binary_loads == 8 * len(kept)
    module = OpenCLModule(ctx, first.sources, cache=cache)
    for name in names:
        module.program(name)
    # (whether it loads any depends on how fast this caller takes them)
    assert module._ahead is not None and module._ahead._load is not None


@pytest.mark.opencl
def test_after_refusals_the_8th_and_16th_module_try_loading_ahead_again(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-84: loads dropped unused counted for good, so one early burst of such modules
    kept every later one from loading ahead. Now the 8th, 16th, 32nd.. refused tries."""
    monkeypatch.setattr(prefetch, "LOAD_PATIENCE", 0.05)
    monkeypatch.setattr(cached_load, "UNUSED_AHEAD", 0)
    names, first = _module(ctx, cache, 8, salt=8)
    loaders = []
    for _ in range(17):
        module = OpenCLModule(ctx, first.sources, cache=cache)
        module.program(names[0])
        module.program(names[1])
        assert module._ahead is not None and module._ahead.join(30)
        loaders.append(module._ahead._load is not None)
    assert loaders == [True, *[False] * 7, True, *[False] * 7, True]


@pytest.mark.opencl
@pytest.mark.parametrize("then", ["set_precompiled_programs", "build_all"])
def test_a_bundle_or_build_all_after_lazy_calls_adopts_what_the_thread_loaded(
    ctx: Any, cache: rc.Cache, then: str
) -> None:
    """helper-84: ``set_precompiled_programs`` neither stopped the thread nor took what it
    loaded (14 loads for 12), and ``build_all`` loaded again what the thread was loading."""
    names, first = _module(ctx, cache, 12, salt=9)
    bundle = OpenCLModule(ctx, first.sources, cache=cache).get_precompiled_programs()
    reset_opencl_stats()
    for _ in range(5):
        module = OpenCLModule(ctx, first.sources, cache=cache)
        module.program(names[0])
        module.program(names[1])
        if then == "build_all":
            module.build_all()  # (at once: the thread may be loading)
        else:
            assert module._ahead is not None and _window_full(module._ahead)
            assert module.set_precompiled_programs(bundle) == 12 - 2 - LOAD_WINDOW
        assert module.built == sorted(names)
    stats = opencl_stats()
    assert stats.binary_loads == 5 * 12 and stats.source_builds == 0
    assert stats.loaded_ahead == stats.loaded_ahead_used
    _works(ctx, module, names, 9)


@pytest.mark.opencl
@pytest.mark.parametrize("value", ["0", "off"])
def test_load_ahead_can_be_turned_off(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_LOAD_AHEAD", value)
    names, module = _module(ctx, cache, 8, salt=5)
    threads = _loads_by_thread(monkeypatch)
    for name in names:
        module.program(name)
    assert threads == []  # the thread read ahead; every load was the caller's
    assert module._ahead is not None and module._ahead.begun
    assert opencl_stats().binary_loads == 8


@pytest.mark.opencl
def test_a_module_that_only_reads_ahead_hands_the_caller_what_it_read(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading only (NVIDIA's way), the caller takes what the thread read rather than read
    it again, and each entry counts once."""
    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_LOAD_AHEAD", "0")
    names, module = _module(ctx, cache, 10, salt=8)
    took: list[bool] = []
    take = ReadAhead.take

    def noting(self: ReadAhead, name: str) -> Any:
        got = take(self, name)
        took.append(got is not None)
        return got

    monkeypatch.setattr(ReadAhead, "take", noting)
    cache.reset_stats()
    for name in names:
        module.program(name)
    assert module._ahead is not None and module._ahead._load is None
    assert took[:2] == [False, False]  # the first two are the caller's own reads
    # How many of the other 8 the thread read in time is the machine's timing (measured
    # in benchmarks/, not asserted here; CI on Intel's fast loads once saw 5): each entry
    # was read once, by the thread or, for a program it had not begun, by the caller.
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (10, 0), (stats, took)
    assert opencl_stats().binary_loads == 10 and opencl_stats().source_builds == 0


@pytest.mark.opencl
def test_a_binary_the_driver_refuses_on_the_thread_is_evicted_and_built_here(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A binary no child vets first (vetting off), refused by the driver on the thread:
    its entry is evicted once, and the caller builds the program from source."""
    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_VET", "off")
    names, module = _module(ctx, cache, 10, salt=6)
    victim = module._plan("k6").keys
    assert victim is not None
    flipped = bytearray(cache.get(victim[0]) or b"")
    for i in range(8):  # every driver checks the header and refuses it
        flipped[i] ^= 0xFF
    cache.put(victim[0], bytes(flipped))
    threads = _loads_by_thread(monkeypatch)
    for name in names:
        module.kernel(name)
    stats = opencl_stats()
    assert (stats.binary_loads, stats.source_builds, stats.rejected_binaries) == (9, 1, 1)
    assert threads  # (whichever thread met k6, it was evicted once)
    assert bytes(cache.get(victim[0]) or b"") != bytes(flipped)  # the source build's, stored
    _works(ctx, module, names, 6)


def test_the_gate_closed_at_exit_waits_for_a_load_and_lets_none_begin() -> None:
    from runtime_cache.opencl.fork_gate import ForkGate, GateClosed

    gate = ForkGate()
    inside, go_on = threading.Event(), threading.Event()

    def load() -> None:
        with gate.reading(load=True):
            inside.set()
            go_on.wait(10)

    threading.Thread(target=load, daemon=True).start()
    assert inside.wait(10)
    threading.Timer(0.3, go_on.set).start()
    gate.close(timeout=10)
    assert go_on.is_set()  # close() waited for the load in progress
    with pytest.raises(GateClosed), gate.reading(load=True):
        pass  # no load begins after the exit's close
    with gate.reading():
        pass  # reads go on (helper-83: a lazy module in a later exit handler hung)


_SCRIPT_HEAD = """
import atexit, os, sys
import pyopencl as cl
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import OpenCLModule, choose_device, opencl_stats
sources = {
    f"k{i}": "__kernel void k%d(__global float *a) { a[get_global_id(0)] *= %d.0f; }" % (i, i)
    for i in range(12)
}
ctx = cl.Context([choose_device()])
cache = rc.Cache(DirectoryBackend(os.environ["CACHE_UNDER_TEST"]))
"""
_EXIT_SCRIPT = (
    _SCRIPT_HEAD
    + """
module = OpenCLModule(ctx, sources, cache=cache)
if sys.argv[1] == "fill":
    module.build_all()
else:
    for name in list(sources)[: int(sys.argv[1])]:
        module.kernel(name)  # from the second on, the thread loads ahead: then the exit
print(opencl_stats().source_builds, opencl_stats().binary_loads, flush=True)
"""
)
_LATE_SCRIPT = (
    _SCRIPT_HEAD
    + """
OpenCLModule(ctx, sources, cache=cache).build_all()
late = OpenCLModule(ctx, sources, cache=cache)
atexit.register(lambda: print("late", len([late.kernel(n) for n in list(sources)[:6]])))
module = OpenCLModule(ctx, sources, cache=cache)
module.kernel("k0"); module.kernel("k1")
"""
)


def _run_script(ctx: Any, tmp_path: Path, script: str, *argv: str) -> list[str]:
    """``script``'s output lines, run in a fresh process over the cache in ``tmp_path``;
    it must exit 0 with no traceback (skips where the thread only reads)."""
    if not _driver_loads_ahead(ctx):
        pytest.skip("this driver's read-ahead thread only reads (LOADS_AHEAD)")
    env = {**os.environ, "CACHE_UNDER_TEST": str(tmp_path / "cache")}
    done = run_python(script, tmp_path, env, *argv, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Fatal" not in done.stderr, done.stderr
    return done.stdout.splitlines()


@pytest.mark.opencl
def test_a_process_that_exits_while_the_thread_loads_exits_cleanly(
    ctx: Any, tmp_path: Path
) -> None:
    """The exit waits for a load on the thread (the driver's exit handlers must not run
    beside it): every process exits 0, and no binary is blocklisted for it."""
    assert _run_script(ctx, tmp_path, _EXIT_SCRIPT, "fill") == ["12 0"]
    for _ in range(4):  # each exits as the thread loads the programs after the second
        assert _run_script(ctx, tmp_path, _EXIT_SCRIPT, "2") == ["0 2"]
    assert _run_script(ctx, tmp_path, _EXIT_SCRIPT, "12") == ["0 12"]  # none blocklisted


@pytest.mark.opencl
def test_a_lazy_module_in_an_exit_handler_still_loads(ctx: Any, tmp_path: Path) -> None:
    """helper-83: an exit handler registered before the first module, using a lazy
    module, waited for ever once the exit had closed the gate."""
    assert _run_script(ctx, tmp_path, _LATE_SCRIPT) == ["late 6"]


@pytest.mark.opencl
def test_the_thread_leaves_a_blocklisted_binary_to_the_caller(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-83: the thread evicted a blocklisted program nobody asked for. It is the
    caller's, which evicts it only when it asks for that program."""
    from runtime_cache.opencl.guard import binary_digest, guard

    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_VET", "off")
    names, module = _module(ctx, cache, 10, salt=7)
    victim = module._plan("k4").keys
    assert victim is not None
    guard.block([binary_digest(cache.get(victim[0]) or b"")])
    try:
        for name in names[:4]:
            module.program(name)
        assert module._ahead is not None and module._ahead.join(30)
        assert cache.get(victim[0]) is not None  # not asked for: kept
        assert opencl_stats().rejected_binaries == 0
    finally:
        guard.unblock([binary_digest(cache.get(victim[0]) or b"")])


@pytest.mark.opencl
def test_build_all_adopts_what_the_thread_loaded(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-83: build_all() after two lazy programs loaded again the programs the
    thread had loaded ahead (14 driver loads for 12 programs)."""
    from runtime_cache.opencl import program as program_module

    names, module = _module(ctx, cache, 12, salt=8)
    loads: list[int] = []
    for owner in (cached_load, program_module):
        real = owner.load_from_binaries

        def noted(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            loads.append(1)
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, "load_from_binaries", noted)
    module.program(names[0])
    module.program(names[1])
    assert module._ahead is not None and module._ahead.join(30)
    assert module.build_all() == 0
    assert len(loads) == 12
    stats = opencl_stats()
    assert (stats.binary_loads, stats.source_builds) == (12, 0) and cache.stats().hits == 12
    _works(ctx, module, names, 8)


@pytest.mark.opencl
def test_build_all_and_a_caller_waiting_for_the_same_load_ahead_load_it_once(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI (Intel's runtime, 25 loads for 24): a program() call and build_all()'s stop both
    waited for the thread's load of one program; when build_all took it (without holding
    the program's name), the caller found nothing and loaded it again."""
    names, module = _module(ctx, cache, 10, salt=8)
    real = cached_load.load_from_binaries
    loading, go_on = threading.Event(), threading.Event()
    first: list[int] = []

    def held_up(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != caller and not first:  # the thread's first load
            first.append(1)
            loading.set()
            assert go_on.wait(10)
        return real(*args, **kwargs)

    caller = threading.get_ident()
    monkeypatch.setattr(cached_load, "load_from_binaries", held_up)
    module.program(names[0])
    module.program(names[1])
    assert loading.wait(10)
    ahead = module._ahead
    assert ahead is not None
    with ahead._lock:
        (on_it,) = ahead._loading  # the program the thread is loading
    asking = threading.Thread(target=module.program, args=(on_it,), daemon=True)
    asking.start()  # waits for that load (take)
    building = threading.Thread(target=module.build_all, daemon=True)
    building.start()  # waits for it too (its stop takes what the thread loaded)
    threading.Event().wait(0.3)
    go_on.set()
    asking.join(30)
    building.join(60)
    assert not asking.is_alive() and not building.is_alive()
    assert sorted(module.built) == sorted(names)
    assert opencl_stats().binary_loads == 10  # each program loaded once
