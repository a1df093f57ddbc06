"""``build_all`` across processes: a fleet starting cold builds each program once.

Where the cache's backend offers leases (``dir://``, ``redis://``; see
:mod:`runtime_cache.fleet`), a process that starts a module's cold build walks
the missing programs in its own order (rotated by a hash of its process id, so
processes starting together begin at different programs), and takes each
program's lease just before building it. A program whose lease another process
holds is set aside. When nothing is left to win, the process waits for the
programs set aside, loading each as soon as its binaries are stored, and tries
their leases again as it polls: a lease that comes free without binaries (its
holder died or failed) is taken over and built here. A program still missing
after the deadline (``LeasePolicy.deadline`` of the longest build this module
has seen, or the default) is built here without a lease.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..api import Lease
from ..cache import Cache
from ..fleet import present, try_acquire
from .holdings import Holdings
from .parallel import build_in_threads

__all__ = ["Claims", "build_claimed", "build_shared", "rotated", "shares_builds"]


def rotated(names: Sequence[str], pid: int | None = None) -> list[str]:
    """``names`` rotated by a hash of the process id, so each process starts elsewhere."""
    if not names:
        return []
    seed = str(os.getpid() if pid is None else pid).encode()
    offset = int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big") % len(names)
    return [*names[offset:], *names[:offset]]


#: How many of a module's keys :func:`shares_builds` asks for a lease at most.
PROBES = 16


def shares_builds(cache: Cache, keys: Iterable[str]) -> bool:
    """Whether ``cache``'s backend has leases that other processes see: asked of ``keys``
    in turn (the first :data:`PROBES`) until one answers with a lease (a key may have
    none: junk planted at its lock's name in a shared folder gives that key none, and
    asked of the first key alone, the module's others none either)."""
    for key in itertools.islice(keys, PROBES):
        lease = cache.fleet.lease(cache.backend, key)
        if lease is not None:
            return not lease.local
    return False


class Claims:
    """Hands out the programs whose lease this process wins, one at a time, to build.

    ``keys`` maps each program to its entry keys (empty: not cacheable, built
    without a lease). Thread-safe: every build worker calls :meth:`take`, builds
    what it got, then calls :meth:`done`. ``force`` names programs to hand out
    without a lease (their wait passed the deadline); ``refused`` those stored
    but refused here, built under their lease without looking for them again.
    """

    def __init__(
        self,
        cache: Cache,
        keys: Mapping[str, Sequence[str]],
        order: Sequence[str],
        *,
        force: frozenset[str] = frozenset(),
        waited: frozenset[str] = frozenset(),
        refused: frozenset[str] = frozenset(),
    ) -> None:
        self._cache = cache
        self._keys = keys
        self._pending = deque(order)
        self._force = force
        self._waited = waited
        self._refused = refused
        self._leases: Holdings[Lease] = Holdings()
        self._lock = threading.Lock()
        #: Programs another process held the lease of when this one tried.
        self.waiting: list[str] = []
        #: Programs found stored after winning their lease: load them.
        self.stored: list[str] = []

    def take(self) -> str | None:
        """The next program to build here, or ``None`` when no other can be won now."""
        fleet, backend = self._cache.fleet, self._cache.backend
        while True:
            with self._lock:
                if not self._pending:
                    return None
                name = self._pending.popleft()
            keys = self._keys[name]
            if not keys:
                return name
            if name in self._force:
                fleet.count(takeovers=int(name in self._waited))
                return name
            lease = fleet.lease(backend, keys[0])
            if lease is None:
                return name
            won = try_acquire(lease)
            if won is None:
                return name  # the store failed: build without a lease, as without one
            if not won:
                with self._lock:
                    self.waiting.append(name)
                continue
            if name not in self._refused and present(backend, keys):  # stored since we looked
                lease.release()
                with self._lock:
                    self.stored.append(name)
                continue
            if lease.unstored():  # the store refused an earlier holder's binaries:
                lease.release()  # build them without holding the others off
                fleet.count(unshared_builds=1, takeovers=int(name in self._waited))
                return name
            fleet.count(leases_won=1, takeovers=int(name in self._waited))
            self._leases.put(name, lease)
            return name

    def done(self, name: str) -> None:
        """Release ``name``'s lease (after its binaries were stored, or its build failed).

        When the store refused them for their size, the lease is first noted so
        (:meth:`~runtime_cache.lease.Lease.note_unstored`): the processes waiting on it
        then build it side by side, not in turn.
        """
        lease = self._leases.pop(name)
        if lease is None:
            return
        try:
            cache = self._cache
            if any(map(cache.refused, self._keys[name])) or lease.refused():
                lease.note_unstored(cache.fleet.policy.unstored_note)
        finally:
            lease.release()

    def release_all(self) -> None:
        """Release every lease still held (after an error)."""
        self._leases.release_all()


def build_claimed(
    claims: Claims,
    workers: int,
    build_one: Callable[[str], bool],
    build_many: Callable[[list[str], Callable[[], str | None]], int] | None,
    chunk: int,
    build_here: Callable[[str], bool] | None = None,
) -> int:
    """Build every program ``claims`` hands out now; return how many this call built.

    Each builder answers whether it built the program (``False``: another thread of this
    process built it meanwhile), and ``build_many`` how many it built.

    With ``build_many`` (and ``workers > 1``), it builds them in worker processes:
    ``build_many(taken, next_name)`` pulls names from ``next_name()`` until
    ``None``, builds whatever is in ``taken`` and not built when its workers
    fail, and calls ``claims.done`` itself. A worker process costs a start-up
    (seconds on some drivers, longer while many processes open the same GPU),
    so one starts only with ``chunk`` claims in hand and while this process
    has won ``chunk`` for each builder; claims short of that go to the
    builders at work. Meanwhile this process builds too, one program at a
    time, with ``build_here`` (it needs no start-up): so ``build_many`` should
    start one worker fewer. Otherwise ``workers`` threads call ``build_one(name)``.
    """
    taken: list[str] = []
    built: list[bool] = []  # (list.append: one step under the GIL, from any thread)

    def take() -> str | None:
        name = claims.take()
        if name is not None:
            taken.append(name)
        return name

    if build_many is not None and workers > 1:
        local = threading.local()
        claiming = threading.Lock()
        spare: deque[str] = deque()  # claims left to the builders already running
        handed: list[str] = []  # claims given to worker threads (theirs to build or hand back)
        # Builders at work (got a name, not yet None); this process's own counts from the start.
        active = [1 if build_here is not None else 0]

        def next_name() -> str | None:
            queue: list[str] | None = getattr(local, "queue", None)
            if queue is None:
                queue = local.queue = []
            running = bool(getattr(local, "running", False))
            if not queue:
                # One thread claims at a time. A worker starts only with a full chunk in
                # hand, and only while this process has won at least ``chunk`` programs
                # for each builder, itself included (as ``build_all`` without leases
                # uses workers only with ``PROCESS_THRESHOLD`` builds each): a start-up
                # costs about as much as several builds. Claims won short of that wait
                # in ``spare`` for the builders at work.
                with claiming:
                    if running:
                        while spare and len(queue) < chunk:
                            queue.append(spare.popleft())
                        while len(queue) < chunk and (name := take()) is not None:
                            queue.append(name)
                    else:
                        need = chunk * (active[0] + 1)
                        while len(taken) < need and (name := take()) is not None:
                            spare.append(name)
                        if active[0] == 0 or (len(taken) >= need and len(spare) >= chunk):
                            while spare and len(queue) < chunk:
                                queue.append(spare.popleft())
                    handed.extend(queue)
                    if queue and not running:
                        active[0] += 1
                        local.running = True
                    elif not queue and running:
                        active[0] -= 1
                        local.running = False
            return queue.pop(0) if queue else None

        failed: list[Exception] = []  # build errors here: raised once every claim was built

        def build_mine(name: str) -> None:
            assert build_here is not None
            try:
                built.append(build_here(name))
            except Exception as exc:  # the other programs still get built
                failed.append(exc)
            finally:
                claims.done(name)

        def own() -> None:
            try:
                while True:
                    with claiming:
                        name = spare.popleft() if spare else take()
                        if name is None:
                            active[0] -= 1
                            return
                    build_mine(name)
            except BaseException:
                with claiming:
                    active[0] -= 1
                raise

        if build_here is None:
            return build_many(taken, next_name)
        with ThreadPoolExecutor(max_workers=1) as pool:
            mine = pool.submit(own)
            try:
                many = build_many(handed, next_name)  # not ``taken``: this builds the rest
            finally:
                mine.result()
                # Claims set aside after this process's own builder ended: none is left.
                while spare:
                    build_mine(spare.popleft())
        if failed:
            raise failed[0]
        return many + sum(built)

    def run(_: int) -> None:
        while (name := take()) is not None:
            try:
                built.append(build_one(name))
            finally:
                claims.done(name)

    build_in_threads(run, range(max(1, workers)), max(1, workers))
    return sum(built)


def _acceptable(cache: Cache, keys: Mapping[str, Sequence[str]], names: list[str]) -> list[str]:
    """Those of ``names`` whose every key holds an entry that passes ``cache``'s check (its
    secret, its limits): read in one peek and checked without counting."""
    try:
        found = cache.backend.peek_many([k for n in names for k in keys[n]]) if names else {}
    except Exception:  # the store failed: none is loaded here
        return []
    return [n for n in names if all(_passes(cache, k, found.get(k)) for k in keys[n])]


def _passes(cache: Cache, key: str, blob: bytes | None) -> bool:
    if blob is None:
        return False
    try:
        cache.check(key, blob)
    except Exception:  # refused (CorruptEntryError)
        return False
    return True


def build_shared(
    cache: Cache,
    keys: Mapping[str, Sequence[str]],
    names: Sequence[str],
    build: Callable[[Claims], None],
    load: Callable[[list[str]], list[str]],
    expected: Callable[[], float],
    looked: frozenset[str] = frozenset(),
) -> None:
    """Build ``names`` with the other processes: each builds what it wins, loads the rest.

    ``build(claims)`` builds programs from ``claims.take()`` until it answers
    ``None``, calling ``claims.done(name)`` after each. ``load(names)`` loads
    stored programs and returns those it could not load (built here next).
    ``expected()`` is the longest build seen so far, in seconds. ``looked`` names the
    programs whose entries the caller's look found, and did not load (refused, or not
    vetted): they are not read again.
    """
    fleet = cache.fleet
    # Stored already: since the caller looked (another process of a staggered start
    # stored them meanwhile: loaded now), or found by the caller's look and not loaded
    # there (not loadable by this driver, not vetted), or refused by this cache's check
    # (another secret's: looked at as a peek, not counted again): built here under their
    # lease, without loading them again.
    stored = [n for n in names if present(cache.backend, keys[n])]
    since = _acceptable(cache, keys, [n for n in stored if n not in looked])
    refused = frozenset(set(stored) - set(since)) | frozenset(load(since))
    loaded_first = set(stored) - refused
    pending = [n for n in rotated(names) if n not in loaded_first]
    force: set[str] = set()
    first_seen: dict[str, float] = {}
    pause = fleet.policy.first_poll
    while pending:
        claims = Claims(
            cache,
            keys,
            pending,
            force=frozenset(force),
            waited=frozenset(first_seen),
            refused=refused,
        )
        try:
            build(claims)
        finally:
            claims.release_all()
        pending = load(claims.stored)
        force.update(pending)  # stored, yet not loadable here: build without waiting
        waiting = claims.waiting
        if not waiting:
            continue
        now = time.monotonic()
        fresh = [n for n in waiting if n not in first_seen]
        fleet.count(lease_waits=len(fresh))
        first_seen.update((n, now) for n in fresh)
        time.sleep(pause)
        fleet.count(wait_seconds=time.monotonic() - now)
        pause = min(pause * 1.5, fleet.policy.max_poll)
        ready = [n for n in waiting if present(cache.backend, keys[n])]
        failed = load(ready)
        force.update(failed)
        limit = fleet.policy.deadline(expected())
        late = {n for n in waiting if time.monotonic() - first_seen[n] >= limit}
        force.update(late)
        loaded = set(ready) - set(failed)
        pending += [n for n in waiting if n not in loaded]
