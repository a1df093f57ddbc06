"""install(): binaries stored off the caller's path, exit flush, errors, cache_dir, random and
complex kernels from the cache in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import opencl_context

import runtime_cache as rc
from runtime_cache.backends import CallbackBackend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.errors import InvalidValueError
from runtime_cache.keys import module_id_from_sources
from runtime_cache.opencl import (
    flush,
    install,
    installed,
    opencl_stats,
    reset_opencl_stats,
    uninstall,
)
from runtime_cache.opencl.program import plan_program
from runtime_cache.opencl.write_behind import ENV_STORE_DELAY, write_behind

pytestmark = pytest.mark.opencl

SRC = "__kernel void wb(__global int *a) { a[get_global_id(0)] = 41 + %d; }"


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[rc.Cache]:
    reset_opencl_stats()
    yield rc.Cache(DirectoryBackend(tmp_path / "cache"))
    assert flush(120.0)


def _driver_binary(program: Any) -> bytes:
    import pyopencl as cl

    return bytes(program.get_info(cl.program_info.BINARIES)[0])


def test_build_returns_before_the_binary_is_read(cache: rc.Cache) -> None:
    import pyopencl as cl

    ctx = opencl_context()
    src = SRC % os.getpid()
    with installed(cache):
        program = cl.Program(ctx, src).build()
        assert opencl_stats().source_builds == 1
        assert write_behind.pending() == 1
        assert cache.stats().stores == 0, "the build must not wait for the read-back"
        # Built again before it was stored: a source build, not a second queued store.
        cl.Program(ctx, src).build()
        assert write_behind.pending() == 1
        started = time.perf_counter()
        assert flush(120.0)
        assert time.perf_counter() - started < 120
    assert cache.stats().stores == 1
    plan = plan_program(ctx, src, module_id=module_id_from_sources(src, name="pyopencl"))
    assert plan.keys is not None
    # Exactly the driver's bytes, and the entry passes the cache's check on the way out.
    assert cache.get(plan.keys[0]) == _driver_binary(program)
    with installed(cache):
        cl.Program(ctx, src).build()
    assert opencl_stats().binary_loads == 1


def test_background_store_once_the_caller_is_quiet(
    cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyopencl as cl

    monkeypatch.setenv(ENV_STORE_DELAY, "0.05")
    ctx = opencl_context()
    install(cache, store="background")
    try:
        cl.Program(ctx, SRC % (os.getpid() + 1)).build()
        deadline = time.monotonic() + 120
        while cache.stats().stores == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # no OpenCL call meanwhile: PoCL 3.1 is not safe with that
    finally:
        uninstall()
    assert cache.stats().stores == 1
    with pytest.raises(InvalidValueError, match="store='later'"):
        install(cache, store="later")


def test_a_store_the_cache_refuses_is_counted_too(tmp_path: Path) -> None:
    """Not strict (as apps run): the failed write is no exception, but still a store error."""
    import pyopencl as cl

    reset_opencl_stats()

    def refuse(key: str, value: bytes) -> None:
        raise OSError("disk full")

    lenient = rc.Cache(CallbackBackend(lambda key: None, refuse))
    with installed(lenient):
        cl.Program(opencl_context(), SRC % (os.getpid() + 3)).build()
        assert flush(120.0)
    assert opencl_stats().store_errors == 1 and lenient.stats().errors == 1


def test_an_error_on_the_store_thread_is_counted_not_raised(tmp_path: Path) -> None:
    import pyopencl as cl

    reset_opencl_stats()

    def refuse(key: str, value: bytes) -> None:
        raise OSError("disk full")

    strict = rc.Cache(CallbackBackend(lambda key: None, refuse), strict=True)
    ctx = opencl_context()
    with installed(strict):
        program = cl.Program(ctx, SRC % (os.getpid() + 2)).build()
        assert flush(120.0)
    assert opencl_stats().store_errors == 1
    queue = cl.CommandQueue(ctx)
    out = np.zeros(4, dtype=np.int32)
    buf = cl.Buffer(ctx, cl.mem_flags.WRITE_ONLY, out.nbytes)
    program.wb(queue, out.shape, None, buf)
    cl.enqueue_copy(queue, out, buf)
    assert (out == 41 + os.getpid() + 2).all()


def test_an_explicit_cache_dir_goes_to_pyopencls_own_cache(cache: rc.Cache, tmp_path: Path) -> None:
    import pyopencl as cl
    from pyopencl.characterize import has_src_build_cache

    ctx = opencl_context()
    folder = tmp_path / "pyopencl-cache"
    with installed(cache):
        program = cl.Program(ctx, SRC % (os.getpid() + 3)).build(cache_dir=str(folder))
        assert flush(120.0)
        stats = opencl_stats()
        assert (stats.source_builds, stats.binary_loads) == (0, 0)
        assert cache.stats().stores == 0 and cache.stats().misses == 0
        assert program.wb is not None
        if not has_src_build_cache(ctx.devices[0]):  # pyopencl caches on this driver
            assert any(folder.rglob("*"))
        cl.Program(ctx, SRC % (os.getpid() + 3)).build(cache_dir=False)  # False: ours
        assert opencl_stats().source_builds == 1


EXIT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import choose_device, install
    install(rc.Cache(DirectoryBackend(sys.argv[1])))
    ctx = cl.Context([choose_device()])
    cl.Program(ctx, "__kernel void e(__global int *a) { a[0] = %s; }" % sys.argv[2]).build()
    print(time.perf_counter(), flush=True)
    """
)


