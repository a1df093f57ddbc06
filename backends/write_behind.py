"""A background writer for a remote backend: callers queue writes and never wait on the network.

Writes are coalesced by key (the latest value wins) in a bounded queue; when
the queue is full a new key is dropped and counted, never blocked on. Until a
queued write lands, :meth:`WriteBehind.lookup` answers for it, so a reader in
this process sees its own writes. Every live writer is flushed when the process
ends normally: at interpreter exit, and at the end of a ``multiprocessing`` child,
which skips ``atexit`` (:mod:`runtime_cache.process_exit`). A ``fork()`` waits for
the batch in flight. :class:`FlushingLease` releases a build lease only after the
queued writes were attempted, so a waiter does not take over before the holder's
entry landed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping

from runtime_cache.api import Backend, Lease
from runtime_cache.errors import EntryTooLargeError
from runtime_cache.fork_holds import ForkHold
from runtime_cache.process_exit import at_exit
from runtime_cache.refusals import Refusals

__all__ = ["FlushingLease", "WriteBehind"]

log = logging.getLogger(__name__)

_BATCH = 256
_live: weakref.WeakSet[WriteBehind] = weakref.WeakSet()
#: Among a ``multiprocessing`` child's finalizers: after the OpenCL stores that feed it.
EXIT_PRIORITY = 10


def _flush_all_at_exit() -> None:
    for writer in list(_live):
        writer.flush(timeout=5.0)


at_exit(_flush_all_at_exit, priority=EXIT_PRIORITY)


#: Seconds a ``fork()`` waits, at most, for the writers' first batches in flight.
FORK_WAIT = 5.0
_held: list[WriteBehind] = []  # the writers the hook before a fork holds, to let go after


def _hold_all_for_fork() -> None:
    # A writer's first batch connects, and redis-py imports modules as it does
    # (``email.parser``, ``encodings.idna``): forked mid-import, a child would find them
    # half made and fail every write it sends. So a fork waits for the first batches in
    # flight, FORK_WAIT seconds in all (not a writer), and holds each queue's lock through
    # the fork so that no other batch starts.
    deadline = time.monotonic() + FORK_WAIT
    for writer in list(_live):
        writer.hold_for_fork(deadline)
        _held.append(writer)


def _release_all_after_fork() -> None:
    # Exactly those held: a writer made while the hook waited was never held (letting go
    # of it raised, and left the writers after it held for good: the review of session 41).
    held = list(_held)
    _held.clear()
    for writer in held:
        writer.release_after_fork()


def _reset_all_in_child() -> None:
    # A fork copies the locks as they were: one the writer thread held (sending a batch)
    # would stay held in the child, which has no such thread, and its first delete would
    # wait for good. Every writer starts over with fresh locks and nothing queued.
    _held.clear()  # (the parent lets go of its own)
    for writer in list(_live):
        writer._start_over()


os.register_at_fork(
    before=_hold_all_for_fork,
    after_in_parent=_release_all_after_fork,
    after_in_child=_reset_all_in_child,
)


class WriteBehind(ForkHold):
    """Applies queued ``set`` writes to ``backend`` from a daemon thread.

    Args:
        backend: the (remote) backend to write to.
        max_items: how many distinct keys may wait; more are dropped and counted.
        max_bytes: how many bytes of values may wait; more are dropped and counted.
        on_error: called with each exception a batch of writes raised.
        on_success: called after each batch of writes that landed whole.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_items: int = 1024,
        max_bytes: int = 64 << 20,
        on_error: Callable[[BaseException], None] | None = None,
        on_success: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._on_error = on_error
        self._on_success = on_success
        self._cond = threading.Condition()
        self._pending: dict[str, bytes] = {}
        self._inflight: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        self._forking = False  # a fork waits for the batch in flight: start no other
        self._sent_one = False  # (a fork waits for the first batch alone)
        #: Serializes a batch with a synchronous delete of the same backend.
        self.apply_lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        self.failed = 0
        #: Keys whose latest queued write was refused for its size, or dropped as larger
        #: than the whole queue: writes that will not land however often they are made.
        self.refusals = Refusals()
        _live.add(self)

    def in_flight_at_fork(self) -> bool:
        """Whether this writer's first batch is in flight (a fork waits for it, and holds
        the queue's lock through the fork so that no other batch starts)."""
        if self._pid != os.getpid() or self._thread is threading.current_thread():
            return False  # (a fork from the writer thread itself does not wait for itself)
        return bool(self._inflight) and not self._sent_one  # (later batches import nothing)

    def _start_over(self) -> None:
        # In a forked child: the parent owns (and writes) what was queued before the fork.
        self._cond = threading.Condition()
        self.apply_lock = threading.Lock()
        self._pending = {}
        self._inflight = {}
        self._pending_bytes = 0
        self._thread = None
        self._pid = os.getpid()
        self._forking = self._sent_one = False
        self.refusals = Refusals()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(
                target=self._run, name="runtime-cache-write-behind", daemon=True
            )
            self._thread.start()
            # In a multiprocessing child (a fork's first write starts its thread): flushed
            # at the child's end too, which runs no atexit handler.
            at_exit(_flush_all_at_exit, priority=EXIT_PRIORITY)

    def put(self, items: Mapping[str, bytes]) -> int:
        """Queue writes; return how many were accepted (the rest were dropped)."""
        if self._pid != os.getpid():  # a child the fork hook did not reach (a raw fork()):
            self._start_over()  # before taking the lock it replaces
        accepted = 0
        with self._cond:
            self._ensure_thread()
            for key, value in items.items():
                old = self._pending.pop(key, None)
                if old is not None:
                    self._pending_bytes -= len(old)
                full = len(self._pending) >= self.max_items
                if full or self._pending_bytes + len(value) > self.max_bytes:
                    self.dropped += 1
                    if len(value) > self.max_bytes:  # never fits, however often queued
                        self.refusals.refused([key])
                    else:  # a full queue: the next write of it may fit
                        self.refusals.landed([key])
                    self._say_dropped(key, len(value), full)
                    continue
                self._pending[key] = bytes(value)
                self._pending_bytes += len(value)
                accepted += 1
            self._cond.notify_all()
        return accepted

    def _say_dropped(self, key: str, size: int, full: bool) -> None:
        # Once at warning level (then at debug): a dropped write never reaches the shared
        # store, so the fleet's other processes build that entry themselves.
        why = (
            f"{self.max_items} writes wait already"
            if full
            else f"the queue holds at most {self.max_bytes} bytes (queue_bytes)"
        )
        level = logging.DEBUG if self.dropped > 1 else logging.WARNING
        log.log(
            level,
            "runtime-cache: the write of %s (%d bytes) to %r was dropped: %s",
            key,
            size,
            self.backend,
            why,
        )

    def lookup(self, key: str) -> bytes | None:
        """The value queued (or being written) for ``key``, if any."""
        with self._cond:
            value = self._pending.get(key)
            return self._inflight.get(key) if value is None else value

    def queued_keys(self) -> list[str]:
        """Keys with a write not yet confirmed."""
        with self._cond:
            return list(dict.fromkeys([*self._inflight, *self._pending]))

    def discard(self, key: str) -> bool:
        """Drop a queued write of ``key``; return whether one was queued.

        Call it while holding :attr:`apply_lock`, so the write cannot be in progress.
        """
        with self._cond:
            old = self._pending.pop(key, None)
            if old is not None:
                self._pending_bytes -= len(old)
            # The batch in flight is applied under apply_lock; a caller holding that
            # lock may take a key out of it before it is written.
            return old is not None or self._inflight.pop(key, None) is not None

    def _take(self) -> dict[str, bytes] | None:
        with self._cond:
            while (not self._pending or self._forking) and not self._closed:
                self._cond.wait()
            if not self._pending:
                return None
            keys = list(self._pending)[:_BATCH]
            batch = {k: self._pending.pop(k) for k in keys}
            self._pending_bytes -= sum(map(len, batch.values()))
            self._inflight = batch
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            sent = False  # (a first batch that failed imported nothing: forks wait on)
            try:
                with self.apply_lock:
                    if len(batch) == 1:
                        ((key, value),) = batch.items()
                        self.backend.set(key, value)
                    else:
                        self.backend.set_many(batch)
                self.written += len(batch)
                self.refusals.landed(batch)
                sent = True
                if self._on_success is not None:
                    self._on_success()
            except Exception as exc:  # counted and reported; the writer keeps going
                # A value refused for its size stops no other one of the batch.
                refused = set(exc.refused) if isinstance(exc, EntryTooLargeError) else set()
                lost = len(batch.keys() & refused) if refused else len(batch)
                self.failed += lost
                self.written += len(batch) - lost
                self.refusals.landed(batch.keys() - refused)
                self.refusals.refused(batch.keys() & refused)
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                with self._cond:
                    self._inflight = {}
                    self._sent_one = self._sent_one or sent
                    self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write was attempted; return ``False`` on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if self._pid != os.getpid() or self._thread is None:
                return not self._pending
            while self._pending or self._inflight:
                if not self._thread.is_alive():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    log.warning(
                        "runtime-cache: %d writes to %r still queued after %.1fs",
                        len(self._pending) + len(self._inflight),
                        self.backend,
                        timeout,
                    )
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Flush, then stop the thread (a later :meth:`put` starts a new one)."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)


