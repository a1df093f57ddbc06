"""Counters of the OpenCL consumer in this process (the cache's own are in ``Cache.stats()``)."""

from __future__ import annotations

from dataclasses import dataclass

from ..stats import Counters

__all__ = ["OpenCLStats", "opencl_stats", "reset_opencl_stats"]


@dataclass(frozen=True)
class OpenCLStats:
    """What the OpenCL consumer did in this process.

    ``binary_loads`` counts programs created from cached or bundled binaries;
    ``source_builds`` programs built from source; ``rejected_binaries`` cached
    binaries the driver refused (evicted, then rebuilt from source);
    ``uncacheable`` builds not cached because an ``#include`` could not be
    resolved to a file this process can read and hash; ``recaptured``
    binaries re-stored by :func:`recapture_binaries` because they changed;
    ``vetted`` programs whose binaries of unknown origin a vetting child
    loaded cleanly, and ``vet_failures`` those it could not load (refused, or
    the driver crashed: blocklisted, then rebuilt from source); ``vet_local``
    programs a vetting child could not vet for reasons of its own (a full
    disk: built from source, nothing blocklisted or evicted). See
    :mod:`runtime_cache.opencl.vetting`. ``compile_cpu_seconds`` is the CPU
    time of the source builds that ``build_all`` ran in worker processes or
    on its own threads (measured where the build runs).
    ``driver_files_published`` counts programs whose driver files a build
    stored, ``driver_files_restored`` programs whose stored driver files were
    added to this process's driver folder before their binaries loaded, and
    ``driver_files_dropped`` malformed sets deleted (see
    :mod:`runtime_cache.opencl.program_files`). ``store_errors`` counts programs
    whose binaries :func:`install`'s background store failed to read or
    store, and ``stores_dropped`` those still queued when the flush at exit
    ran out of time (:mod:`runtime_cache.opencl.write_behind`); ``stores_handed_off``
    those handed at exit to a detached process that stores them after this one has
    exited (:mod:`runtime_cache.opencl.detached_store`). ``loaded_ahead`` counts
    programs a lazy module's read-ahead thread loaded, and ``loaded_ahead_used`` those of
    them asked for since (:mod:`runtime_cache.opencl.prefetch`): the rest were loaded for
    nobody, or wait to be asked for.
    """

    binary_loads: int = 0
    source_builds: int = 0
    rejected_binaries: int = 0
    uncacheable: int = 0
    recaptured: int = 0
    vetted: int = 0
    vet_failures: int = 0
    vet_local: int = 0
    compile_cpu_seconds: float = 0.0
    driver_files_published: int = 0
    driver_files_restored: int = 0
    driver_files_dropped: int = 0
    store_errors: int = 0
    stores_dropped: int = 0
    stores_handed_off: int = 0
    loaded_ahead: int = 0
    loaded_ahead_used: int = 0


counters = Counters(OpenCLStats)


def opencl_stats() -> OpenCLStats:
    """A snapshot of the OpenCL consumer's counters in this process."""
    return counters.snapshot()


def reset_opencl_stats() -> None:
    """Set the OpenCL consumer's counters back to zero."""
    counters.reset()
