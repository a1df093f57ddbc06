"""``OpenCLModule.build_all(on_progress=)`` on a real driver: cold, parallel and warm."""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest
from opencl_support import generated_sources, run_kernel

import runtime_cache as rc
from runtime_cache.opencl import OpenCLModule

pytestmark = pytest.mark.opencl


class Recorder:
    """Keeps every (done, total) report and the threads they came from."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.threads: set[str] = set()

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))
        self.threads.add(threading.current_thread().name)


def _counts_up_to(calls: list[tuple[int, int]], total: int) -> None:
    assert calls, "no progress was reported"
    assert {t for _, t in calls} == {total}
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(set(done)) == len(done)  # one report per program
    assert done[0] >= 1 and calls[-1] == (total, total)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_progress_of_a_cold_build_counts_only_what_was_missing(
    ctx: Any, cache: rc.Cache, processes: bool
) -> None:
    sources = generated_sources(6, salt=41 if processes else 42)
    module = OpenCLModule(ctx, sources, cache=cache)
    module.kernel("k0")  # built before: not part of build_all's work
    progress = Recorder()
    assert module.build_all(workers=2, processes=processes, on_progress=progress) == 5
    _counts_up_to(progress.calls, 5)
    assert progress.calls == [(i, 5) for i in range(1, 6)]


def test_progress_of_a_warm_load(ctx: Any, cache: rc.Cache) -> None:
    sources = generated_sources(9, salt=43)
    OpenCLModule(ctx, sources, cache=cache).build_all(workers=1)
    progress = Recorder()
    module = OpenCLModule(ctx, sources, cache=cache)
    assert module.build_all(workers=2, on_progress=progress) == 0  # all loaded from the cache
    assert progress.calls == [(i, 9) for i in range(1, 10)]
    data = np.arange(8, dtype=np.float32)
    out = run_kernel(ctx, module.kernel("k8"), data)
    np.testing.assert_array_equal(out, data * 10 + 43)


def test_nothing_missing_reports_nothing(ctx: Any, cache: rc.Cache) -> None:
    module = OpenCLModule(ctx, generated_sources(2, salt=44), cache=cache)
    module.build_all()
    progress = Recorder()
    assert module.build_all(on_progress=progress) == 0
    assert progress.calls == []


def test_a_failing_callback_does_not_stop_the_build(
    ctx: Any, cache: rc.Cache, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[int, int]] = []

    def broken(done: int, total: int) -> None:
        calls.append((done, total))
        raise RuntimeError("the terminal went away")

    sources = generated_sources(4, salt=45)
    module = OpenCLModule(ctx, sources, cache=cache)
    with caplog.at_level(logging.WARNING, logger="runtime_cache.opencl.progress"):
        assert module.build_all(workers=2, on_progress=broken) == 4
    assert calls == [(1, 4)]  # called once, then dropped
    assert module.built == sorted(sources)
    assert any("on_progress raised" in r.getMessage() for r in caplog.records)


def test_a_callback_may_ask_for_a_program_another_thread_is_loading(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A program is reported once its name is let go of: a callback that asks for one
    # program while another thread loads it (holding it, and then reporting it) waits
    # for that load, and both go on. Reported while held, the two waited for each other.
    from runtime_cache.opencl import program as program_module

    sources = generated_sources(2, salt=46)
    OpenCLModule(ctx, sources, cache=cache).build_all(workers=1)
    module = OpenCLModule(ctx, sources, cache=cache)
    in_callback = threading.Event()
    loading_k1 = threading.Event()
    real = program_module.create_and_build

    def slow_k1(*args: Any) -> Any:
        if threading.current_thread().name == "k1":
            loading_k1.set()
            in_callback.wait(10)
        return real(*args)

    monkeypatch.setattr(program_module, "create_and_build", slow_k1)
    other = threading.Thread(target=module.program, args=("k1",), name="k1", daemon=True)
    other.start()
    assert loading_k1.wait(10)  # the other thread holds k1, loading it
    asked: list[Any] = []

    def ask_for_k1(done: int, total: int) -> None:
        if not in_callback.is_set():
            in_callback.set()
            asked.append(module.program("k1"))

    finished = threading.Thread(
        target=module.build_all, kwargs={"workers": 1, "on_progress": ask_for_k1}, daemon=True
    )
    finished.start()
    finished.join(20)
    other.join(20)
    assert not finished.is_alive() and not other.is_alive(), "the callback and the load hung"
    assert asked and asked[0] is module.program("k1")


def test_a_callback_asking_for_programs_of_a_build_in_processes_never_hangs(
    ctx: Any, cache: rc.Cache
) -> None:
    # The callback asks for programs still in the worker processes: it waits for their
    # results, which reach the module on other threads, and the build ends.
    sources = generated_sources(4, salt=47)
    module = OpenCLModule(ctx, sources, cache=cache)
    asked: list[str] = []

    def ask_for_all(done: int, total: int) -> None:
        for name in sorted(sources):
            module.program(name)
            asked.append(name)

    build = threading.Thread(
        target=module.build_all,
        kwargs={"workers": 2, "processes": True, "on_progress": ask_for_all},
        daemon=True,
    )
    build.start()
    build.join(120)
    assert not build.is_alive(), "the build hung"
    assert module.built == sorted(sources)
    data = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, module.kernel("k3"), data), data * 5 + 47)


def _in_callback_on_a_thread(progress_of: Any, name: str, calls: list[Any]) -> threading.Thread:
    """Start a thread that lands ``name``; return once it is inside the callback."""
    thread = threading.Thread(target=progress_of.landed, args=(name,))
    thread.start()
    while not calls:
        threading.Event().wait(0.001)
    return thread


def test_a_thread_makes_no_reports_of_programs_that_landed_after_its_own() -> None:
    # helper-85: a thread that only asked for a program made all 20 of a build's reports.
    from runtime_cache.opencl.progress import BuildProgress

    calls: list[tuple[int, str]] = []
    go_on = threading.Event()

    def slow(done: int, total: int) -> None:
        calls.append((done, threading.current_thread().name))
        if done == 1:
            assert go_on.wait(10)

    progress = BuildProgress(slow, ["a", "b", "c"])
    first = _in_callback_on_a_thread(progress, "a", calls)
    progress.landed("b")  # neither waits for the callback under way:
    progress.landed("c")  # both are left queued
    go_on.set()
    first.join(10)
    assert [done for done, _ in calls] == [1]  # that thread reported its own only
    progress.finish()
    assert [done for done, _ in calls] == [1, 2, 3]
    assert {who for done, who in calls if done > 1} == {threading.current_thread().name}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_finish_makes_the_reports_left_by_a_callback_that_ended_its_thread() -> None:
    # helper-85: a callback that left with SystemExit, as finish() waited, lost (2, 2).
    from runtime_cache.opencl.progress import BuildProgress

    calls: list[tuple[int, int]] = []
    go_on = threading.Event()

    def leaves(done: int, total: int) -> None:
        calls.append((done, total))
        if done == 1:
            assert go_on.wait(10)
            raise SystemExit  # ends that thread, quietly

    progress = BuildProgress(leaves, ["a", "b"])
    first = _in_callback_on_a_thread(progress, "a", calls)
    progress.landed("b")
    threading.Timer(0.05, go_on.set).start()
    progress.finish()  # waits for the thread in the callback, then reports what is left
    first.join(10)
    assert calls == [(1, 2), (2, 2)]


def test_a_callback_may_run_a_build_all_of_another_module(ctx: Any, cache: rc.Cache) -> None:
    """A progress callback that builds a second module (nested ``build_all``, with its own
    callback) neither hangs nor mixes the two builds' reports."""
    inner_sources = generated_sources(4, salt=53)
    outer, inner = Recorder(), Recorder()
    nested: list[int] = []

    def on_outer(done: int, total: int) -> None:
        outer(done, total)
        if not nested:
            module = OpenCLModule(ctx, inner_sources, cache=cache)
            nested.append(module.build_all(workers=2, on_progress=inner))

    module = OpenCLModule(ctx, generated_sources(6, salt=59), cache=cache)
    assert module.build_all(workers=2, on_progress=on_outer) == 6
    assert nested == [4]
    _counts_up_to(outer.calls, 6)
    _counts_up_to(inner.calls, 4)


def test_a_callback_may_run_build_all_of_its_own_module(ctx: Any, cache: rc.Cache) -> None:
    """A callback that calls ``build_all()`` of the module being built waits for the
    programs other threads hold and builds the rest; the outer call counts only its own."""
    sources = generated_sources(6, salt=61)
    module = OpenCLModule(ctx, sources, cache=cache)
    nested: list[int] = []
    calls: list[tuple[int, int]] = []

    def on_progress(done: int, total: int) -> None:
        calls.append((done, total))
        if not nested:
            nested.append(module.build_all(workers=1))

    built = module.build_all(workers=2, on_progress=on_progress)
    assert sorted(module.built) == sorted(sources)
    assert built + nested[0] == 6
    _counts_up_to(calls, 6)
