"""Shared by the test_opencl_* files: a real PoCL context (or an honest skip) and kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from conftest import need

SCALE_SRC = """
__kernel void scale(__global float *a, const float f) {
    int i = get_global_id(0);
    a[i] = a[i] * f;
}
"""

SHIFT_SRC = """
__kernel void shift(__global float *a, const float s) {
    int i = get_global_id(0);
    a[i] = a[i] + s;
}
"""


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


def run_kernel(ctx: Any, kernel: Any, data: np.ndarray, *scalars: Any) -> np.ndarray:
    """Run ``kernel(buf, *scalars)`` over ``data`` (float32) and return the result."""
    import pyopencl as cl

    queue = cl.CommandQueue(ctx)
    host = np.ascontiguousarray(data, dtype=np.float32)
    mf = cl.mem_flags
    buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
    kernel(queue, host.shape, None, buf, *scalars)
    out = np.empty_like(host)
    cl.enqueue_copy(queue, out, buf)
    queue.finish()
    return out
