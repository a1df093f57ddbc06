"""install(): a Program built again with other options stores and serves only what each
build made.

A program built through ``install()`` and built again (pyopencl allows ``build()`` twice
on one ``Program``) once stored the second build's binary under the first build's key
when its store was queued, and on a cache hit built the program made from binaries again
(PoCL 3.1 aborted the process; pip's PoCL 3.0 kept the first build's code).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from opencl_support import opencl_context

import runtime_cache as rc
from runtime_cache.opencl import flush, install, opencl_stats, recapture_binaries, uninstall

pytestmark = pytest.mark.opencl

SOURCE = """
#ifndef VAL
#define VAL 1
#endif
__kernel void value(__global float *out) { out[0] = VAL; }
"""


def _value(ctx: Any, program: Any) -> float:
    import pyopencl as cl

    queue = cl.CommandQueue(ctx)
    out = np.zeros(1, np.float32)
    buffer = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=out)
    cl.Kernel(program, "value")(queue, (1,), None, buffer)
    cl.enqueue_copy(queue, out, buffer)
    queue.finish()
    return float(out[0])


def _fresh_value(cache: rc.Cache, options: str | None = None) -> float:
    """The value a new context's build with ``options`` gives (from the cache if stored)."""
    import pyopencl as cl

    ctx = opencl_context()
    return _value(ctx, cl.Program(ctx, SOURCE).build(options=options))


@pytest.mark.parametrize("store", ["deferred", "background"])
def test_a_queued_store_keeps_the_first_builds_binary(
    cache: rc.Cache, store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyopencl as cl

    monkeypatch.setenv("RUNTIME_CACHE_OPENCL_STORE_DELAY", "0")
    install(cache, store=store)
    try:
        ctx = opencl_context()
        program = cl.Program(ctx, SOURCE).build()
        assert _value(ctx, program) == 1.0
        program.build(options="-DVAL=42")  # before the first build's binaries are stored
        assert _value(ctx, program) == 42.0
        assert recapture_binaries(program) == 0  # its first build's key is not its own now
        assert flush(60.0)
        assert cache.stats().stores == 2
        loads = opencl_stats().binary_loads
        assert _fresh_value(cache) == 1.0
        assert _fresh_value(cache, "-DVAL=42") == 42.0
        assert opencl_stats().binary_loads == loads + 2  # both from the cache
    finally:
        uninstall()


def test_a_program_from_the_cache_built_again_builds_the_new_options(cache: rc.Cache) -> None:
    import pyopencl as cl

    install(cache, store="inline")
    try:
        assert _fresh_value(cache) == 1.0  # stored
        ctx = opencl_context()
        program = cl.Program(ctx, SOURCE).build()  # from the cache: made from its binary
        assert opencl_stats().binary_loads == 1
        assert _value(ctx, program) == 1.0
        builds = opencl_stats().source_builds
        program.build(options="-DVAL=42")
        assert opencl_stats().source_builds == builds + 1
        assert _value(ctx, program) == 42.0
        program.build()  # and back: the first build's binary, from the cache
        assert opencl_stats().binary_loads == 2
        assert _value(ctx, program) == 1.0
        assert _fresh_value(cache, "-DVAL=42") == 42.0
    finally:
        uninstall()


def test_a_build_again_on_another_thread_waits_for_this_one(
    cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the fix: another thread's build again, between this build and the
    note of the program it made, had this build's key store that thread's binary (5 of 20
    sources on PoCL 3.1). A second build of one Program now waits for the first."""
    import threading

    import pyopencl as cl

    from runtime_cache.opencl.counters import counters

    install(cache)
    try:
        ctx = opencl_context()
        program = cl.Program(ctx, SOURCE)
        others: list[threading.Thread] = []
        add = counters.add

        def add_then_build_elsewhere(**counts: int) -> None:
            add(**counts)
            if counts.get("source_builds") and not others:
                other = threading.Thread(target=program.build, kwargs={"options": "-DVAL=42"})
                others.append(other)
                other.start()
                other.join(0.5)  # it waits for this build to be noted and queued

        monkeypatch.setattr(counters, "add", add_then_build_elsewhere)
        program.build()
        others[0].join(60.0)
        monkeypatch.undo()
        assert _value(ctx, program) == 42.0
        assert flush(60.0)
        assert _fresh_value(cache) == 1.0
        assert _fresh_value(cache, "-DVAL=42") == 42.0
    finally:
        uninstall()
