"""Shared by the test_opencl_* files: a real PoCL context (or an honest skip) and kernels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opencl_kernels import SCALE_SRC, SHIFT_SRC, run_kernel

from conftest import need

__all__ = [
    "SCALE_SRC",
    "SHIFT_SRC",
    "fresh_guard",
    "generated_sources",
    "opencl_context",
    "run_kernel",
]


def generated_sources(count: int, salt: int = 0) -> dict[str, str]:
    """``count`` distinct small kernels ``k0..``, one program each."""
    return {
        f"k{i}": (
            f"__kernel void k{i}(__global float *a) {{\n"
            f"    int g = get_global_id(0);\n"
            f"    a[g] = a[g] * {i + 2}.0f + {salt}.0f;\n}}\n"
        )
        for i in range(count)
    }


def opencl_context() -> Any:
    """A context on the first OpenCL platform's devices, or skip (fail when required)."""
    try:
        import pyopencl as cl
    except ImportError as exc:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", f"pyopencl is not installed ({exc})")
    try:
        platforms = cl.get_platforms()
    except Exception as exc:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", f"no OpenCL platform ({exc})")
    devices = [d for p in platforms for d in p.get_devices()][:1]
    if not devices:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", "no OpenCL device found")
    return cl.Context(devices)


def fresh_guard(folder: Path) -> Iterator[None]:
    """Zeroed OpenCL counters and a crash guard in ``folder`` (a machine that knows no
    binary yet) for one test; set ``RUNTIME_CACHE_GUARD_DIR`` to ``folder`` first."""
    from runtime_cache.opencl import reset_opencl_stats
    from runtime_cache.opencl.guard import guard

    reset_opencl_stats()
    guard.reset()
    yield
    guard.reset()
