"""Import pyopencl on first use, with an error that names the pip extra when it is missing."""

from __future__ import annotations

from types import ModuleType

from ..errors import MissingDependencyError

__all__ = ["import_pyopencl"]


def import_pyopencl() -> ModuleType:
    """Return the ``pyopencl`` module, or raise :class:`MissingDependencyError`."""
    try:
        import pyopencl
    except ImportError as exc:
        raise MissingDependencyError(
            f"runtime_cache.opencl needs pyopencl: pip install 'runtime-cache[opencl]' ({exc})"
        ) from exc
    return pyopencl
