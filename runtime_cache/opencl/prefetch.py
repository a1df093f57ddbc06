"""Lazy loads read ahead: the first ``program()`` of a module fetches the others' entries.

A module whose programs are asked for one at a time (``OpenCLModule.program``, the
way TVM-style modules and ``install()`` use it) would pay one backend call, and one
key plan, per program on the caller's thread. :class:`ReadAhead` moves that work
to one background thread: when the first program is asked for, it plans the keys
of the module's other programs and fetches their entries, a chunk of programs per
backend call, in the order of the module's sources from that program on. A later
``program()`` takes what was read for it, or waits for the chunk being read, or,
when the thread has not reached it yet, fetches it itself as before.

The thread keeps out of the caller's way, because both need the GIL (and, on a small
machine, the same cores). It does not start with the first program: a process's first
program costs what it costs without a read-ahead. The caller reads the second program
itself and then calls :meth:`ReadAhead.begin`, just before it hands that program to the
driver: the thread starts then, and reads from the third program on while the driver
loads the second, without the GIL. Started any earlier, the new thread took the GIL
from the caller's own read of the second program (on the 2-core box that program cost
about 1 ms more than the floor's). A module with nothing left to read starts no thread.

Nothing is trusted more for being read ahead: the entries come from
``Cache.get_many_views``, which checks every blob against its key, and the loader
checks each binary as it would any other (digest, crash guard, vetting).
"""

from __future__ import annotations

import _thread
import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from ..cache import Cache
from .guard import Binary, binary_digest
from .plan import ProgramPlan

__all__ = ["CHUNK", "ENV_READ_AHEAD", "MAX_HELD", "ReadAhead", "read_ahead_enabled"]

#: ``0`` (or ``off``, ``no``, ``false``) turns the read-ahead thread off: each program's
#: entries are then read on the caller's thread when it asks for the program.
ENV_READ_AHEAD = "RUNTIME_CACHE_OPENCL_READ_AHEAD"

#: Programs whose entries one backend call reads ahead; the first chunks are smaller,
#: so that a program asked for early waits for few others' reads. The chunks leave out
#: the program the caller reads itself when it comes back, so in-order calls see chunks
#: of 1, 2, 4, 8 from the third program. (With chunks of 2, 4, 8 from the third, the
#: fourth waited for four reads: on the H200, 12 programs, 0.57 ms over the floor's
#: program, against 0.11 ms with 1, 2, 4, 8.)
CHUNK = 16
_FIRST_CHUNKS = (1, 2, 4, 8)
#: Bytes read ahead and not yet taken at which the thread stops reading; the programs it
#: has not reached are then read one at a time, when asked for (a module whose caller
#: asks for few of many programs does not hold every binary in memory).
MAX_HELD = 64 << 20
#: Seconds a ``fork()`` waits for read-ahead reads in progress (see ``_ForkGate``).
FORK_WAIT = 10.0
#: The thread's pause between two programs' plans (see ``ReadAhead._read``).
YIELD_SECONDS = 20e-6

#: What was read for one program: its plan, the entries found under its keys, and the
#: binaries' digests in the order of the keys (hashed here, off the caller's thread, once).
Read = tuple[ProgramPlan, Mapping[str, Binary], list[str]]


class _ForkGate:
    """Holds ``fork()`` back while a read-ahead thread is inside the cache.

    A child has only the thread that forked; a lock that a reading thread held at the fork
    (a module's plan lock while it reads ``#include`` files, the cache's, the backend's)
    would stay locked there for ever. So ``fork()`` waits until no other thread is in
    :meth:`reading` (a chunk's read), at most :data:`FORK_WAIT` seconds, and no thread
    enters one until it is done. A fork from inside a read (a backend that forks) does
    not wait for itself.
    """

    def __init__(self) -> None:
        self._cond: threading.Condition
        self._inside: dict[int, int]  # reads in progress, per thread
        self._forking: bool
        self._reset()

    def _reset(self) -> None:
        # A new lock (in a child, the parent's is held through the fork), no reads going on.
        self._cond = threading.Condition(threading.Lock())
        self._inside = {}
        self._forking = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """The span of one chunk's read on a read-ahead thread."""
        me = threading.get_ident()
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                self._inside[me] -= 1
                if not self._inside[me]:
                    del self._inside[me]
                    self._cond.notify_all()

    def before_fork(self) -> None:
        """Wait for other threads' reads in progress; hold the gate shut through the fork."""
        me = threading.get_ident()
        self._cond.acquire()
        self._forking = True
        deadline = time.monotonic() + FORK_WAIT
        while any(who != me for who in self._inside):
            left = deadline - time.monotonic()
            if left <= 0:  # a read that hangs (a dead network file system): fork anyway
                break
            self._cond.wait(left)

    def after_fork_in_parent(self) -> None:
        """Open the gate again."""
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        """A fresh gate: the child has none of the parent's reading threads."""
        self._reset()


