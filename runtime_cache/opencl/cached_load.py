"""Load a module's cached programs: fetch ahead in chunks, load on a few threads, vet at the end.

:meth:`OpenCLModule.build_all <runtime_cache.opencl.OpenCLModule.build_all>` loads
what the cache holds through :func:`load_cached_programs` before it builds the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..cache import Cache
from .ahead_terms import NOT_HERE, Loaded, Read
from .capture import remember
from .counters import counters
from .guard import BLOCKED, KNOWN, SET_ASIDE, STRUCK, SUSPECT, Binary, binary_digest
from .holdings import NameLock
from .plan import ProgramPlan
from .program import load_cached, load_from_binaries
from .read_ahead import drain, read_ahead
from .vetting import screen_binaries, vet_unknown

__all__ = [
    "CONCURRENT_LOADS",
    "FIRST_TRY_AGAIN",
    "LOADS_AHEAD",
    "LOAD_CHUNK",
    "UNUSED_AHEAD",
    "Claim",
    "concurrent_loads",
    "held",
    "load_ahead",
    "load_cached_programs",
    "loads_ahead",
    "taken",
]

#: ``build_all`` reads cached entries ahead in chunks of at least this many programs.
LOAD_CHUNK = 4

#: Programs loaded from binaries at once, by platform name; other platforms load one at a
#: time. PoCL's CPU device does part of a binary load outside its locks, so two loading
#: threads gain; NVIDIA's driver serializes the loads, and two threads were slower than one.
CONCURRENT_LOADS = {"Portable Computing Language": 2}

#: Platforms on which a lazy module's read-ahead thread also loads the programs it read
#: (:data:`.prefetch.Loader`), beside the caller's own loads: the CPU drivers, which load
#: two programs at once (12 programs one at a time, 2-core AMD EPYC: 0.88 of the floor on
#: PoCL 3.1 and 0.83 on Intel's runtime, against 1.02-1.09 reading ahead only). NVIDIA's
#: driver serializes loads: there the thread only reads (an H100, 12 programs: 1.270 of
#: the floor loading ahead, 1.247 reading ahead only).
LOADS_AHEAD = frozenset({"Portable Computing Language", "Intel(R) OpenCL"})

#: Programs loaded ahead in this process and not (yet) asked for, beyond those asked for,
#: past which new modules only read ahead: a loop of modules asked for two of their
#: programs each stops loading for nobody after a few modules (PoCL 3.1, 1,000 modules
#: kept, 12 programs each: 3.7-3.9 s, against 3.1-3.2 s reading ahead only), and one
#: asked for most of them (two loaded for nobody, more used) goes on.
UNUSED_AHEAD = 16
#: Past that, the 8th new module loads ahead all the same, then the 16th, the 32nd and so
#: on, so that a process whose later modules use what is loaded ahead (after a burst of
#: modules dropped with their loads unused) takes it up again, and one that goes on
#: wasting tries less and less (PoCL 3.1, 1,000 modules kept, two of 12 programs asked
#: of each: 14 loads for nobody after the first 18; with a try every 8th module, 266).
FIRST_TRY_AGAIN = 8
_refused = [0]  # new modules refused in a row

#: ``(name, plan, binaries or None when missing, their digests, whether to vet them first,
#: whether they are known)``
Fetched = tuple[str, ProgramPlan, list[Binary] | None, list[str], bool, bool]


#: ``(lock_of, is_built)``: the lock a program's name is held by while it is loaded or
#: built (as ``program()`` holds it), and whether it is built.
Claim = tuple[Callable[[str], NameLock], Callable[[str], bool]]


class held:
    """``with held(claim, name) as needed``: holds the program's name (see :data:`Claim`);
    ``needed`` is false when it was built meanwhile. A plain class: a generator-based
    context manager costs more than the lock (a few µs a program)."""

    __slots__ = ("_built", "_lock", "_name")

    def __init__(self, claim: Claim | None, name: str) -> None:
        self._lock: NameLock | None = None
        self._built: Callable[[str], bool] | None = None
        if claim is not None:
            self._lock, self._built = claim[0](name), claim[1]
        self._name = name

    def __enter__(self) -> bool:
        if self._lock is None or self._built is None:
            return True
        self._lock.acquire()
        return not self._built(self._name)

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()

    #: Held beyond one block (a worker's job, until its result is in): ``take()`` holds the
    #: name and says whether it is still needed; ``release()`` lets go of it, either way.
    take = __enter__
    release = __exit__


def loads_ahead(context: Any) -> bool:
    """Whether a new read-ahead thread in ``context`` also loads what it read: the driver
    loads two at once (:data:`LOADS_AHEAD`), and this process's loads ahead have not gone
    unused (:data:`UNUSED_AHEAD`)."""
    names = {str(device.platform.name) for device in context.devices}
    if not names or not names <= LOADS_AHEAD:
        return False
    loaded, used = counters.values("loaded_ahead", "loaded_ahead_used")
    if loaded - used <= UNUSED_AHEAD + used:
        _refused[0] = 0
        return True
    _refused[0] = refused = _refused[0] + 1  # (a race costs a try more or less)
    return refused >= FIRST_TRY_AGAIN and refused & (refused - 1) == 0  # 8th, 16th, 32nd..


def concurrent_loads(context: Any) -> int:
    """How many threads load binaries at once in ``context`` (see ``CONCURRENT_LOADS``)."""
    names = {str(device.platform.name) for device in context.devices}
    return min(CONCURRENT_LOADS.get(name, 1) for name in names) if names else 1


def note_missed(
    cache: Cache,
    missed: dict[str, list[str]],
    plans: Mapping[str, ProgramPlan],
    found: Mapping[str, object],
    tally: Mapping[str, tuple[int, float]] | None,
) -> None:
    """Note in ``missed`` each program's keys that a look missed; with ``tally`` (a later
    look, its hits deferred), count a hit for each key noted before and found now, taking
    back its miss, and note those no more. A key found now that the first look found too
    counts nothing: that look counted it."""
    if tally is None:
        for name, plan in plans.items():
            keys = [str(k) for k in plan.keys or ()]
            if lost := [k for k in keys if k not in found]:  # (with repeats, as counted)
                missed[name] = lost
        return
    served: list[tuple[int, float]] = []
    for name in plans:
        before = missed.get(name)
        if before:
            served += [tally[k] for k in before if k in tally]
            missed[name] = [k for k in before if k not in tally]
    cache.count_hits(served, missed_before=True)


def load_cached_programs(
    context: Any,
    cache: Cache,
    names: list[str],
    workers: int,
    plan_of: Callable[[str], ProgramPlan],
    adopt: Callable[[str, Any], None],
    gate: threading.Thread | None = None,
    claim: Claim | None = None,
    looked: set[str] | None = None,
    missed: dict[str, list[str]] | None = None,
    again: bool = False,
) -> list[str]:
    """Load the programs of ``names`` whose binaries are cached; return the names left to build.

    ``plan_of(name)`` gives each program's plan, and ``adopt(name, program)`` takes
    each one loaded. ``gate``, when given, is a thread that must end before the
    first load (the driver's own cache files being restored). ``claim``, when given
    (see :data:`Claim`), holds each program's name while it is loaded, as ``program()``
    does: a program another thread loaded meanwhile (``program()`` beside
    ``build_all()``) is not loaded twice. ``looked``, when given, gets the names whose
    entries were all there, loaded or not (refused, or not vetted): a shared build
    then tries again only those stored since (see :mod:`.sharing`). ``missed``, when given,
    gets each program's storage keys this look missed (and counted as misses); with
    ``again`` (a later look of the same call: a shared build loading what another process
    stored since), a key of it found now is counted as the hit that turns that miss, and
    nothing else is counted again (:meth:`~runtime_cache.cache.Cache.count_hits`).

    A background thread fetches the entries a chunk of programs at a time
    (one backend call each) and checks them, while the loading threads hand
    the previous chunks to the driver (see :mod:`.read_ahead`). Binaries of
    unknown origin are set aside and vetted together, in one batch, at the end.
    """

    def load_one(
        name: str,
        plan: ProgramPlan,
        binaries: Sequence[Binary],
        digests: list[str] | None,
        known: bool = False,
    ) -> bool:
        program = load_cached(context, plan, cache, binaries, digests, known=known)
        if program is None:
            return False
        adopt(name, program)
        return True

    size = max(LOAD_CHUNK, -(-len(names) // 8))
    chunks = [names[i : i + size] for i in range(0, len(names), size)]
    left: list[str] = []
    unknown: list[tuple[str, ProgramPlan, Sequence[Binary]]] = []

    def fetch_chunk(chunk: list[str]) -> list[Fetched]:
        plans = {name: plan_of(name) for name in chunk}
        wanted = [k for p in plans.values() if p.keys is not None for k in p.keys]
        tally: dict[str, tuple[int, float]] | None = {} if again else None
        found = (
            cache.get_many_views(wanted, count_misses=not again, defer_hits=tally) if wanted else {}
        )
        if missed is not None:
            note_missed(cache, missed, plans, found, tally)
        fetched: list[Fetched] = []
        for name, plan in plans.items():
            binaries = [found.get(str(k)) for k in plan.keys or ()]
            ready: list[Binary] = [b for b in binaries if b is not None]
            if not ready or len(ready) != len(binaries):
                fetched.append((name, plan, None, [], False, False))
                continue
            if looked is not None:
                looked.add(name)  # (set.add: one step under the GIL, from any thread)
            digests = [binary_digest(b) for b in ready]
            vet, standing = screen_binaries(digests, trusted=cache.signed, keys=plan.keys)
            fetched.append((name, plan, ready, digests, vet, standing == KNOWN))
        return fetched

    lock = threading.Lock()

    def load(batch: list[Fetched]) -> None:
        if gate is not None:
            gate.join()
        for name, plan, ready, digests, vet, known in batch:
            with held(claim, name) as needed:
                if not needed:
                    continue
                if ready is not None and not vet and load_one(name, plan, ready, digests, known):
                    continue
            with lock:
                if ready is not None and vet:
                    unknown.append((name, plan, ready))
                else:
                    left.append(name)

    loaders = min(workers, concurrent_loads(context), len(chunks))  # a thread per chunk at most
    drain(read_ahead(chunks, fetch_chunk, background=workers > 1), load, loaders)
    if unknown:
        devices = list(context.devices)
        items = [(r, plan.options, plan.options_text, plan.source) for _, plan, r in unknown]
        keys = [plan.keys for _, plan, _ in unknown]
        may_load = vet_unknown(devices, items, trusted=cache.signed, keys=keys)
        for (name, plan, ready), ok in zip(unknown, may_load, strict=True):
            with held(claim, name) as needed:
                if needed and not (ok and load_one(name, plan, ready, None)):
                    left.append(name)
    order = {name: i for i, name in enumerate(names)}
    return sorted(left, key=order.__getitem__)


def load_ahead(context: Any, cache: Cache, read: Read) -> Any:
    """Load one program a read-ahead thread read (see :data:`.prefetch.Loader`): the
    program, or ``NOT_HERE`` when it is the caller's: binaries not all there, to be
    vetted (a child the caller starts, as :func:`~.program.fetch` does), blocklisted or
    set aside by the crash guard, or refused by the driver. The caller then loads them
    as it would have, and evicts and counts what it must, only if it asks for them.
    Checked as any other load: the digests against the crash guard's lists, the load
    under its watch. Nothing is counted until the caller takes the program (:func:`taken`)."""
    plan, found, digests, standing = read
    binaries = [found.get(str(key)) for key in plan.keys or ()]
    ready: list[Binary] = [b for b in binaries if b is not None]
    if plan.keys is None or not ready or len(ready) != len(binaries):
        return NOT_HERE
    vet, standing = screen_binaries(
        digests, trusted=cache.signed, keys=plan.keys, standing=standing
    )
    if vet or standing in (BLOCKED, SET_ASIDE, SUSPECT, STRUCK):
        return NOT_HERE
    program = load_from_binaries(context, plan, ready, digests, known=standing == KNOWN)
    if program is None:
        return NOT_HERE
    counters.add(loaded_ahead=1)
    return program


def taken(loaded: Loaded, cache: Cache) -> Any:
    """A program loaded ahead, now asked for: counted as loaded, and noted as
    :func:`~.program.load_cached` notes its own."""
    plan, found, digests, _ = loaded.read
    binaries = [found[str(key)] for key in plan.keys or ()]
    counters.add(binary_loads=1, loaded_ahead_used=1)
    remember(loaded.program, plan, cache, binaries, 0.0, digests)
    return loaded.program