class FlushingLease(Lease):
    """A lease on the remote store, released only after the queued writes were attempted
    (``flush(timeout)``, at most ``ttl`` in all per holding).

    Otherwise a waiter could take the lease over before the holder's entry
    reached the shared tier, and build it again.
    """

    def __init__(
        self,
        inner: Lease,
        flush: Callable[[float], bool],
        refused: Callable[[str], bool] = lambda _key: False,
    ) -> None:
        super().__init__(inner.key, inner.ttl)
        self._inner, self._flush, self._refused = inner, flush, refused
        #: When this holding's waits for the queue end (``time.monotonic``): its first wait
        #: starts the clock, so the ask and the release together wait at most ``ttl``.
        self._flush_until: float | None = None

    def _wait_for_queue(self) -> None:
        now = time.monotonic()
        if self._flush_until is None:
            self._flush_until = now + self.ttl
        self._flush(max(0.0, self._flush_until - now))

    def refused(self) -> bool:
        """Wait for the queued writes to be tried; whether the shared tier refused the key's
        latest write for its size. This wait and the release's share ``ttl``."""
        try:
            self._wait_for_queue()
            return self._refused(self.key)
        except Exception:  # the note is only a hint: say nothing was refused
            return False

    def _take(self) -> bool:
        self._flush_until = None
        return self._inner.acquire()

    def _extend(self) -> bool:
        return self._inner.renew()

    def _note(self, seconds: float) -> None:
        self._inner.note_unstored(seconds)

    def _noted(self) -> bool:
        return self._inner.unstored()

    def _drop(self) -> None:
        try:
            self._wait_for_queue()
        finally:
            self._inner.release()

    @property
    def held(self) -> bool:
        """Whether the inner lease is held (it renews itself)."""
        return self._held and self._inner.held

    @property
    def lost(self) -> bool:
        """Whether the inner lease was found gone at one of its renewals."""
        return self._lost or self._inner.lost
