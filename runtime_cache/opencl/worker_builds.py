"""Build a module's programs in worker processes, alone or with the other processes of a fleet.

:class:`~runtime_cache.opencl.OpenCLModule` hands these functions a
:class:`BuildHooks`: what a builder needs from the module.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..cache import Cache
from .counters import counters
from .parallel import Job, WorkerResult, build_in_processes
from .plan import ProgramPlan
from .program import load_from_binaries, store_binaries
from .sharing import Claims, build_claimed

__all__ = ["PROCESS_THRESHOLD", "BuildHooks", "build_claims", "build_in_workers"]

log = logging.getLogger(__name__)

#: ``build_all`` uses worker processes when at least this many programs per worker need a build.
PROCESS_THRESHOLD = 4


@dataclass(frozen=True)
class BuildHooks:
    """What the builders need from a module: its programs' sources and plans, and where
    built programs go (``adopt(name, program, seconds)``)."""

    context: Any
    cache: Cache
    sources: Mapping[str, str | bytes]
    options: list[str]
    plan_of: Callable[[str], ProgramPlan]
    adopt: Callable[[str, Any, float], None]
    build_here: Callable[[str], None]
    is_built: Callable[[str], bool]


def build_in_workers(
    hooks: BuildHooks,
    names: list[str],
    workers: int,
    next_name: Callable[[], str | None] | None = None,
    done: Callable[[str], None] | None = None,
) -> None:
    """Build ``names`` in ``workers`` processes (or the names ``next_name()`` hands out,
    which the caller adds to ``names``, until it answers ``None``).

    Each result is loaded into the context, stored in the cache and adopted;
    ``done(name)`` follows once its binaries were stored. A result whose option
    string differs from the plan's, or that the driver refuses, and whatever of
    ``names`` is not built when the workers end (a broken pool logs a warning),
    is built here with ``hooks.build_here``.
    """
    devices = list(hooks.context.devices)

    def job() -> Job | None:
        name = next_name() if next_name is not None else None
        return None if name is None else (name, hooks.sources[name], hooks.options)

    jobs = job if next_name is not None else [(n, hooks.sources[n], hooks.options) for n in names]

    def accept(result: WorkerResult) -> bool:
        name, binaries, seconds, options_text = result
        plan = hooks.plan_of(name)
        if binaries is None or options_text != plan.options_text:
            return False
        program = load_from_binaries(hooks.context, plan, binaries)
        if program is None:
            return False
        counters.add(source_builds=1)
        if plan.keys is None:
            counters.add(uncacheable=1)
        else:
            store_binaries(hooks.cache, plan, program, binaries, seconds)
        hooks.adopt(name, program, seconds)
        if done is not None:
            done(name)
        return True

    try:
        left = build_in_processes(devices, jobs, workers, accept)
    except Exception as exc:  # a broken pool must not stop the build
        log.warning("runtime-cache: worker processes failed (%s); building here", exc)
        left = []
    left += [n for n in names if not hooks.is_built(n) and n not in left]
    for name in left:
        try:
            hooks.build_here(name)
        finally:
            if done is not None:
                done(name)


def build_claims(hooks: BuildHooks, claims: Claims, workers: int, processes: bool) -> list[str]:
    """Build the programs ``claims`` hands out (see :func:`.sharing.build_claimed`)."""

    def in_processes(taken: list[str], next_name: Callable[[], str | None]) -> None:
        build_in_workers(hooks, taken, workers, next_name, claims.done)

    many = in_processes if processes else None
    return build_claimed(claims, workers, hooks.build_here, many, PROCESS_THRESHOLD)
