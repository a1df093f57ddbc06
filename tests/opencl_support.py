"""Shared by the test_opencl_* files: a context on the driver under test (or an honest skip)
and kernels."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from opencl_kernels import SCALE_SRC, SHIFT_SRC, run_kernel

from conftest import need

__all__ = [
    "SCALE_SRC",
    "SHIFT_SRC",
    "driver",
    "fresh_guard",
    "generated_sources",
    "is_pocl",
    "opencl_context",
    "opencl_device",
    "run_kernel",
    "run_python",
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


def opencl_device() -> Any:
    """The device under test: the one :func:`runtime_cache.opencl.choose_device` picks
    (``PYOPENCL_CTX`` selects the driver in CI's driver matrix), or skip (fail when required)."""
    try:
        import pyopencl  # noqa: F401

        from runtime_cache.opencl import choose_device
    except ImportError as exc:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", f"pyopencl is not installed ({exc})")
    from runtime_cache.errors import RuntimeCacheError

    try:
        return choose_device()
    except RuntimeCacheError as exc:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))


def driver() -> str:
    """The driver under test, as :func:`runtime_cache.opencl.devices.driver_label` names it."""
    from runtime_cache.opencl.devices import driver_label

    return driver_label(opencl_device().platform)


def is_pocl() -> bool:
    """Whether the driver under test is PoCL (any version)."""
    return driver().startswith("PoCL")


def opencl_context() -> Any:
    """A context on the device under test, or skip (fail when required)."""
    import pyopencl as cl

    return cl.Context([opencl_device()])


def fresh_guard(folder: Path) -> Iterator[None]:
    """Zeroed OpenCL counters and a crash guard in ``folder`` (a machine that knows no
    binary yet) for one test; set ``RUNTIME_CACHE_GUARD_DIR`` to ``folder`` first."""
    from runtime_cache.opencl import reset_opencl_stats
    from runtime_cache.opencl.guard import guard

    reset_opencl_stats()
    guard.reset()
    yield
    guard.reset()


def run_python(
    code: str, cwd: Path, env: Mapping[str, str], *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh, isolated interpreter (``-I``: the current folder is not on
    its path) in ``cwd`` with ``env``; its result, whatever the exit status."""
    return subprocess.run(
        [sys.executable, "-I", "-c", code, *argv],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
