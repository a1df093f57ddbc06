"""Hold an object's condition through ``fork()``, once its work in flight has ended.

A forked child has only the thread that forked. A lock another thread held at the fork
stays locked in the child for ever, and what that thread had half done (an import, a
read, a load into the driver) stays half done there. An object whose background work
runs under one ``threading.Condition`` subclasses :class:`ForkHold`: the hook before a
fork calls :meth:`ForkHold.hold_for_fork`, which takes the condition, sets ``_forking``
(no new work starts while it is set) and waits, at most until a deadline, for the work
the object says is in flight (:meth:`ForkHold.in_flight_at_fork`); the condition stays
taken through the fork, and the parent's hook after it calls
:meth:`ForkHold.release_after_fork`. The child starts the object over on its own.

Used by the read-ahead's gate (:mod:`runtime_cache.opencl.fork_gate`) and by the remote
backends' writers (:mod:`runtime_cache.backends.write_behind`).
"""

from __future__ import annotations

import threading
import time

__all__ = ["ForkHold"]


class ForkHold:
    """What a fork does to an object that works under one condition, ``_cond``.

    A subclass sets ``_cond`` and ``_forking`` (``False``), defines
    :meth:`in_flight_at_fork`, starts no work while ``_forking`` is set, and notifies
    ``_cond`` when work ends. Example::

        class Reader(ForkHold):
            def in_flight_at_fork(self) -> bool:
                return bool(self._reads)  # (asked with _cond held)

        os.register_at_fork(
            before=lambda: reader.hold_for_fork(time.monotonic() + 5.0),
            after_in_parent=reader.release_after_fork,
            after_in_child=reader.start_over,
        )
    """

    _cond: threading.Condition
    _forking: bool

    def in_flight_at_fork(self) -> bool:
        """Whether work a fork should wait for is in progress (asked with ``_cond`` held)."""
        raise NotImplementedError

    def hold_for_fork(self, deadline: float) -> None:
        """Take ``_cond`` and keep it through the fork, once :meth:`in_flight_at_fork` is
        false or ``deadline`` (``time.monotonic()``) has passed (a hung read, a server
        that does not answer: the fork goes on). No work starts meanwhile."""
        self._cond.acquire()
        self._forking = True
        while self.in_flight_at_fork():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)

    def release_after_fork(self) -> None:
        """In the parent after the fork: let work start again, and let go of ``_cond``."""
        self._forking = False
        self._cond.notify_all()
        self._cond.release()
