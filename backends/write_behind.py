"""A background writer for a remote backend: callers queue writes and never wait on the network.

Writes are coalesced by key (the latest value wins) in a bounded queue; when
the queue is full a new key is dropped and counted, never blocked on. Until a
queued write lands, :meth:`WriteBehind.lookup` answers for it, so a reader in
this process sees its own writes. Every live writer is flushed at interpreter
exit. :class:`FlushingLease` releases a build lease only after the queued writes
were attempted, so a waiter does not take over before the holder's entry landed.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping

from runtime_cache.api import Backend, Lease
from runtime_cache.errors import EntryTooLargeError

__all__ = ["FlushingLease", "LostWrites", "WriteBehind"]

log = logging.getLogger(__name__)

_BATCH = 256
#: How many lost keys :class:`LostWrites` remembers (the newest).
_LOST_KEPT = 4096
_live: weakref.WeakSet[WriteBehind] = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for writer in list(_live):
        writer.flush(timeout=5.0)


def _reset_all_in_child() -> None:
    # A fork copies the locks as they were: one the writer thread held (sending a batch)
    # would stay held in the child, which has no such thread, and its first delete would
    # wait for good. Every writer starts over with fresh locks and nothing queued.
    for writer in list(_live):
        writer._start_over()


os.register_at_fork(after_in_child=_reset_all_in_child)


class LostWrites:
    """The keys whose latest write to a store did not land (dropped, refused or failed),
    the newest 4,096 of them: what a build lease asks before its holder lets the key go."""

    def __init__(self) -> None:
        self._keys: dict[str, None] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():  # a forked child: the lock may have been held at the fork
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def mark(self, keys: Iterable[str]) -> None:
        """Note that the latest writes of ``keys`` did not land."""
        with self._locked():
            for key in keys:
                self._keys.pop(key, None)
                self._keys[key] = None
            while len(self._keys) > _LOST_KEPT:
                del self._keys[next(iter(self._keys))]

    def clear(self, keys: Iterable[str]) -> None:
        """Note that the latest writes of ``keys`` landed."""
        with self._locked():
            for key in keys:
                self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class WriteBehind:
    """Applies queued ``set`` writes to ``backend`` from a daemon thread.

    Args:
        backend: the (remote) backend to write to.
        max_items: how many distinct keys may wait; more are dropped and counted.
        max_bytes: how many bytes of values may wait; more are dropped and counted.
        on_error: called with each exception a batch of writes raised.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_items: int = 1024,
        max_bytes: int = 64 << 20,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.backend = backend
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._on_error = on_error
        self._cond = threading.Condition()
        self._pending: dict[str, bytes] = {}
        self._inflight: dict[str, bytes] = {}
        self._pending_bytes = 0
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        #: Serializes a batch with a synchronous delete of the same backend.
        self.apply_lock = threading.Lock()
        self.dropped = 0
        self.written = 0
        self.failed = 0
        #: Keys whose latest queued write was dropped, refused or failed.
        self.lost = LostWrites()
        _live.add(self)

    def _start_over(self) -> None:
        # In a forked child: the parent owns (and writes) what was queued before the fork.
        self._cond = threading.Condition()
        self.apply_lock = threading.Lock()
        self._pending = {}
        self._inflight = {}
        self._pending_bytes = 0
        self._thread = None
        self._pid = os.getpid()
        self.lost = LostWrites()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(
                target=self._run, name="runtime-cache-write-behind", daemon=True
            )
            self._thread.start()

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
                    self.lost.mark([key])
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
            while not self._pending and not self._closed:
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
            try:
                with self.apply_lock:
                    if len(batch) == 1:
                        ((key, value),) = batch.items()
                        self.backend.set(key, value)
                    else:
                        self.backend.set_many(batch)
                self.written += len(batch)
                self.lost.clear(batch)
            except Exception as exc:  # counted and reported; the writer keeps going
                # A value refused for its size stops no other one of the batch.
                refused = exc.refused if isinstance(exc, EntryTooLargeError) else ()
                lost = batch.keys() & refused if refused else batch.keys()
                self.failed += len(lost)
                self.written += len(batch) - len(lost)
                self.lost.clear(batch.keys() - lost)
                self.lost.mark(lost)
                if self._on_error is not None:
                    self._on_error(exc)
            finally:
                with self._cond:
                    self._inflight = {}
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
    (``flush(timeout)``).

    Otherwise a waiter could take the lease over before the holder's entry
    reached the shared tier, and build it again.
    """

    def __init__(
        self,
        inner: Lease,
        flush: Callable[[float], bool],
        landed: Callable[[str], bool] = lambda _key: True,
    ) -> None:
        super().__init__(inner.key, inner.ttl)
        self._inner, self._flush, self._landed = inner, flush, landed

    def landed(self) -> bool:
        """Wait (up to ``ttl``) for the queued writes to be tried; whether the key's landed."""
        try:
            return self._flush(self.ttl) and self._landed(self.key)
        except Exception:  # the note is only a hint: say nothing was lost
            return True

    def _take(self) -> bool:
        return self._inner.acquire()

    def _extend(self) -> bool:
        return self._inner.renew()

    def _note(self, seconds: float) -> None:
        self._inner.note_unstored(seconds)

    def _noted(self) -> bool:
        return self._inner.unstored()

    def _drop(self) -> None:
        try:
            self._flush(self.ttl)
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
