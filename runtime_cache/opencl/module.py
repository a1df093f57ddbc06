"""``OpenCLModule``: one cl_program per kernel, built lazily, cached, and bundled on demand."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..bundles import LoadResult
from ..cache import Cache
from ..errors import CorruptEntryError
from ..keys import CacheKey, module_id_from_sources
from ..provider import get_cache
from ._driver import import_pyopencl
from .bundle import pack_programs, unpack_programs
from .counters import counters
from .driver_cache import DriverCaches, driver_cache_enabled
from .guard import Binary, binary_digest
from .includes import Options, normalize_options
from .parallel import Job, WorkerResult, build_in_processes, build_in_threads
from .program import (
    ProgramPlan,
    evict,
    fetch,
    load_cached,
    load_from_binaries,
    options_text,
    plan_program,
    read_binaries,
    remember,
    source_build,
    store_binaries,
)
from .progress import BuildProgress, ProgressCallback
from .read_ahead import drain, read_ahead
from .sharing import Claims, build_claimed, build_shared, shares_builds
from .vetting import needs_vetting, vet_unknown

__all__ = ["OpenCLModule"]


log = logging.getLogger(__name__)

#: ``build_all`` uses worker processes when at least this many programs per worker need a build.
PROCESS_THRESHOLD = 4
#: ``build_all`` reads cached entries ahead in chunks of at least this many programs.
LOAD_CHUNK = 4

#: Programs loaded from binaries at once, by platform name; other platforms load one at a
#: time. PoCL's CPU device does part of a binary load outside its locks, so two loading
#: threads gain; NVIDIA's driver serializes the loads, and two threads were slower than one.
CONCURRENT_LOADS = {"Portable Computing Language": 2}

#: ``(name, plan, binaries or None when missing, their digests, whether to vet them first)``
_Fetched = tuple[str, ProgramPlan, list[Binary] | None, list[str], bool]


def _verifies(cache: Cache, key: str, blob: bytes) -> bool:
    """Whether ``blob`` passes ``cache``'s entry check, signature included."""
    try:
        cache.check(key, blob)
    except CorruptEntryError:  # SignatureError included
        return False
    return True


def concurrent_loads(context: Any) -> int:
    """How many threads load binaries at once in ``context`` (see ``CONCURRENT_LOADS``)."""
    names = {str(device.platform.name) for device in context.devices}
    return min(CONCURRENT_LOADS.get(name, 1) for name in names) if names else 1


