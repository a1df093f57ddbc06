"""A built program whose binaries wait to be stored (:class:`StoreJob`), and the two ways
such a job ends: stored in the calling thread (:func:`store_now`), or handed, with others
of the same store, to a detached process (:func:`group_by_store` says which go together).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..cache import Cache
from ._driver import import_pyopencl
from .plan import ProgramPlan
from .program import store_binaries
from .readback import read_binaries_released

__all__ = ["StoreJob", "driver_program", "group_by_store", "store_now"]


@dataclass(frozen=True)
class StoreJob:
    """One program built from source, queued for its binaries to be stored in ``cache``."""

    cache: Cache
    plan: ProgramPlan
    program: Any
    seconds: float
    made: Any  # the driver's program that this build made (``program._prg`` then)
    background: bool = False  # the background thread may read it back


def driver_program(program: Any) -> Any:
    """The driver's program inside pyopencl's ``program`` (``program._prg``), or itself."""
    return getattr(program, "_prg", None) or program


def store_now(
    cache: Cache, plan: ProgramPlan, program: Any, seconds: float, made: Any = None
) -> bool:
    """Read ``program``'s binaries back and store them, in the calling thread.

    ``made`` is the driver's program that the build ``plan`` describes made
    (``program._prg`` at the time; the default: now). A program built again since
    (:func:`~runtime_cache.opencl.install` gives it a new one) still stores that
    build's binaries, and is not noted for :func:`.recapture_binaries` under ``plan``.
    """
    made = driver_program(program) if made is None else made
    binaries = read_binaries_released(import_pyopencl(), made, plan.devices)
    return store_binaries(cache, plan, program, binaries, seconds, made)


def group_by_store(jobs: list[StoreJob]) -> list[list[StoreJob]]:
    """``jobs`` grouped by the store a detached process would open for them, in order."""
    # By the store (its spec, secret and producer), not by ``Cache`` object: a Pool worker
    # that made a Cache a task started one detached store a task at its end (200 at once
    # for 200 tasks: the review of session 41).
    groups: dict[object, list[StoreJob]] = {}
    stores: dict[int, object] = {}
    for job in jobs:
        cache = job.cache
        if id(cache) not in stores:
            stores[id(cache)] = _store_of(cache)
        groups.setdefault(stores[id(cache)], []).append(job)
    return list(groups.values())


def _store_of(cache: Cache) -> object:
    from .reopen import reopen_spec

    try:
        spec = reopen_spec(cache)
    except Exception:  # (its own hand-off says why)
        spec = None
    if spec is None:
        return ("cache", id(cache))
    text = json.dumps(spec, sort_keys=True, default=repr)
    return ("store", text, cache.secret_keys(), cache.producer)
