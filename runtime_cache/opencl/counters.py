"""Counters of the OpenCL consumer in this process (the cache's own are in ``Cache.stats()``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

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
    :mod:`runtime_cache.opencl.vetting`.
    """

    binary_loads: int = 0
    source_builds: int = 0
    rejected_binaries: int = 0
    uncacheable: int = 0
    recaptured: int = 0
    vetted: int = 0
    vet_failures: int = 0
    vet_local: int = 0


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in fields(OpenCLStats)}

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                self._values[name] += delta

    def snapshot(self) -> OpenCLStats:
        with self._lock:
            return OpenCLStats(**self._values)

    def reset(self) -> None:
        with self._lock:
            for name in self._values:
                self._values[name] = 0


counters = _Counters()


def opencl_stats() -> OpenCLStats:
    """A snapshot of the OpenCL consumer's counters in this process."""
    return counters.snapshot()


def reset_opencl_stats() -> None:
    """Set the OpenCL consumer's counters back to zero."""
    counters.reset()
