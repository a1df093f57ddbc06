"""Kernels and a launcher shared by the OpenCL tests and the OpenCL fuzz target.

No pytest imports here: the fuzz runner and its child processes import it too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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


def scale_works(ctx: Any, program: Any, factor: float) -> bool:
    """Whether ``program.scale`` multiplies 16 floats by ``factor`` exactly."""
    data = np.arange(16, dtype=np.float32)
    got = run_kernel(ctx, program.scale, data, np.float32(factor))
    return bool(np.array_equal(got, data * np.float32(factor)))