class OpenCLModule:
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
        self._plans: dict[str, ProgramPlan] = {}
        self._lock = threading.RLock()
        self._name_locks: dict[str, threading.Lock] = {}
        self._cached: set[str] = set()
        self._options_text: str | None = None
        self._watchers: list[Callable[[str], None]] = []  # build_all progress, per call
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
        with self._lock:
            plan = self._plans.get(name)
            if plan is None:
                if name not in self.sources:
                    raise KeyError(f"no kernel {name!r} in module {self.module_id}")
                if self._options_text is None:
                    self._options_text = options_text(self.context, self.options)
                plan = plan_program(
                    self.context,
                    self.sources[name],
                    self.options,
                    module_id=self.module_id,
                    program=name,
                    options_text=self._options_text,
                )
                self._plans[name] = plan
            return plan

    def _name_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._name_locks.setdefault(name, threading.Lock())

    def _adopt(self, name: str, program: Any, seconds: float, *, cached: bool = False) -> None:
        with self._lock:
            if self._programs.setdefault(name, program) is program and cached:
                self._cached.add(name)  # from binaries out of the cache or a bundle
            self._seconds.setdefault(name, seconds)
            watchers = list(self._watchers)
        for watch in watchers:
            watch(name)

    def _build_from_source(self, name: str) -> None:
        cl = import_pyopencl()
        plan = self._plan(name)
        program, seconds = source_build(self.context, plan)
        if plan.keys is None:
            counters.add(uncacheable=1)
        else:
            binaries = read_binaries(cl, program, plan.devices)
            store_binaries(self.cache, plan, program, binaries, seconds)
        self._adopt(name, program, seconds)

    # ------------------------------------------------------------------ programs
    def program(self, name: str) -> Any:
        """Return the built ``pyopencl.Program`` of kernel ``name``, building it on first use."""
        with self._lock:
            found = self._programs.get(name)
        if found is not None:
            return found
        with self._name_lock(name):
            with self._lock:
                found = self._programs.get(name)
            if found is not None:
                return found
            plan = self._plan(name)
            if self._driver is not None:
                self._driver.restore(self.cache)
            if plan.keys is not None:
                loaded = fetch(self.context, plan, self.cache, self.cache.get_many_views(plan.keys))
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
        program = self.program(name)
        try:
            return cl.Kernel(program, name)
        except Exception:
            if not self._reject(name, program):
                raise
        return cl.Kernel(self.program(name), name)

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
        """Build every program not yet built; return how many were built from source.

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
        ``(total, total)``. See :class:`~runtime_cache.opencl.progress.BuildProgress`.
        """
        with self._lock:
            missing = [n for n in self.sources if n not in self._programs]
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
        count = workers if workers is not None else (os.cpu_count() or 1)
        # The driver's files are restored while the first entries are read; loads wait for them.
        gate = self._driver.start_restore(self.cache) if self._driver is not None else None
        to_build = self._load_cached(missing, count, gate)
        if gate is not None:
            gate.join()
        if not to_build:
            self.capture_driver_cache(settle=False)
            return 0
        if processes is None:
            processes = count > 1 and len(to_build) >= PROCESS_THRESHOLD * count
        keys = {n: [str(k) for k in self._plan(n).keys or ()] for n in to_build}
        first = next((k[0] for k in keys.values() if k), None)
        if first is not None and shares_builds(self.cache, first):
            # Other processes may be building the same module: share the work (see .sharing).
            built: list[str] = []
            build_shared(
                self.cache,
                keys,
                to_build,
                lambda claims: built.extend(self._build_claimed(claims, count, processes)),
                lambda names: self._load_cached(names, count) if names else [],
                self._longest_build,
            )
            return len(built)
        if count <= 1 or len(to_build) == 1:
            for name in to_build:
                self._build_from_source(name)
        elif processes:
            self._build_in_processes(to_build, count)
        else:
            build_in_threads(self._build_from_source, to_build, count)
        self.capture_driver_cache(settle=False)
        return len(to_build)

    def capture_driver_cache(self, *, settle: bool = True) -> int:
        """Store the driver's own cache files this module added; return how many sets stored.

        Only with ``driver_cache`` on (see :mod:`runtime_cache.opencl.driver_cache`).
        ``build_all`` calls it; call it again after the first launches (PoCL
        compiles then), or leave that to the capture at exit. ``settle``: the
        programs loaded and ran, so restored files no longer take the blame for a crash.
        """
        return 0 if self._driver is None else self._driver.capture(settle=settle)

    def _load_cached(
        self, names: list[str], workers: int, gate: threading.Thread | None = None
    ) -> list[str]:
        """Load the programs whose binaries are cached; return the names left to build.

        A background thread fetches the entries a chunk of programs at a time
        (one backend call each) and checks them, while the loading threads hand
        the previous chunks to the driver (see :mod:`.read_ahead`). Binaries of
        unknown origin are set aside and vetted together, in one batch, at the end.
        """
        cache = self.cache
        size = max(LOAD_CHUNK, -(-len(names) // 8))
        chunks = [names[i : i + size] for i in range(0, len(names), size)]
        left: list[str] = []
        unknown: list[tuple[str, ProgramPlan, Sequence[Binary]]] = []

        def fetch_chunk(chunk: list[str]) -> list[_Fetched]:
            plans = {name: self._plan(name) for name in chunk}
            wanted = [k for p in plans.values() if p.keys is not None for k in p.keys]
            found = cache.get_many_views(wanted) if wanted else {}
            fetched: list[_Fetched] = []
            for name, plan in plans.items():
                binaries = [found.get(str(k)) for k in plan.keys or ()]
                ready: list[Binary] = [b for b in binaries if b is not None]
                if not ready or len(ready) != len(binaries):
                    fetched.append((name, plan, None, [], False))
                    continue
                digests = [binary_digest(b) for b in ready]
                vet = needs_vetting(digests, trusted=cache.signed, keys=plan.keys)
                fetched.append((name, plan, ready, digests, vet))
            return fetched

        lock = threading.Lock()

        def load(batch: list[_Fetched]) -> None:
            if gate is not None:
                gate.join()
            for name, plan, ready, digests, vet in batch:
                if ready is not None and not vet and self._load_one(name, plan, ready, digests):
                    continue
                with lock:
                    if ready is not None and vet:
                        unknown.append((name, plan, ready))
                    else:
                        left.append(name)

        loaders = min(workers, concurrent_loads(self.context))
        drain(read_ahead(chunks, fetch_chunk, background=workers > 1), load, loaders)
        if unknown:
            devices = list(self.context.devices)
            items = [(ready, plan.options, plan.options_text) for _, plan, ready in unknown]
            keys = [plan.keys for _, plan, _ in unknown]
            may_load = vet_unknown(devices, items, trusted=cache.signed, keys=keys)
            left += [
                n
                for (n, plan, ready), ok in zip(unknown, may_load, strict=True)
                if not (ok and self._load_one(n, plan, ready, None))
            ]
        order = {name: i for i, name in enumerate(names)}
        return sorted(left, key=order.__getitem__)

    def _load_one(
        self, name: str, plan: ProgramPlan, binaries: Sequence[Binary], digests: list[str] | None
    ) -> bool:
        program = load_cached(self.context, plan, self.cache, binaries, digests)
        if program is None:
            return False
        self._adopt(name, program, 0.0, cached=True)
        return True

    def _longest_build(self) -> float:
        """How long a holder may take for one program: a worker claims up to
        PROCESS_THRESHOLD and starts up first, so never less than the policy's default."""
        with self._lock:
            seconds = [s for s in self._seconds.values() if s > 0]
        longest = max(seconds, default=0.0) * PROCESS_THRESHOLD
        return max(longest, self.cache.fleet.policy.default_expected)

    def _build_claimed(self, claims: Claims, workers: int, processes: bool) -> list[str]:
        """Build the programs ``claims`` hands out (see :func:`.sharing.build_claimed`)."""

        def in_processes(taken: list[str], next_name: Callable[[], str | None]) -> None:
            def job() -> Job | None:
                name = next_name()
                return None if name is None else (name, self.sources[name], self.options)

            self._build_in_processes(taken, workers, job, claims.done)

        many = in_processes if processes else None
        return build_claimed(claims, workers, self._build_from_source, many, PROCESS_THRESHOLD)

    def _build_in_processes(
        self,
        names: list[str],
        workers: int,
        take: Callable[[], Job | None] | None = None,
        done: Callable[[str], None] | None = None,
    ) -> None:
        """Build ``names`` in worker processes (or what ``take`` hands out, into ``names``).

        ``done(name)`` is called once each program's binaries were stored.
        """
        devices = list(self.context.devices)
        jobs = take or [(n, self.sources[n], self.options) for n in names]

        def accept(result: WorkerResult) -> bool:
            name, binaries, seconds, options_text = result
            plan = self._plan(name)
            if binaries is None or options_text != plan.options_text:
                return False
            program = load_from_binaries(self.context, plan, binaries)
            if program is None:
                return False
            counters.add(source_builds=1)
            if plan.keys is None:
                counters.add(uncacheable=1)
            else:
                store_binaries(self.cache, plan, program, binaries, seconds)
            self._adopt(name, program, seconds)
            if done is not None:
                done(name)
            return True

        try:
            left = build_in_processes(devices, jobs, workers, accept)
        except Exception as exc:  # a broken pool must not stop the build
            log.warning("runtime-cache: worker processes failed (%s); building here", exc)
            left = []
        with self._lock:
            left += [n for n in names if n not in self._programs and n not in left]
        for name in left:
            try:
                self._build_from_source(name)
            finally:
                if done is not None:
                    done(name)

    # ------------------------------------------------------------------ bundles
    def supports_precompiled_programs(self) -> bool:
        """Whether binaries can be read back: every device of the context has a compiler."""
        return all(bool(d.compiler_available) for d in self.context.devices)

    def get_precompiled_programs(self) -> bytes:
        """Return a bundle of every program's binaries, tagged with device fingerprints.

        Builds whatever is missing first. Programs that cannot be cached (an
        unresolvable ``#include``) are left out and later built from source.
        """
        cl = import_pyopencl()
        self.build_all()
        items: list[tuple[CacheKey, bytes, float]] = []
        with self._lock:
            programs = dict(self._programs)
            seconds = dict(self._seconds)
        for name in sorted(programs):
            plan = self._plan(name)
            if plan.keys is None:
                continue
            binaries = read_binaries(cl, programs[name], plan.devices)
            if not all(binaries):
                continue
            took = seconds.get(name, 0.0)
            items.extend((k, b, took) for k, b in zip(plan.keys, binaries, strict=True))
        return pack_programs(items)

    def set_precompiled_programs(self, data: bytes) -> LoadResult:
        """Load programs from a bundle; return how many programs it supplied.

        Entries for another device, other options, or a module whose sources
        differ do not match this module's keys and are ignored; those programs
        are built from source later. Programs already built are kept. A
        malformed blob raises :class:`~runtime_cache.errors.InvalidBundleError`
        and leaves the module as it was. Accepted binaries are also stored in
        the cache, so other processes find them. Unless the cache's secret
        signed them, binaries not known on this machine are first tried in a
        child process (:mod:`runtime_cache.opencl.vetting`), so one that crashes
        the driver is built from source instead of reaching this process.

        The result is an ``int`` with details (:class:`~runtime_cache.bundles.LoadResult`):
        ``unsigned`` counts programs no secret of the cache verified, and
        ``withheld`` those of them not stored because the cache is shared
        (others would run them): they are used by this module only.
        """
        entries = unpack_programs(data)
        cache = self.cache
        with self._lock:
            pending = [n for n in self.sources if n not in self._programs]
        expected: dict[str, tuple[str, int]] = {}
        for name in pending:
            plan = self._plan(name)
            for index, key in enumerate(plan.keys or ()):
                expected[str(key)] = (name, index)
        chosen: dict[str, dict[int, tuple[bytes, float, bool]]] = {}
        for entry, blob in entries:
            slot = expected.get(entry.key)
            if slot is not None:
                signed = cache.signed and _verifies(cache, entry.key, blob)
                chosen.setdefault(slot[0], {})[slot[1]] = (entry.value, entry.build_seconds, signed)
        complete: dict[str, tuple[list[bytes], float, bool]] = {}
        for name, by_index in chosen.items():
            plan = self._plan(name)
            assert plan.keys is not None
            if len(by_index) == len(plan.keys):
                complete[name] = (
                    [by_index[i][0] for i in range(len(plan.keys))],
                    max(s for _, s, _ in by_index.values()),
                    all(signed for _, _, signed in by_index.values()),
                )
        # A bundle is outside data: unless our secret signed it, each program is tried in a
        # child first, so a binary that crashes the driver never reaches this process.
        unsigned = [name for name, (_, _, signed) in complete.items() if not signed]
        load = vet_unknown(
            list(self.context.devices),
            [(complete[n][0], self._plan(n).options, self._plan(n).options_text) for n in unsigned],
            trusted=False,
            keys=[self._plan(n).keys for n in unsigned],
        )
        skip = {n for n, ok in zip(unsigned, load, strict=True) if not ok}
        accepted = withheld = 0
        for name, (binaries, seconds, signed) in complete.items():
            if name in skip:
                continue  # could not vet here: built from source later
            plan = self._plan(name)
            program = load_from_binaries(self.context, plan, binaries)
            if program is None:
                counters.add(rejected_binaries=1)
                log.warning("runtime-cache: the driver rejected bundled binaries of %r", name)
                continue
            counters.add(binary_loads=1)
            if signed or not cache.backend.shared:
                store_binaries(cache, plan, program, binaries, seconds)
            else:  # unsigned: never into a store that others trust
                withheld += 1
            remember(program, plan, cache, binaries, seconds)
            self._adopt(name, program, seconds, cached=True)
            accepted += 1
        if withheld:
            log.warning(
                "runtime-cache: %d programs of an unsigned bundle were loaded but not stored "
                "in the shared cache",
                withheld,
            )
        return LoadResult(
            accepted,
            offered=len(entries),
            unsigned=sum(1 for n in unsigned if n not in skip),
            withheld=withheld,
        )

    def recapture_binaries(self) -> int:
        """Re-read every built program's binaries after first launch; re-store changed ones.

        See :func:`runtime_cache.opencl.recapture_binaries` for when to call it.
        """
        from .capture import recapture_binaries

        with self._lock:
            programs = list(self._programs.values())
        return sum(recapture_binaries(p) for p in programs)
