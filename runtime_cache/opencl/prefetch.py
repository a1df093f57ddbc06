"""Lazy loads read ahead: the first ``program()`` of a module fetches the others' entries.

A module whose programs are asked for one at a time (``OpenCLModule.program``, the way
TVM-style modules and ``install()`` use it) would pay one backend call, and one key plan,
per program on the caller's thread. :class:`ReadAhead` moves that work to one background
thread: when the first program is asked for, it plans the keys of the module's other
programs and fetches their entries, a chunk of programs per backend call, in the order of
the module's sources from that program on. A later ``program()`` takes what was read for it,
or waits for the chunk being read, or, when the thread has not reached it yet, fetches it
itself.

The thread keeps out of the caller's way: both need the GIL. It does not start with the
first program, which costs what it costs without a read-ahead. The caller reads the second
program itself and then calls :meth:`ReadAhead.begin`, just before it hands that program to
the driver: the thread reads from the third program on while the driver loads the second,
without the GIL (started earlier, it took the GIL from the caller's own read: about 1 ms on
the 2-core box). A module with nothing left to read starts no thread.

On drivers that load two programs at once (the CPU drivers: ``LOADS_AHEAD`` in
:mod:`.cached_load`), the thread also hands what it read to the driver (its ``load``), while
the caller loads another: the caller, asking in order, loads every other program itself and
takes the rest loaded. The thread loads none of the ``LEAD - 1`` programs after the one the
caller took last, and keeps at most ``LOAD_WINDOW`` loaded and not taken; when the caller
takes none for ``LOAD_PATIENCE`` seconds, or drops the module (which the thread holds
weakly), it ends. A program loaded ahead counts (a hit, a binary load) only when the caller
takes it.

Nothing is trusted more for being read ahead: the entries come from
``Cache.get_many_views``, which checks every blob against its key, and the loader checks
each binary as it would any other (digest, crash guard). Binaries that need vetting, that
the crash guard blocklisted or set aside, or that the driver refused are left to the caller,
which vets, evicts and counts them only if it asks for them.
"""

from __future__ import annotations

import _thread
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from ..cache import Cache
from .ahead_limits import (
    CHUNK,
    FIRST_CHUNKS,
    LEAD,
    LOAD_CHUNK,
    LOAD_PATIENCE,
    LOAD_WINDOW,
    MAX_HELD,
    YIELD_SECONDS,
)
from .ahead_terms import NOT_HERE, Chunk, Loaded, Loader, Read, read_size
from .fork_gate import close_at_exit, gate
from .guard import binary_digest, bindings, guard
from .plan import ProgramPlan

__all__ = ["CHUNK", "LEAD", "LOAD_CHUNK", "LOAD_PATIENCE", "LOAD_WINDOW", "MAX_HELD", "ReadAhead"]


