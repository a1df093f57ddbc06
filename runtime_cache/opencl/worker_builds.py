"""Build a module's programs in worker processes, alone or with the other processes of a fleet.

:class:`~runtime_cache.opencl.OpenCLModule` hands these functions a
:class:`BuildHooks`: what a builder needs from the module.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import environment
from ..cache import Cache
from ._driver import import_pyopencl
from .build_inputs import settle, unkeyed
from .cached_load import held
from .counters import counters
from .holdings import Holdings, NameLock
from .parallel import Job, WorkerResult, build_in_processes
from .plan import ProgramPlan
from .pocl_flags import pocl_flags_unknown
from .program import load_from_binaries, read_binaries, source_build, store_binaries
from .program_files import ProgramFiles, with_driver_files
from .sharing import Claims, build_claimed, build_shared

__all__ = [
    "PROCESS_THRESHOLD",
    "BuildHooks",
    "build_claims",
    "build_in_workers",
    "build_module_shared",
    "default_workers",
]

log = logging.getLogger(__name__)

#: ``build_all`` uses worker processes when at least this many programs per worker need a build.
PROCESS_THRESHOLD = 4


def default_workers() -> int:
    """How many builds ``build_all`` runs at once by default: the cores this process may
    run on (its CPU affinity, so a process pinned to 2 cores starts 2 workers), not all
    the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class BuildHooks:
    """What the builders need from a module: its programs' sources and plans, and where
    built programs go (``adopt(name, program, seconds)``). ``name_lock(name)`` is the
    lock ``program()`` holds while it loads or builds a program: a builder holds it too,
    so the two never compile one program at once. ``program_files`` carries each
    program's driver files (see :mod:`.program_files`), or is ``None``."""

    context: Any
    cache: Cache
    sources: Mapping[str, str | bytes]
    options: list[str]
    plan_of: Callable[[str], ProgramPlan]
    adopt: Callable[[str, Any, float], None]
    build_here: Callable[[str], bool]  # whether it built it (not another thread meanwhile)
    is_built: Callable[[str], bool]
    name_lock: Callable[[str], NameLock]
    program_files: ProgramFiles | None = None


def _timed(build_here: Callable[[str], bool]) -> Callable[[str], bool]:
    """``build_here`` that counts its CPU time (this thread's) as compile seconds."""

    def build(name: str) -> bool:
        started = time.thread_time()
        try:
            return build_here(name)
        finally:
            counters.add(compile_cpu_seconds=time.thread_time() - started)

    return build


def build_in_workers(
    hooks: BuildHooks,
    names: list[str],
    workers: int,
    next_name: Callable[[], str | None] | None = None,
    done: Callable[[str], None] | None = None,
) -> int:
    """Build ``names`` in ``workers`` processes (or the names ``next_name()`` hands out,
    which the caller adds to ``names``, until it answers ``None``); return how many this
    call built (not those another thread built meanwhile).

    Each result is loaded into the context, stored in the cache and adopted;
    ``done(name)`` follows once its binaries were stored. A result whose option
    string differs from the plan's, or that the driver refuses, and whatever of
    ``names`` is not built when the workers end (a broken pool logs a warning),
    is built here with ``hooks.build_here``.
    """
    devices = list(hooks.context.devices)

    given = iter(names)
    claim = (hooks.name_lock, hooks.is_built)
    holding: Holdings[held] = Holdings()

    def job() -> Job | None:
        # The next name, its lock held until its result is taken or handed back: a
        # program() call beside build_all() waits for the worker's build, not compiles it
        # too. One it built meanwhile is skipped (with ``done``: it stored the binaries).
        while True:
            if pocl_flags_unknown(devices):  # a worker's PoCL would take other flags than ours
                return None  # (what is left is built here)
            if next_name is not None:
                name = next_name()
            else:
                name = next((n for n in given if not hooks.is_built(n)), None)
            if name is None:
                return None
            hold = held(claim, name)
            if hold.take():  # (waits for a program() call that holds it)
                holding.put(name, hold)
                # Built where its keys were made, not where a chdir since (another
                # thread's) moved this process: the check after reads there too.
                folder = hooks.plan_of(name).folder or environment.working_folder() or ""
                return name, hooks.sources[name], hooks.options, folder
            hold.release()
            if next_name is not None and done is not None:
                done(name)

    files = hooks.program_files
    build_here = _timed(hooks.build_here)

    # Built by a worker and taken here, counted with source_builds: what follows the count
    # may fail (the result is then lost to _serve), but the program was built.
    accepted: list[str] = []  # (list.append: one step under the GIL, from any thread)

    def accept(result: WorkerResult) -> bool:
        try:
            return take_result(result)
        finally:
            holding.release(result[0])

    def take_result(result: WorkerResult) -> bool:
        name, binaries, seconds, options_text, cpu, packed = result
        plan = hooks.plan_of(name)
        counters.add(compile_cpu_seconds=cpu)
        if binaries is None or options_text != plan.options_text:
            return False
        settled = settle(plan, root=plan.folder)  # (where the worker built: see job())
        if files is not None and packed is not None and settled.keys:
            # Stored before the binaries, so whoever finds these finds the files too;
            # added here first, so this load skips the driver's JIT as well.
            files.publish(str(settled.keys[0]), packed)
        program = load_from_binaries(hooks.context, plan, binaries)
        if program is None:
            return False
        counters.add(source_builds=1)
        accepted.append(name)
        if plan.keys is None:
            counters.add(uncacheable=1)
        elif settled.keys is None:
            unkeyed.add(program)
        else:
            store_binaries(hooks.cache, settled, program, binaries, seconds)
        hooks.adopt(name, program, seconds)
        if done is not None:
            done(name)
        return True

    env = files.worker_env if files is not None else None
    try:
        count = workers if next_name is not None else min(workers, len(names))
        left = build_in_processes(devices, job, count, accept, env, holding.release)
    except Exception as exc:  # a broken pool must not stop the build
        log.warning("runtime-cache: worker processes failed (%s); building here", exc)
        left = []
    finally:
        holding.release_all()  # jobs lost with a broken pool
        if files is not None:
            files.close()
    left += [n for n in names if not hooks.is_built(n) and n not in left]
    built = len(accepted)
    for name in left:
        try:
            built += build_here(name)
        finally:
            if done is not None:
                done(name)
    return built


