"""Store the binaries of pyopencl's source builds off the caller's path (:func:`install`).

Storing a program means reading its binaries back from the driver, and some
drivers do real work for that read: PoCL 3.1 compiles every kernel of the
program for it, a second or more for one of pyopencl's scans, under its one
compiler lock. :func:`install` therefore hands each program it built from
source to :data:`write_behind` and returns; the binaries are read (with the
GIL released, :mod:`.readback`) and stored later:

* ``deferred`` (the default): at :func:`~runtime_cache.opencl.flush`, in the
  thread that calls it, or at exit; or, where ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS`` is
  set (off by default: :mod:`.store_timing`), once the caller's builds have been quiet
  that long, handed to a detached store where that is how the exit would store them
  (below), so that a service stopped by ``SIGTERM`` has them stored too. Never read
  back while the caller's own OpenCL calls run: on PoCL 3.1, a read on another thread
  while the caller launches kernels aborts the process (``pocl_release_dlhandle_cache: Assertion
  `found->ref_count > 0' failed``), whatever the specification says about
  ``clGetProgramInfo``; and its compiler lock would make the caller wait anyway.
* ``background``: also by one background thread, once the caller's builds have
  been quiet for ``RUNTIME_CACHE_OPENCL_STORE_DELAY`` seconds (default 1). Only
  for a driver that is safe with that.

For both:

* Exactly the driver's bytes are stored, from the very program the caller
  built (the queue keeps a reference until it is stored), under the keys
  planned before the build; the entry check on every later read stays.
* The queue is bounded (:data:`QUEUE_LIMIT` programs): when it is full, the
  caller stores the program itself, so memory never grows without limit.
* An error while storing is counted (``opencl_stats().store_errors``) and
  logged, never raised into the caller: the program is simply not stored.
* At exit (the end of a ``multiprocessing`` child too, :mod:`..process_exit`) the queued
  programs are handed to a detached process where reading
  them back is slow and the store can be reopened there (:mod:`.detached_store`:
  ``opencl_stats().stores_handed_off``), so the process exits at once; the rest
  are flushed for at most ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS`` (default 60,
  checked between programs); what is left is counted
  (``opencl_stats().stores_dropped``), logged, and built again by a later run.
* A forked child starts with an empty queue and no thread: the parent's programs stay
  the parent's to store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import Any

from ..cache import Cache
from ..process_exit import at_exit
from .counters import counters
from .detached_store import SLOW_READ_SECONDS, compiles_on_read, detach_mode, hand_off
from .plan import ProgramPlan
from .pocl_flags import pocl_flags_unknown
from .store_jobs import StoreJob, driver_program, group_by_store, store_now
from .store_timing import (
    ENV_FLUSH_SECONDS,
    ENV_IDLE_SECONDS,
    ENV_STORE_DELAY,
    flush_seconds,
    idle_seconds,
    store_delay,
)

__all__ = [
    "ENV_FLUSH_SECONDS",
    "ENV_IDLE_SECONDS",
    "ENV_STORE_DELAY",
    "QUEUE_LIMIT",
    "WriteBehind",
    "store_now",
    "write_behind",
]

log = logging.getLogger(__name__)

QUEUE_LIMIT = 512
#: Among a ``multiprocessing`` child's finalizers: before the tiers' writers it feeds.
EXIT_PRIORITY = 50


class WriteBehind:
    """A bounded queue of built programs whose binaries are read back and stored later.

    Deferred programs are stored by :meth:`flush`, in the thread that calls it
    (at exit: the main thread, once the program is done with OpenCL), or handed off
    by one background thread once ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS`` have passed
    since the last submit (:meth:`detach`'s rules, less its timed read-back).
    Background programs are also stored by that thread, once
    ``RUNTIME_CACHE_OPENCL_STORE_DELAY`` seconds have passed since the last
    submit.

    Example::

        write_behind.submit(cache, plan, program, build_seconds)  # returns at once
        write_behind.flush(timeout=10.0)                         # True once all are stored
    """

    def __init__(self, limit: int = QUEUE_LIMIT) -> None:
        self._limit = limit
        self._cond = threading.Condition()
        self._jobs: deque[StoreJob] = deque()
        self._queued: set[str] = set()  # the first key of each queued program
        self._busy = 0  # queued plus those being stored
        self._last = 0.0  # time.monotonic() of the last submit
        self._idle_mark = 0.0  # the ``_last`` that the thread's last hand-off followed
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(
        self,
        cache: Cache,
        plan: ProgramPlan,
        program: Any,
        seconds: float,
        *,
        background: bool = False,
        made: Any = None,
    ) -> bool:
        """Queue ``program`` for storing; ``False`` when the queue is full or closed
        (the caller stores it then, with :func:`store_now`). A program whose keys
        are already queued (built again before it was stored) is not queued twice.
        ``background`` lets the background thread store it (see the module's notes);
        ``made`` is as for :func:`store_now`."""
        assert plan.keys is not None
        first = str(plan.keys[0])
        with self._cond:
            if first in self._queued:
                return True
            if self._closed or len(self._jobs) >= self._limit:
                return False
            self._queued.add(first)
            self._last = time.monotonic()
            made = driver_program(program) if made is None else made
            self._jobs.append(StoreJob(cache, plan, program, seconds, made, background))
            self._busy += 1
            # Registered at the first submit, after pyopencl's own handlers: runs before them.
            at_exit(self.flush_at_exit, priority=EXIT_PRIORITY)
            if self._thread is None and (background or idle_seconds() is not None):
                self._thread = threading.Thread(
                    target=self._run, name="runtime-cache-store", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        return True

    def pending(self) -> int:
        """How many programs are queued or being stored."""
        with self._cond:
            return self._busy

    def flush(self, timeout: float | None = None) -> bool:
        """Store every queued program; ``False`` if ``timeout`` ran out first.

        The queued programs are stored in the calling thread, one at a time, and
        ``timeout`` is checked between them (one read-back may overrun it).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                if not self._jobs:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                job = self._jobs.popleft()
            self._store(job)
        with self._cond:  # one the background thread is storing
            while self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float) -> int:
        """Flush for at most ``timeout`` seconds, then stop; return how many were dropped."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            dropped = len(self._jobs)
            self._jobs.clear()
            self._queued.clear()
            self._busy -= dropped
            self._cond.notify_all()
        return dropped

    def flush_at_exit(self) -> None:
        """Hand the queued programs to a detached store where reading them back is slow
        (:mod:`.detached_store`); flush the rest within ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS``,
        then stop; count what is left."""
        bound = flush_seconds()
        self.detach()
        left = self.pending()
        dropped = self.close(bound)
        if dropped:
            counters.add(stores_dropped=dropped)
            log.warning(
                "runtime-cache: %d of %d programs' binaries were not stored: the flush at exit "
                "is bounded by %s=%s s; a later run builds them again",
                dropped,
                left,
                ENV_FLUSH_SECONDS,
                bound,
            )

    def detach(self) -> int:
        """Hand the queued programs to one detached process per cache, as
        ``RUNTIME_CACHE_OPENCL_DETACH`` says (see :mod:`.detached_store`); return
        how many were handed off. Those it cannot hand off stay queued."""
        mode = detach_mode()
        if mode == "off":
            return 0
        with self._cond:  # taken out, still counted busy: the background thread skips them
            jobs = list(self._jobs)
            self._jobs.clear()
        if jobs and mode == "auto" and not compiles_on_read(jobs[0].plan.devices):
            first = jobs.pop(0)  # stored here, timed: is a read-back slow on this driver?
            started = time.perf_counter()
            self._store(first)
            if time.perf_counter() - started < SLOW_READ_SECONDS:
                self._requeue(jobs)
                return 0
        return self._hand_off(jobs)

    def _hand_off(self, jobs: list[StoreJob]) -> int:
        """Hand ``jobs`` (taken out of the queue) off by cache; requeue the rest."""
        kept: list[StoreJob] = []
        handed = 0
        for group in group_by_store(jobs):
            # Not PoCL's, where this process changed its extra flags since those builds: the
            # detached process would build with the new ones (they are stored here).
            here = [j for j in group if pocl_flags_unknown(j.plan.devices)]
            kept += here
            group = [j for j in group if j not in here]
            if group and hand_off(group[0].cache, [(j.plan, j.seconds) for j in group]):
                handed += len(group)
                self._release(group)
            else:
                kept += group
        self._requeue(kept)
        if handed:
            counters.add(stores_handed_off=handed)
            log.info("runtime-cache: %d programs' binaries handed to a detached store", handed)
        return handed

    def _requeue(self, jobs: list[StoreJob]) -> None:
        with self._cond:
            self._jobs.extendleft(reversed(jobs))
            self._cond.notify_all()

    def _release(self, jobs: list[StoreJob]) -> None:
        with self._cond:
            for job in jobs:
                self._queued.discard(str(job.plan.keys[0]) if job.plan.keys else "")
            self._busy -= len(jobs)
            self._cond.notify_all()

    def _reset_after_fork(self) -> None:
        self._cond = threading.Condition()
        self._jobs = deque()
        self._queued = set()
        self._busy = 0
        self._last = self._idle_mark = 0.0
        self._thread = None  # (threads do not survive a fork: a submit starts one)
        self._closed = False

    def _store(self, job: StoreJob) -> None:
        try:
            stored = store_now(job.cache, job.plan, job.program, job.seconds, job.made)
            if not stored and job.cache.enabled:
                counters.add(store_errors=1)  # refused (a full or read-only store): counted too
        except Exception as exc:  # the caller's build succeeded: never its error
            counters.add(store_errors=1)
            log.warning("runtime-cache: storing a program's binaries failed: %s", exc)
        finally:
            with self._cond:
                self._queued.discard(str(job.plan.keys[0]) if job.plan.keys else "")
                self._busy -= 1
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                task = self._next_task()
            if task is None:
                return
            background, jobs = task
            if background:
                self._store(jobs[0])
            else:
                self._idle_hand_off(jobs)

    def _next_task(self) -> tuple[bool, list[StoreJob]] | None:
        """Under the lock: wait for a background program to store, or for the deferred
        ones to hand off once builds are quiet; ``None`` once closed."""
        while not self._closed:
            quiet = time.monotonic() - self._last
            waits: list[float] = []
            job = next((j for j in self._jobs if j.background), None)
            if job is not None:
                if quiet >= store_delay():
                    self._jobs.remove(job)
                    return True, [job]
                waits.append(store_delay() - quiet)
            idle = idle_seconds()
            deferred = [j for j in self._jobs if not j.background]
            if idle is not None and deferred and self._idle_mark != self._last:
                if quiet >= idle:  # taken out, still counted busy (as detach() does)
                    self._idle_mark = self._last
                    self._jobs = deque(j for j in self._jobs if j.background)
                    return False, deferred
                waits.append(idle - quiet)
            self._cond.wait(min(waits) if waits else None)
        return None

    def _idle_hand_off(self, jobs: list[StoreJob]) -> None:
        """Hand the deferred programs off where the exit would, with no read-back here
        (that stays the caller's thread's): on a driver that compiles for it, or always
        under ``RUNTIME_CACHE_OPENCL_DETACH=1``. The others stay queued for the exit."""
        try:
            mode = detach_mode()
            if mode == "always" or (mode == "auto" and compiles_on_read(jobs[0].plan.devices)):
                self._hand_off(jobs)
                return
        except Exception as exc:  # the caller's programs are still stored at exit
            log.warning("runtime-cache: handing stores off once builds were quiet failed: %s", exc)
        self._requeue(jobs)


#: The queue :func:`install` uses.
write_behind = WriteBehind()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=write_behind._reset_after_fork)
