"""OpenCL consumer of runtime-cache: program binaries on pyopencl.

An app's first run on a device builds its programs from source and stores
the binaries; every later run (any process sharing the cache) loads them.

* :func:`build_program` builds one program through the cache.
* :class:`OpenCLModule` keeps one program per kernel, builds them lazily or
  all at once in parallel, and exports/imports pre-compiled bundles.
* :func:`install` / :func:`uninstall` route pyopencl's own ``Program.build``
  (and the kernels pyopencl generates) through the cache.
* :func:`prepare_driver_cache` (or ``RUNTIME_CACHE_DRIVER_CACHE=1``, which runs
  it on import) points the drivers at folders whose JIT output travels through
  the cache too (:mod:`.driver_cache`).
* :func:`recapture_binaries` re-stores binaries that drivers finish only at
  the first launch.

pyopencl is imported on first use; without it these raise
:class:`runtime_cache.errors.MissingDependencyError`.
"""

from __future__ import annotations

from .capture import recapture_binaries
from .counters import OpenCLStats, opencl_stats, reset_opencl_stats
from .driver_cache import PURPOSE as DRIVER_CACHE_PURPOSE
from .driver_cache import driver_cache_enabled
from .driver_cache import prepare as prepare_driver_cache
from .fingerprint import device_fingerprint
from .install import install, installed, is_installed, uninstall
from .module import OpenCLModule
from .program import PURPOSE, RUNTIME, build_program

__all__ = [
    "DRIVER_CACHE_PURPOSE",
    "PURPOSE",
    "RUNTIME",
    "OpenCLModule",
    "OpenCLStats",
    "build_program",
    "device_fingerprint",
    "install",
    "installed",
    "is_installed",
    "opencl_stats",
    "prepare_driver_cache",
    "recapture_binaries",
    "reset_opencl_stats",
    "uninstall",
]

if driver_cache_enabled():
    # The drivers read their folder variables when they start: set them as early as we can.
    prepare_driver_cache()
