"""OpenCL consumer of runtime-cache: program binaries on pyopencl.

An app's first run on a device builds its programs from source and stores
the binaries; every later run (any process sharing the cache) loads them.

* :func:`build_program` builds one program through the cache.
* :class:`OpenCLModule` keeps one program per kernel, builds them lazily or
  all at once in parallel, and exports/imports pre-compiled bundles.
* :func:`install` / :func:`uninstall` route pyopencl's own ``Program.build``
  (and the kernels pyopencl generates) through the cache; :func:`flush` waits
  for its background store, and :func:`wait_for_detached_stores` for the
  detached process that stores what is left at exit (:mod:`.detached_store`).
* :func:`prepare_driver_cache` (or ``RUNTIME_CACHE_DRIVER_CACHE=1``, which runs
  it on import) points the drivers at folders whose JIT output travels through
  the cache too (:mod:`.driver_cache`).
* :func:`recapture_binaries` re-stores binaries that drivers finish only at
  the first launch.

* :func:`choose_device` picks the device: an explicit choice, else
  ``PYOPENCL_CTX``, else the first device that can actually build.

pyopencl is imported on first use; without it these raise
:class:`runtime_cache.errors.MissingDependencyError`. Importing this package
makes Intel's CPU runtime from PyPI (the ``intel`` extra) visible to the ICD
loader, before pyopencl reads its platform list (see
:mod:`runtime_cache.opencl.icd`).
"""

from __future__ import annotations

from ..provider import preload_default_backend
from .capture import recapture_binaries
from .counters import OpenCLStats, opencl_stats, reset_opencl_stats
from .detached_store import detached_runs, wait_for_detached_stores
from .devices import NoWorkingDeviceError, choose_device
from .driver_cache import PURPOSE as DRIVER_CACHE_PURPOSE
from .driver_cache import driver_cache_enabled
from .driver_cache import prepare as prepare_driver_cache
from .fingerprint import device_fingerprint
from .icd import expose_intel_runtime
from .install import flush, install, installed, is_installed, uninstall
from .module import OpenCLModule
from .program import PURPOSE, RUNTIME, build_program

# Before pyopencl's first platform query (none of the modules above makes one on import).
expose_intel_runtime()
# The default cache's backend class, imported now rather than at the first program.
preload_default_backend()

__all__ = [
    "DRIVER_CACHE_PURPOSE",
    "PURPOSE",
    "RUNTIME",
    "NoWorkingDeviceError",
    "OpenCLModule",
    "OpenCLStats",
    "build_program",
    "choose_device",
    "detached_runs",
    "device_fingerprint",
    "flush",
    "install",
    "installed",
    "is_installed",
    "opencl_stats",
    "prepare_driver_cache",
    "recapture_binaries",
    "reset_opencl_stats",
    "uninstall",
    "wait_for_detached_stores",
]

if driver_cache_enabled():
    # The drivers read their folder variables when they start: set them as early as we can.
    prepare_driver_cache()
