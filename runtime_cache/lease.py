"""Build leases: the contract a backend's lease keeps (:class:`Lease`).

A lease says, across processes and machines, that one of them is building a key's entry,
so the others wait for it rather than build it too (:mod:`runtime_cache.fleet`). Backends
make them (:meth:`runtime_cache.api.Backend.lease`); ``runtime_cache.api.Lease`` is this
class.
"""

from __future__ import annotations

import abc
import threading
from typing import ClassVar

__all__ = ["Lease"]


class Lease(abc.ABC):
    """A cross-process lease on one key: while held, others know a build of it runs.

    Made by :meth:`runtime_cache.api.Backend.lease`, not held. :meth:`acquire` tries once without
    waiting; while held, leases that expire (``renews = True``) are renewed by a
    background thread every ``ttl / 3`` seconds. :attr:`lost` turns true when a
    renewal finds the lease gone (it expired, or was broken as stale).
    :meth:`release` never raises: a lease that cannot be dropped expires. As a
    context manager, the lease is released on exit::

        lease = backend.lease("opencl/program-binary/3f2a...", ttl=15)
        if lease is not None and lease.acquire():
            with lease:
                build_and_store()

    Subclasses implement :meth:`_take`, :meth:`_extend` and :meth:`_drop`; those with a
    place for a note beside the lease also implement :meth:`_note` and :meth:`_noted`
    (:meth:`note_unstored`).
    """

    #: Whether the lease expires unless renewed (then a thread renews it while held).
    renews: ClassVar[bool] = False
    #: Whether only this process's threads see the lease (``memory://``). ``get_or_build``
    #: skips such leases: its single-flight already covers the threads of one process.
    local: ClassVar[bool] = False

    def __init__(self, key: str, ttl: float) -> None:
        if not ttl > 0:
            raise ValueError(f"a lease needs a positive ttl, not {ttl!r}")
        self.key = key
        self.ttl = float(ttl)
        self._lock = threading.Lock()  # (not renewed in a child: a lease is its taker's)
        self._held = False
        self._lost = False
        self._stop: threading.Event | None = None
        self._renewer: threading.Thread | None = None

    @abc.abstractmethod
    def _take(self) -> bool:
        """Try once to take the lease; return whether it was taken."""

    @abc.abstractmethod
    def _extend(self) -> bool:
        """Push the expiry back; return ``False`` when the lease is no longer ours."""

    @abc.abstractmethod
    def _drop(self) -> None:
        """Give the lease up (only if still ours)."""

    def _note(self, seconds: float) -> None:  # noqa: B027 (a lease may keep no notes)
        """Leave the note :meth:`note_unstored` describes, good for ``seconds``; may raise."""

    def _noted(self) -> bool:
        """Whether such a note is there and still good; may raise."""
        return False

    def note_unstored(self, seconds: float) -> None:
        """Tell this key's later takers, for ``seconds``, that its entry was built and the
        store refused it for its size (as it will refuse their builds).

        A taker that finds the note (:meth:`unstored`) gives the lease up at once and builds
        the entry itself, so the processes waiting on the key build it side by side, not one
        after another. The note changes who builds, never what is served: an entry is still
        checked as always. Best effort: never raises; a lease with no place for notes (this
        base class) leaves none.
        """
        try:
            self._note(seconds)
        except Exception:  # waiters then take the lease in turn, as without notes
            pass

    def unstored(self) -> bool:
        """Whether a good note from :meth:`note_unstored` is there; ``False`` when the
        backend cannot say. Never raises."""
        try:
            return self._noted()
        except Exception:
            return False

    def refused(self) -> bool:
        """Whether the store the lease lives in refused the latest write of its key for
        its size, as the holder's own store call does not show.

        A tiered cache's shared tier is written later, through a queue: this waits for
        that write to be tried, and says whether it was refused (or dropped as larger
        than the whole queue), though a faster tier kept the value. Here ``False``: the
        store answered the holder's write already. Never raises.
        """
        return False

    @property
    def held(self) -> bool:
        """Whether this process holds the lease and has not found it lost."""
        return self._held and not self._lost

    @property
    def lost(self) -> bool:
        """Whether the lease was held, then found gone at a renewal."""
        return self._lost

    def acquire(self) -> bool:
        """Try once to take the lease, without waiting; return whether it is held.

        Backend failures raise :class:`~runtime_cache.errors.BackendError`.
        """
        with self._lock:
            if self._held:
                return not self._lost
            if not self._take():
                return False
            self._held, self._lost = True, False
            if self.renews:
                self._stop = stop = threading.Event()
                self._renewer = threading.Thread(
                    target=self._renew_loop, args=(stop,), name=f"lease {self.key}", daemon=True
                )
                self._renewer.start()
        return True

    def renew(self) -> bool:
        """Push the expiry back now; return whether the lease is still held."""
        with self._lock:
            if not self._held or self._lost:
                return False
            if not self._extend():
                self._lost = True
        return not self._lost

    def _renew_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.ttl / 3):
            try:
                if not self.renew():
                    return
            except Exception:  # a brief outage: try again next period
                continue

    def release(self) -> None:
        """Give the lease up; harmless when not held. Never raises."""
        if self._stop is not None:
            self._stop.set()
        renewer, self._renewer = self._renewer, None
        if renewer is not None and renewer is not threading.current_thread():
            renewer.join()
        with self._lock:
            if not self._held:
                return
            self._held = False
            try:
                self._drop()
            except Exception:  # it expires after ttl
                pass

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else "lost" if self._lost else "free"
        return f"<{type(self).__name__} {self.key!r} {state}>"
