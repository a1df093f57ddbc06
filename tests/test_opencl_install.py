"""install(): pyopencl's own builds (arrays, elementwise, reductions) through the cache."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from opencl_support import opencl_context

import runtime_cache as rc
from runtime_cache.opencl import (
    flush,
    install,
    installed,
    is_installed,
    opencl_stats,
    uninstall,
)

pytestmark = pytest.mark.opencl

try:
    import mako  # noqa: F401

    HAVE_MAKO = True
except ImportError:
    HAVE_MAKO = False


def _workload(ctx: Any) -> dict[str, np.ndarray]:
    import pyopencl as cl
    import pyopencl.array as cla
    from pyopencl.elementwise import ElementwiseKernel

    queue = cl.CommandQueue(ctx)
    a = np.linspace(-1, 1, 1000).astype(np.float32)
    b = np.arange(1000, dtype=np.float32)
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    axpb = ElementwiseKernel(ctx, "float *out, float *x, float *y", "out[i] = 3 * x[i] + y[i]")
    out = cla.empty_like(da)
    axpb(out, da, db)
    results = {"array": (2 * da + db * db - 1).get(), "elementwise": out.get()}
    if HAVE_MAKO:  # pyopencl's reduction kernels are Mako templates
        results["sum"] = np.array(cla.sum(db).get())
    return results


def _expected() -> dict[str, np.ndarray]:
    a = np.linspace(-1, 1, 1000).astype(np.float32)
    b = np.arange(1000, dtype=np.float32)
    return {
        "array": 2 * a + b * b - 1,
        "elementwise": 3 * a + b,
        **({"sum": np.array(b.sum())} if HAVE_MAKO else {}),
    }


def _assert_matches(got: dict[str, np.ndarray]) -> None:
    for name, want in _expected().items():
        np.testing.assert_allclose(got[name], want, rtol=1e-5, err_msg=name)


def test_pyopencl_generated_kernels_go_through_the_cache(cache: rc.Cache) -> None:
    import pyopencl as cl

    original = cl.Program.build
    with installed(cache):
        assert is_installed()
        first = _workload(opencl_context())
        cold = opencl_stats()
        assert cold.source_builds > 0
        assert flush(60.0)
        assert cache.stats().stores == cold.source_builds
        # A new context: pyopencl's in-process memo misses, our cache hits.
        second = _workload(opencl_context())
        warm = opencl_stats()
    assert cl.Program.build is original
    assert not is_installed()
    assert warm.source_builds == cold.source_builds
    assert warm.binary_loads - cold.binary_loads == cold.source_builds
    _assert_matches(first)
    _assert_matches(second)
    assert first.keys() == second.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], second[name])


def test_build_failure_raises_pyopencls_error_with_log(cache: rc.Cache) -> None:
    import pyopencl as cl

    ctx = opencl_context()
    with installed(cache), pytest.raises(cl.RuntimeError) as caught:
        cl.Program(ctx, "__kernel void bad(__global int *a) { a[0] = undefined_name; }").build()
    assert "undefined_name" in str(caught.value)
    assert cache.stats().stores == 0


def test_install_twice_and_uninstall(cache: rc.Cache) -> None:
    import pyopencl as cl

    original = cl.Program.build
    install(cache)
    install(cache)
    try:
        assert cl.Program.build is not original
        assert cl.Program.build.__wrapped__ is original  # type: ignore[attr-defined]
        ctx = opencl_context()
        src = "__kernel void one(__global int *a) { a[get_global_id(0)] = 1; }"
        cl.Program(ctx, src).build()
        assert flush(60.0)
        cl.Program(ctx, src).build()
        assert opencl_stats().binary_loads == 1
        # Programs from binaries are pyopencl's business: passed through untouched.
        binary = cl.Program(ctx, src).build().get_info(cl.program_info.BINARIES)
        cl.Program(ctx, ctx.devices, binary).build()
        assert opencl_stats().binary_loads == 2
    finally:
        assert uninstall() is True
    assert uninstall() is False
    assert cl.Program.build is original


def test_a_deferred_store_after_a_chdir_stores_the_build(
    cache: rc.Cache, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the header check: the deferred store read the headers again at flush
    time, in whatever folder the app was in then: a relative ``-I`` named nothing there, and
    a good binary was dropped as "a header changed during the build"."""
    import pyopencl as cl

    (tmp_path / "proj" / "inc").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "proj" / "inc" / "val.h").write_text("#define VAL 3.0f\n")
    src = '#include "val.h"\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }'
    monkeypatch.chdir(tmp_path / "proj")
    install(cache)
    try:
        cl.Program(opencl_context(), src).build(options=["-I", "inc"])
        monkeypatch.chdir(tmp_path / "out")  # the app moves on before the store
        assert flush(60.0)
    finally:
        uninstall()
    assert cache.stats().stores == 1 and opencl_stats().uncacheable == 0