_gate = _ForkGate()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_gate.before_fork,
        after_in_parent=_gate.after_fork_in_parent,
        after_in_child=_gate.after_fork_in_child,
    )


def read_ahead_enabled() -> bool:
    """Whether a module's first ``program()`` may start a read-ahead (``ENV_READ_AHEAD``)."""
    value = os.environ.get(ENV_READ_AHEAD, "").strip().lower()
    return value not in ("0", "off", "no", "false")


class _Chunk:
    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.started = False
        self.done = threading.Event()
        self.found: dict[str, Read] = {}
        #: (bytes read, seconds saved) per key read: counted as a hit when taken.
        self.tally: dict[str, tuple[int, float]] = {}


class ReadAhead:
    """Reads the entries of a module's programs on one background thread, a chunk at a time.

    ``names`` are the module's programs in order; ``plan_of(name)`` plans one.
    """

    def __init__(
        self, cache: Cache, names: Sequence[str], plan_of: Callable[[str], ProgramPlan]
    ) -> None:
        self._cache = cache
        self._names = list(names)
        self._plan_of = plan_of
        self._lock = threading.Lock()
        self._chunks: list[_Chunk] = []
        self._where: dict[str, _Chunk] = {}
        self._first: str | None = None
        self._laid_out = False
        self._begun = False
        self._stop = threading.Event()
        self._held = 0  # bytes read and not yet taken
        self._pid = os.getpid()
        self._finished = threading.Event()  # set when the thread ends (or never starts)

    def start(self, first: str) -> None:
        """Read every program but ``first``, in order from the one after it, once the
        caller has asked for another program (:meth:`take`) and read it (:meth:`begin`);
        nothing is done before that."""
        self._first = first

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
        for size in (*_FIRST_CHUNKS, *[CHUNK] * (len(rest) // CHUNK + 1)):
            if at >= len(rest):
                break
            self._chunks.append(_Chunk(rest[at : at + size]))
            at += size
        self._where = {name: chunk for chunk in self._chunks for name in chunk.names}
        self._laid_out = True

    def begin(self) -> None:
        """Start the thread, when the caller has come back for a program after the first
        (:meth:`take`) and there is something left to read; otherwise do nothing. The
        caller calls it after its own read, just before its driver call."""
        if self._begun or os.getpid() != self._pid:
            # Begun (asked again on every later program: no lock for that), or a forked
            # child: the lock may be the parent thread's, and take() reads nothing there.
            return
        with self._lock:
            if (
                self._begun
                or not self._laid_out
                or self._stop.is_set()
                or not any(chunk.names for chunk in self._chunks)
            ):
                return
            self._begun = True
        # A bare thread: threading.Thread.start() waits until the new thread runs, which
        # costs the caller a GIL hand-over. Like a daemon thread, it does not hold up the
        # interpreter's exit.
        _thread.start_new_thread(self._run, ())

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to end; whether it has (``True`` if it never started)."""
        with self._lock:
            begun = self._begun
        return self._finished.wait(timeout) if begun else True

    def stop(self) -> None:
        """Read nothing more (``build_all`` reads the rest its own way)."""
        self._stop.set()

    def _run(self) -> None:
        try:
            for chunk in self._chunks:
                with self._lock:
                    if self._stop.is_set() or self._held > MAX_HELD:
                        break
                    chunk.started = True
                    if not chunk.names:  # all taken by the caller before the thread began
                        chunk.done.set()
                        continue
                found: dict[str, Read] = {}
                tally: dict[str, tuple[int, float]] = {}
                try:
                    with _gate.reading():
                        found = self._read(chunk.names, tally)
                except Exception:  # the caller fetches these itself, and sees the error then
                    found = {}
                finally:
                    with self._lock:
                        chunk.found, chunk.tally = found, tally
                        self._held += sum(_size(read) for read in found.values())
                    chunk.done.set()
        finally:
            for chunk in self._chunks:  # never leave a waiter behind
                chunk.done.set()
            self._finished.set()

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
                out[name] = (plan, {k: found[k] for k in keys}, digests)
        return out

    def take(self, name: str) -> Read | None:
        """What was read for ``name`` (waiting for its chunk if it is being read), or
        ``None``: not read ahead, not found, or not yet reached (fetch it yourself)."""
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
        if chunk is None:
            return None
        chunk.done.wait()
        with self._lock:
            read = chunk.found.pop(name, None)
            if read is None:
                return None
            self._held -= _size(read)
            used = [chunk.tally.pop(key) for key in read[1] if key in chunk.tally]
        self._cache.count_hits(used)
        return read

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
        state = "stopped" if self._stop.is_set() else "reading"
        return f"ReadAhead({len(self._names)} programs, {state})"


def _size(read: Read) -> int:
    return sum(len(value) for value in read[1].values())
