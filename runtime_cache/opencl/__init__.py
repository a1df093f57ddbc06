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
:mod:`runtime_cache.opencl.icd`). Importing it loads little else: each name
below loads its module at first use (PEP 562), so a program that imports it
and calls :func:`install` but builds nothing pays next to nothing. Looking up
:class:`OpenCLModule` or :func:`build_program` also imports the default
cache's backend class, so that the first program does not pay for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import lazy_exports as _exports
from . import pocl_flags as pocl_flags  # (imported early, to see the variable: see there)
from .icd import expose_intel_runtime
from .install import driver_cache_wanted, flush, install, installed, is_installed, uninstall

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time they load on first use
    from .capture import recapture_binaries
    from .counters import OpenCLStats, opencl_stats, reset_opencl_stats
    from .detached_store import detached_runs, wait_for_detached_stores
    from .devices import NoWorkingDeviceError, choose_device
    from .driver_cache import PURPOSE as DRIVER_CACHE_PURPOSE
    from .driver_cache import driver_cache_enabled as driver_cache_enabled  # not in __all__
    from .driver_cache import prepare as prepare_driver_cache
    from .fingerprint import device_fingerprint
    from .module import OpenCLModule
    from .program import PURPOSE, RUNTIME, build_program

# Before pyopencl's first platform query (nothing imported above makes one).
expose_intel_runtime()

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

# Exported name -> (module in this package, its name there). install.py is imported
# above, not here: its module and its function share the name ``install``.
_LAZY = {
    "DRIVER_CACHE_PURPOSE": ("driver_cache", "PURPOSE"),
    "PURPOSE": ("program", "PURPOSE"),
    "RUNTIME": ("program", "RUNTIME"),
    "NoWorkingDeviceError": ("devices", "NoWorkingDeviceError"),
    "OpenCLModule": ("module", "OpenCLModule"),
    "OpenCLStats": ("counters", "OpenCLStats"),
    "build_program": ("program", "build_program"),
    "choose_device": ("devices", "choose_device"),
    "detached_runs": ("detached_store", "detached_runs"),
    "device_fingerprint": ("fingerprint", "device_fingerprint"),
    "driver_cache_enabled": ("driver_cache", "driver_cache_enabled"),
    "opencl_stats": ("counters", "opencl_stats"),
    "prepare_driver_cache": ("driver_cache", "prepare"),
    "recapture_binaries": ("capture", "recapture_binaries"),
    "reset_opencl_stats": ("counters", "reset_opencl_stats"),
    "wait_for_detached_stores": ("detached_store", "wait_for_detached_stores"),
}
#: Names whose use opens the default cache: their look-up also imports its backend class.
_OPENS_THE_CACHE = frozenset({"OpenCLModule", "build_program"})


def _loaded(name: str) -> None:
    if name in _OPENS_THE_CACHE:
        from ..provider import preload_default_backend

        preload_default_backend()


__getattr__, __dir__ = _exports.lazy_exports(__name__, _LAZY, globals(), _loaded)


if driver_cache_wanted():
    # The drivers read their folder variables when they start: set them as early as we can.
    from . import driver_cache

    driver_cache.prepare()