def _exit_run(folder: Path, salt: str, **env: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(folder), salt],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, POCL_KERNEL_CACHE="0", **env),
    )
    assert done.returncode == 0, done.stderr
    return time.perf_counter() - started, done.stderr


def test_the_flush_at_exit_stores_the_queue_and_is_bounded(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    salt = str(os.getpid())
    # Deferred, and not handed to a detached store: the flush at exit stores it.
    _exit_run(folder, salt, RUNTIME_CACHE_OPENCL_DETACH="0")
    assert len(list(DirectoryBackend(folder).keys())) == 1
    # A flush bound of 0 s: exit does not wait; what is left is logged and counted.
    seconds, err = _exit_run(
        tmp_path / "other",
        salt + "1",
        RUNTIME_CACHE_OPENCL_FLUSH_SECONDS="0",
        RUNTIME_CACHE_OPENCL_DETACH="0",
    )
    assert "were not stored" in err
    assert not list(DirectoryBackend(tmp_path / "other").keys())
    assert seconds < 120


RANDOM_AND_COMPLEX = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla
    import pyopencl.clrandom as clrandom
    import pyopencl.clmath as clmath
    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import choose_device, flush, install, opencl_stats
    install(rc.Cache(DirectoryBackend(sys.argv[1])))
    ctx = cl.Context([choose_device()])
    queue = cl.CommandQueue(ctx)
    out = {}
    for gen in (clrandom.PhiloxGenerator, clrandom.ThreefryGenerator):
        g = gen(ctx, seed=12)
        out[gen.__name__] = float(g.uniform(queue, 1000, np.float32).get().sum())
        out[gen.__name__ + "-normal"] = float(g.normal(queue, 1000, np.float64).get().sum())
    out["rand"] = float(clrandom.rand(queue, 1000, np.float32, luxury=None).get().shape[0])
    for dtype in (np.complex64, np.complex128):
        host = (np.arange(64) + 1j * np.arange(64)[::-1]).astype(dtype)
        a = cla.to_device(queue, host)
        b = (a * a + 2 * a.conj() - a / (a + 1)).get()
        out[str(dtype)] = [float(abs(b).sum()), float(abs(clmath.exp(a * 0.01).get()).sum())]
    assert flush(300.0)
    s = opencl_stats()
    print(json.dumps({"out": out, "loads": s.binary_loads, "builds": s.source_builds,
                      "uncacheable": s.uncacheable}))
    """
)


def test_random_and_complex_kernels_load_from_the_cache_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    pytest.importorskip("mako")  # pyopencl's reductions and random kernels are templates
    folder = tmp_path / "cache"
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", RANDOM_AND_COMPLEX, str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, POCL_KERNEL_CACHE="0"),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["uncacheable"] == 0 and cold["builds"] > 0
    assert warm["uncacheable"] == 0
    assert warm["builds"] == 0 and warm["loads"] == cold["builds"] + cold["loads"]
    assert warm["out"] == cold["out"]


def test_the_read_without_the_gil_gives_pyopencls_bytes() -> None:
    import pyopencl as cl

    from runtime_cache.opencl.program import read_binaries
    from runtime_cache.opencl.readback import read_binaries_released

    ctx = opencl_context()
    program = cl.Program(ctx, SRC % (os.getpid() + 4)).build(cache_dir=False)
    devices = list(ctx.devices)
    assert read_binaries_released(cl, program, devices) == read_binaries(cl, program, devices)
    assert read_binaries_released(cl, program, devices)[0].startswith(_driver_binary(program)[:4])