def build_claims(hooks: BuildHooks, claims: Claims, workers: int, processes: bool) -> int:
    """Build the programs ``claims`` hands out (see :func:`.sharing.build_claimed`): in
    ``workers - 1`` worker processes and this process, or in ``workers`` threads. Returns
    how many this call built."""

    def in_processes(taken: list[str], next_name: Callable[[], str | None]) -> int:
        return build_in_workers(hooks, taken, max(1, workers - 1), next_name, claims.done)

    many = in_processes if processes else None
    timed = _timed(hooks.build_here)
    here = _timed(_capturing(hooks)) if processes else None
    return build_claimed(claims, workers, timed, many, PROCESS_THRESHOLD, here)


def _capturing(hooks: BuildHooks) -> Callable[[str], bool]:
    """A source build in this process that, like a worker's, stores the driver files
    it added (before its binaries); this process builds one program at a time."""
    files = hooks.program_files
    if files is None:
        return hooks.build_here

    def build(name: str) -> bool:
        plan = hooks.plan_of(name)
        if plan.keys is None:
            return hooks.build_here(name)
        key = str(plan.keys[0])
        with held((hooks.name_lock, hooks.is_built), name) as needed:
            if not needed:  # a program() call beside build_all() built it meanwhile
                return False
            before = files.own_snapshot()
            program, seconds = source_build(hooks.context, plan)
            packed = files.own_capture(before)
            settled = settle(plan, program)
            if settled.keys is not None:
                if packed is not None:
                    files.publish(key, packed)
                binaries = read_binaries(import_pyopencl(), program, plan.devices)
                store_binaries(hooks.cache, settled, program, binaries, seconds)
            hooks.adopt(name, program, seconds)
            return True

    return build


def build_module_shared(
    hooks: BuildHooks,
    keys: dict[str, list[str]],
    to_build: list[str],
    workers: int,
    processes: bool,
    load_cached: Callable[[list[str]], list[str]],
    longest_build: Callable[[], float],
    looked: set[str] | frozenset[str] = frozenset(),
) -> int:
    """Build ``to_build`` with the other processes that may be building the same module.

    Each program is claimed under a lease (see :mod:`.sharing`); claims go to
    :func:`build_claims`, and what others stored is loaded with
    ``load_cached(names)`` (which returns the names it could not load), after
    their driver files are added (see :mod:`.program_files`). ``looked``: the programs
    whose entries the first look found (loaded or not). Returns how many programs this
    process built.
    """
    built = [0]  # programs this call built

    def build(claims: Claims) -> None:
        built[0] += build_claims(hooks, claims, workers, processes)

    load = with_driver_files(
        hooks.program_files, keys, lambda names: load_cached(names) if names else []
    )
    build_shared(
        hooks.cache,
        keys,
        to_build,
        build,
        load,
        longest_build,
        frozenset(looked),
    )
    return built[0]