class ReadAhead:
    """Reads the entries of a module's programs on one background thread, a chunk at a time.

    ``names`` are the module's programs in order; ``plan_of(name)`` plans one. With ``load``
    (see :data:`Loader`), the thread also hands each program it read to the driver, at most
    :data:`LOAD_WINDOW` ahead of the caller, while the caller's own driver calls and kernels
    run: :meth:`take` then gives a :class:`Loaded`.
    """

    def __init__(
        self,
        cache: Cache,
        names: Sequence[str],
        plan_of: Callable[[str], ProgramPlan],
        load: Loader | None = None,
    ) -> None:
        self._cache = cache
        self._names = list(names)
        self._plan_of = plan_of
        self._load = load
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a loaded program taken, or stop()
        self._loading: dict[str, threading.Event] = {}  # being loaded on the thread now
        self._loaded: dict[str, tuple[Loaded, Chunk]] = {}  # loaded, not yet taken
        self._order: dict[str, int] = {}  # each program's place in the chunks
        # The place of the program the caller last took: the thread loads places from
        # LEAD after it on. (-2: the caller is loading the program before the first.)
        self._asked = -2
        self._chunks: list[Chunk] = []
        self._where: dict[str, Chunk] = {}
        self._first: str | None = None
        self._laid_out = False
        self._begun = False
        # A plain flag, not an Event: the finalizer sets it on whatever thread drops the
        # module, maybe one inside an Event's own lock (a collection while it is held).
        self._stopped = False
        self._held = 0  # bytes read and not yet taken
        self._pid = os.getpid()
        self._finished = threading.Event()  # set when the thread ends (or never starts)

    def start(self, first: str, owner: object | None = None) -> None:
        """Read every program but ``first``, in order from the one after it, once the
        caller has asked for another program (:meth:`take`) and read it (:meth:`begin`);
        nothing is done before that. When ``owner`` (the module, which ``plan_of`` and
        ``load`` should hold weakly) is collected, the thread stops."""
        self._first = first
        if owner is not None:
            weakref.finalize(owner, self._owner_gone).atexit = False

    def _owner_gone(self) -> None:
        # The collector's, on any thread, maybe one holding the lock: wake only if it is free.
        self._stopped = True
        if self._lock.acquire(blocking=False):
            self._room.notify_all()
            self._lock.release()

    def _lay_out(self, asked: str) -> None:
        # The chunks, made when the caller first comes back, for ``asked`` (under the
        # lock): every program but the first and that one, which the caller reads itself.
        first = self._first
        if first in self._names:
            at = self._names.index(first)
            rest = self._names[at + 1 :] + self._names[:at]
        else:
            rest = list(self._names)
        if asked in rest:
            rest.remove(asked)
        at = 0
        sizes = (*FIRST_CHUNKS, *[CHUNK] * (len(rest) // CHUNK + 1))
        if self._load is not None:  # a caller that asks for the next waits for one read
            sizes = (1, *[LOAD_CHUNK] * (len(rest) // LOAD_CHUNK + 1))
        self._order = {name: at for at, name in enumerate(rest)}
        for size in sizes:
            if at >= len(rest):
                break
            self._chunks.append(Chunk(rest[at : at + size]))
            at += size
        self._where = {name: chunk for chunk in self._chunks for name in chunk.names}
        self._laid_out = True

    def begin(self) -> None:
        """Start the thread, when the caller has come back for a program after the first
        (:meth:`take`) and there is something left to read; otherwise do nothing. The
        caller calls it after its own read, just before its driver call."""
        if os.getpid() != self._pid:  # a forked child: the lock may be the parent's, take()
            return  # reads nothing there
        if self._begun:  # asked again on every later program: no lock for that
            return
        with self._lock:
            if (
                self._begun
                or not self._laid_out
                or self._stopped
                or not any(chunk.names for chunk in self._chunks)
            ):
                return
            self._begun = True
        if self._load is not None:
            close_at_exit()
        # A bare thread: threading.Thread.start() waits until the new thread runs, which
        # costs the caller a GIL hand-over. Like a daemon thread, it does not hold up the
        # interpreter's exit.
        _thread.start_new_thread(self._run, ())

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; whether it has (``True`` if it never started, and
        in a forked child, which has no thread)."""
        if os.getpid() != self._pid:
            return True
        with self._lock:
            begun = self._begun
        return self._finished.wait(timeout) if begun else True

    def stop(self) -> None:
        """Read and load nothing more (``build_all`` reads the rest its own way)."""
        if os.getpid() != self._pid:  # (a forked child: the lock may be the parent thread's)
            self._stopped = True
            return
        with self._lock:
            self._stopped = True
            self._room.notify_all()

    def _run(self) -> None:
        try:
            for chunk in self._chunks:
                with self._lock:
                    if self._stopped or self._held > MAX_HELD:
                        break
                    chunk.started = True
                    if not chunk.names:  # all taken by the caller before the thread began
                        chunk.done.set()
                        continue
                found: dict[str, Read] = {}
                tally: dict[str, tuple[int, float]] = {}
                try:
                    with gate.reading():
                        found = self._read(chunk.names, tally)
                except Exception:  # the caller fetches these itself, and sees the error then
                    found = {}
                finally:
                    with self._lock:
                        chunk.found, chunk.tally = found, tally
                        self._held += sum(read_size(read) for read in found.values())
                    chunk.done.set()
                if self._load is not None:
                    self._load_chunk(chunk)
        finally:
            with self._lock:
                self._stopped = True  # (the thread is gone: nothing more is read or loaded)
            for chunk in self._chunks:  # never leave a waiter behind
                chunk.done.set()
            self._finished.set()

    def _load_chunk(self, chunk: Chunk) -> None:
        """Hand the chunk's programs the caller has not taken to the driver, in order,
        keeping at most :data:`LOAD_WINDOW` loaded and not taken."""
        assert self._load is not None
        for name in list(chunk.names):
            with self._lock:
                while len(self._loaded) + len(self._loading) >= LOAD_WINDOW:
                    if self._stopped:
                        return
                    if not self._room.wait(LOAD_PATIENCE):  # the caller asks for no more
                        self._stopped = True
                        return
                if self._stopped:
                    return
                if self._order[name] < self._asked + LEAD:
                    continue  # the caller's next: left read, for it to load
                read = chunk.found.pop(name, None)
                if read is None:  # taken by the caller, or not found
                    continue
                done = self._loading[name] = threading.Event()
            outcome: Any = NOT_HERE
            try:
                with gate.reading(load=True):  # (the driver's locks are held meanwhile)
                    outcome = self._load(name, read)
            except Exception:  # the caller loads it itself, and sees the error then
                self._stopped = True
            finally:
                with self._lock:
                    del self._loading[name]
                    if outcome is NOT_HERE:
                        chunk.found[name] = read  # the caller's, as read
                    elif outcome is not None:
                        self._loaded[name] = (Loaded(outcome, read), chunk)
                    else:  # refused and evicted: the caller reads it again (a miss)
                        self._held -= read_size(read)
                done.set()

    def _read(self, names: list[str], tally: dict[str, tuple[int, float]]) -> dict[str, Read]:
        plans: dict[str, ProgramPlan] = {}
        for name in names:
            plans[name] = self._plan_of(name)
            # Planning holds the GIL throughout; a short sleep between plans hands it to
            # the caller when its driver call returns (time.sleep(0) would take it back
            # before the caller wakes), so the caller never waits out a chunk's plans.
            time.sleep(YIELD_SECONDS)
        wanted = [k for plan in plans.values() if plan.keys is not None for k in plan.keys]
        # Misses are the caller's to count: it reads again what was not found here. Hits
        # are counted when taken: a program never asked for was no hit.
        found = (
            self._cache.get_many_views(wanted, count_misses=False, defer_hits=tally)
            if wanted
            else {}
        )
        out: dict[str, Read] = {}
        for name, plan in plans.items():
            keys = [str(k) for k in plan.keys or ()]
            if keys and all(k in found for k in keys):
                digests = [binary_digest(found[k]) for k in keys]
                # Off the caller's thread (a known binary stays known; see screen_binaries)
                standing = guard.standing(bindings(plan.keys, digests), digests)
                out[name] = (plan, {k: found[k] for k in keys}, digests, standing)
        return out

    def take(self, name: str) -> Read | Loaded | None:
        """What was read for ``name`` (waiting for its chunk if it is being read), or the
        program loaded from it (waiting if it is being loaded), or ``None``: not read
        ahead, not found, refused, or not yet reached (fetch it yourself)."""
        if os.getpid() != self._pid or name == self._first:
            return None  # a forked child has no reading thread; the first is the caller's
        with self._lock:
            if not self._laid_out:
                self._lay_out(name)
            chunk = self._where.get(name)
            if chunk is not None and not chunk.started:
                chunk.names.remove(name)  # not reached yet: the caller reads it, not the thread
                del self._where[name]
                chunk = None
            self._asked = self._order.get(name, self._asked)
        if chunk is None:
            return None
        chunk.done.wait()
        return self._hand_out(name, chunk)

    def take_loaded(self, name: str) -> Loaded | None:
        """The program loaded ahead for ``name`` and not yet taken, waiting only if it is
        being loaded (``build_all`` adopts it rather than load it again); else ``None``."""
        if os.getpid() != self._pid:
            return None
        got = self._hand_out(name, None)
        return got if isinstance(got, Loaded) else None

    def loads_begun(self) -> list[str]:
        """The programs the thread loaded and nobody took yet, and those it is loading."""
        if os.getpid() != self._pid:  # (a forked child: the lock may be the parent thread's)
            return []
        with self._lock:
            return [*self._loaded, *self._loading]

    def _hand_out(self, name: str, chunk: Chunk | None) -> Read | Loaded | None:
        # What was read for ``name`` in ``chunk`` (if given) or loaded from it, waiting for
        # a load of it under way; ``None`` when not found, or refused. Its hits counted.
        while True:
            with self._lock:
                got: Read | Loaded | None = chunk.found.pop(name, None) if chunk else None
                if got is None and name in self._loaded:
                    got, chunk = self._loaded.pop(name)
                    self._room.notify_all()
                if got is not None and chunk is not None:
                    used = self._handed(got, chunk)
                    break
                loading = self._loading.get(name)
                if loading is None:
                    return None
            loading.wait()  # then handed back as read, loaded, or refused
        self._cache.count_hits(used)
        return got

    def _handed(self, got: Read | Loaded, chunk: Chunk) -> list[tuple[int, float]]:
        # (under the lock) What ``got`` holds is no longer held; its hits, to count.
        read = got.read if isinstance(got, Loaded) else got
        self._held -= read_size(read)
        return [chunk.tally.pop(key) for key in read[1] if key in chunk.tally]

    @property
    def begun(self) -> bool:
        """Whether the thread has been started."""
        with self._lock:
            return self._begun

    @property
    def held(self) -> int:
        """Bytes read ahead and not yet taken."""
        with self._lock:
            return self._held

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "reading"
        return f"ReadAhead({len(self._names)} programs, {state})"
