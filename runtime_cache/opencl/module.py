"""``OpenCLModule``: one cl_program per kernel, built lazily, cached, and bundled on demand."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..cache import Cache
from ..keys import module_id_from_sources
from ..provider import get_cache
from ._driver import import_pyopencl, kernel_names
from .ahead_terms import Loaded
from .build_inputs import settle
from .cached_load import (
    CONCURRENT_LOADS,
    Claim,
    held,
    load_cached_programs,
    taken,
)
from .counters import counters
from .driver_cache import DriverCaches, driver_cache_enabled
from .holdings import NameLock
from .includes import Options, normalize_options
from .module_ahead import LazyReadAhead
from .module_bundles import PrecompiledPrograms
from .module_plans import ModulePlans
from .parallel import build_in_threads
from .prefetch import ReadAhead
from .program import ProgramPlan, evict, fetch, read_binaries, source_build, store_binaries
from .program_files import ProgramFiles
from .progress import BuildProgress, ProgressCallback
from .sharing import shares_builds
from .worker_builds import (
    PROCESS_THRESHOLD,
    BuildHooks,
    build_in_workers,
    build_module_shared,
    default_workers,
)

__all__ = ["CONCURRENT_LOADS", "PROCESS_THRESHOLD", "OpenCLModule"]


log = logging.getLogger(__name__)


class OpenCLModule(PrecompiledPrograms, LazyReadAhead):
    """A set of OpenCL kernels, one ``cl_program`` per kernel function, built lazily.

    ``sources`` maps each kernel function name to the source of its program.
    Every program goes through the cache (``cache=``, or the process-wide
    :func:`runtime_cache.get_cache`), so another process finds the binaries.
    ``driver_cache=True`` (or ``RUNTIME_CACHE_DRIVER_CACHE=1``) carries the
    driver's own JIT cache as well (:mod:`runtime_cache.opencl.driver_cache`).

    Example (from ``tests/test_opencl_module.py``)::

        module = OpenCLModule(ctx, {"scale": SCALE_SRC, "shift": SHIFT_SRC}, cache=cache)
        module.build_all()
        module.kernel("scale")(queue, (n,), None, buf, np.float32(2))
        bundle = module.get_precompiled_programs()
        other = OpenCLModule(ctx, {"scale": SCALE_SRC, "shift": SHIFT_SRC})
        other.set_precompiled_programs(bundle)  # == 2 on the same device
    """

    def __init__(
        self,
        context: Any,
        sources: Mapping[str, str],
        *,
        options: Options = (),
        module_id: str | None = None,
        cache: Cache | None = None,
        driver_cache: bool | None = None,
    ) -> None:
        import_pyopencl()
        if not isinstance(sources, Mapping) or not sources:
            raise TypeError("sources must be a non-empty mapping of kernel name to source")
        for name, text in sources.items():
            if not isinstance(name, str) or not isinstance(text, (str, bytes)):
                raise TypeError("sources must map str kernel names to str sources")
        self.context = context
        self.sources: dict[str, str] = dict(sources)
        self.options = normalize_options(options)
        self.module_id = module_id or module_id_from_sources(self.sources)
        self._cache = cache
        self._programs: dict[str, Any] = {}
        self._seconds: dict[str, float] = {}
        self._plans = ModulePlans(context, self.sources, self.options, self.module_id)
        self._lock = threading.RLock()
        self._name_locks: dict[str, NameLock] = {}
        self._cached: set[str] = set()
        self._holds: set[str] = set()  # of _cached: seen to hold their kernel (program())
        self._watchers: list[Callable[[str], None]] = []  # build_all progress, per call
        self._unreported: set[str] = set()  # adopted while held: reported when let go of
        self._ahead: ReadAhead | None = None  # the first program() reads the others ahead
        # The driver's own cache files travel too (see .driver_cache); None: the environment.
        self._driver: DriverCaches | None = None
        if driver_cache_enabled(driver_cache):
            self._driver = DriverCaches(context, self.module_id)

    # ------------------------------------------------------------------ basics
    @property
    def cache(self) -> Cache:
        """The cache this module stores into (the process-wide one unless ``cache=`` was given)."""
        return self._cache if self._cache is not None else get_cache()

    @property
    def built(self) -> list[str]:
        """Names of the programs built so far."""
        with self._lock:
            return sorted(self._programs)

    def _plan(self, name: str) -> ProgramPlan:
        return self._plans.plan(name)

    def _name_lock(self, name: str) -> NameLock:
        with self._lock:
            lock = self._name_locks.get(name)
            if lock is None:
                lock = self._name_locks[name] = NameLock(name, self._let_go)
            return lock

    @property
    def _claims(self) -> Claim:
        # Held as program() holds a name while it loads or builds it (see .cached_load.held).
        return self._name_lock, self._is_built

    def _build_if_missing(self, name: str) -> bool:
        # Whether this call built it (not another thread meanwhile): build_all's count.
        with held(self._claims, name) as needed:
            if needed:
                self._build_from_source(name)
            return needed

    def _adopt(self, name: str, program: Any, seconds: float, *, cached: bool = False) -> None:
        with self._lock:
            if self._programs.setdefault(name, program) is program and cached:
                self._cached.add(name)  # from binaries out of the cache or a bundle
            self._seconds.setdefault(name, seconds)
            if not self._watchers:
                return
            if self._name_lock(name).locked():
                # Reported once its name is let go of (_let_go): a callback that asks for
                # a program another thread holds waits for it, never for itself.
                self._unreported.add(name)
                return
            watchers = list(self._watchers)
        for watch in watchers:
            watch(name)

    def _let_go(self, name: str) -> None:
        with self._lock:  # (no unlocked look first: an _adopt under way may be adding it)
            if name not in self._unreported:
                return
            self._unreported.discard(name)
            watchers = list(self._watchers)
        for watch in watchers:
            watch(name)

    def _build_from_source(self, name: str) -> None:
        cl = import_pyopencl()
        plan = self._plan(name)
        program, seconds = source_build(self.context, plan)
        if plan.keys is None:
            counters.add(uncacheable=1)
        elif (plan := settle(plan, program)).keys is not None:
            binaries = read_binaries(cl, program, plan.devices)
            store_binaries(self.cache, plan, program, binaries, seconds)
        self._adopt(name, program, seconds)

    # ------------------------------------------------------------------ programs
    def program(self, name: str) -> Any:
        """Return the built ``pyopencl.Program`` of kernel ``name``, building it on first use.

        One made from cached binaries is checked to hold kernel ``name`` (another
        program's binary stored under its key is evicted and built from source)."""
        program = self._load(name)
        with self._lock:
            if name not in self._cached or name in self._holds:
                return program
        with self._name_lock(name):  # one check at a time; no other load adopts meanwhile
            for _ in range(3):  # (a rebuild, or another thread's, comes from source)
                with self._lock:
                    program = self._programs.get(name, program)
                    if name not in self._cached or name in self._holds:
                        return program
                names = kernel_names(program)  # None: the driver can't tell
                if names is None or name in names:
                    break
                self._reject(name, program)
            with self._lock:
                self._holds.add(name)
                return self._programs.get(name, program)

    def _load(self, name: str) -> Any:
        with self._lock:
            found = self._programs.get(name)
        if found is not None:
            return found
        with self._name_lock(name):
            with self._lock:
                found = self._programs.get(name)
            if found is not None:
                return found
            cache = self.cache
            ahead = self._read_ahead(cache, name)
            read = ahead.take(name) if ahead is not None else None
            if isinstance(read, Loaded):  # loaded ahead, from entries read ahead
                loaded = taken(read, cache)
                self._adopt(name, loaded, 0.0, cached=True)
                return loaded
            plan, found, digests, standing = (
                read if read is not None else (self._plan(name), None, None, None)
            )
            if self._driver is not None:
                self._driver.restore(cache)
            if plan.keys is not None and found is None:
                found = cache.get_many_views(plan.keys)
            if ahead is not None:
                ahead.begin()  # reads on while the driver takes this one (see .prefetch)
            if plan.keys is not None and found is not None:
                loaded = fetch(self.context, plan, cache, found, digests=digests, standing=standing)
                if loaded is not None:
                    self._adopt(name, loaded, 0.0, cached=True)
                    return loaded
            self._build_from_source(name)
            return self._programs[name]

    def kernel(self, name: str) -> Any:
        """Return a new ``pyopencl.Kernel`` for ``name``.

        Kernels hold their arguments, so they are not thread-safe: keep one per thread.
        """
        cl = import_pyopencl()
        program = self._load(name)  # cl.Kernel checks that it holds the kernel
        try:
            return cl.Kernel(program, name)
        except Exception:
            if not self._reject(name, program):
                raise
        return cl.Kernel(self._load(name), name)

    def _reject(self, name: str, program: Any) -> bool:
        """A program from cached binaries that lacks kernel ``name`` (another program's
        binary under this key): evict it and build from source. ``False`` if it was not
        from binaries (the error is then the caller's)."""
        with self._lock:
            if name not in self._cached or self._programs.get(name) is not program:
                return False
            del self._programs[name]
            self._seconds.pop(name, None)
            self._cached.discard(name)
            self._holds.discard(name)
        plan = self._plan(name)
        if plan.keys is not None:
            evict(self.cache, plan, f"the program lacks kernel {name!r}")
        self._build_from_source(name)
        return True

    def build_all(
        self,
        workers: int | None = None,
        *,
        processes: bool | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> int:
        """Build every program not yet built; return how many this call built from source
        (a program another thread built meanwhile counts in that thread's call, not here).

        Cached binaries are loaded first: a background thread reads and checks
        the entries a chunk at a time while this thread (and, on drivers that
        gain from it, one more: ``CONCURRENT_LOADS``) hands them to the driver;
        with ``workers=1`` all of it runs on this thread. Missing programs are
        then built concurrently. With ``processes=None`` worker processes are used when
        there are at least ``PROCESS_THRESHOLD`` builds per worker (their
        start-up costs about half a second), threads otherwise;
        ``True``/``False`` forces the choice.

        ``on_progress(done, total)`` is called each time one of the ``total``
        programs this call makes ready is loaded or built (from the loading
        and building threads, one call at a time); the last call is always
        ``(total, total)``; with nothing left to make ready it is not called. A program
        is reported once the thread that made it ready has let go of it, and no thread
        waits to report, so the callback may ask for programs (``program``, ``kernel``).
        See :class:`~runtime_cache.opencl.progress.BuildProgress`.
        """
        missing = self._stop_reading_ahead()
        if not missing:
            return 0
        if on_progress is None:
            return self._build_missing(missing, workers, processes)
        progress = BuildProgress(on_progress, missing)
        with self._lock:
            self._watchers.append(progress.landed)
        try:
            built = self._build_missing(missing, workers, processes)
        finally:
            with self._lock:
                self._watchers.remove(progress.landed)
        progress.finish()
        return built

    def _build_missing(
        self, missing: list[str], workers: int | None, processes: bool | None
    ) -> int:
        count = workers if workers is not None else default_workers()
        # The driver's files are restored while the first entries are read; loads wait for them.
        gate = self._driver.start_restore(self.cache) if self._driver is not None else None
        looked: set[str] = set()  # entries there at this look, loaded or not
        missed: dict[str, list[str]] = {}  # keys this look missed: see note_missed
        to_build = self._load_cached(missing, count, gate, looked, missed)
        if gate is not None:
            gate.join()
        if not to_build:
            self.capture_driver_cache(settle=False)
            return 0
        if processes is None:
            processes = count > 1 and len(to_build) >= PROCESS_THRESHOLD * count
        keys = {n: [str(k) for k in self._plan(n).keys or ()] for n in to_build}
        if shares_builds(self.cache, (k[0] for k in keys.values() if k)):
            # Other processes may be building the same module: share the work (see .sharing).
            # (Each missed at the look above: one found now is one hit, no second miss.)
            load = functools.partial(self._load_cached, workers=count, missed=missed, again=True)
            hooks = self._hooks(cold=True)
            return build_module_shared(
                hooks, keys, to_build, count, processes, load, self._longest_build, looked
            )
        if count <= 1 or len(to_build) == 1:
            built = sum(self._build_if_missing(name) for name in to_build)
        elif processes:
            built = build_in_workers(self._hooks(cold=True), to_build, count)
        else:
            built = sum(build_in_threads(self._build_if_missing, to_build, count))
        self.capture_driver_cache(settle=False)
        return built

    def capture_driver_cache(self, *, settle: bool = True) -> int:
        """Store the driver's own cache files this module added; return how many sets stored.

        Only with ``driver_cache`` on (see :mod:`runtime_cache.opencl.driver_cache`).
        ``build_all`` calls it; call it again after the first launches (PoCL
        compiles then), or leave that to the capture at exit. ``settle``: the
        programs loaded and ran, so restored files no longer take the blame for a crash.
        """
        return 0 if self._driver is None else self._driver.capture(settle=settle)

    def _load_cached(
        self,
        names: list[str],
        workers: int,
        gate: threading.Thread | None = None,
        looked: set[str] | None = None,
        missed: dict[str, list[str]] | None = None,
        again: bool = False,
    ) -> list[str]:
        """Load the programs whose binaries are cached; return the names left to build
        (``looked``, ``missed``, ``again``: see :func:`.cached_load.load_cached_programs`)."""
        adopt = functools.partial(self._adopt, seconds=0.0, cached=True)
        args = (self.context, self.cache, names, workers, self._plan, adopt, gate, self._claims)
        return load_cached_programs(*args, looked, missed, again)

    def _longest_build(self) -> float:
        """How long a holder may take for one program: a worker claims up to
        PROCESS_THRESHOLD and starts up first, so never less than the policy's default."""
        with self._lock:
            seconds = [s for s in self._seconds.values() if s > 0]
        longest = max(seconds, default=0.0) * PROCESS_THRESHOLD
        return max(longest, self.cache.fleet.policy.default_expected)

    def _hooks(self, *, cold: bool = False) -> BuildHooks:
        # ``cold``: a cold build in workers or with other processes; each program's
        # driver files then travel with its binaries (see .program_files).
        files = None
        if cold and self._driver is not None:
            files = ProgramFiles.open(self.cache, self.context, enabled=True)
        return BuildHooks(
            self.context,
            self.cache,
            self.sources,
            self.options,
            self._plan,
            self._adopt,
            self._build_if_missing,
            self._is_built,
            self._name_lock,
            files,
        )

    def _is_built(self, name: str) -> bool:
        with self._lock:
            return name in self._programs
