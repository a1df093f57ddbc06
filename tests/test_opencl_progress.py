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
