"""Progress of one ``OpenCLModule.build_all``: ``on_progress(done, total)`` as programs land."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

__all__ = ["BuildProgress", "ProgressCallback"]

log = logging.getLogger(__name__)

#: ``on_progress(done, total)``: programs ready so far, and how many the call has to make ready.
ProgressCallback = Callable[[int, int], None]


class BuildProgress:
    """Counts the programs of one call as they are loaded or built, and reports each one.

    Loader and builder threads call :meth:`landed`. Reports go out one at a time and in
    order, so ``done`` never goes backwards, but no thread waits to make one: while one
    thread is in the callback, another that lands a program leaves its report queued
    and goes on (a thread that holds a program waits for nobody's callback, and a
    callback may wait for such a program). A thread reports what is due up to its own
    count, never the reports of programs that landed after its own (a thread that only
    asked for one program is not kept making the build's reports); what is left goes
    out with the next landing or at :meth:`finish`. A callback that raises is logged
    once and not called again: a progress bar must not stop a build.
    """

    def __init__(self, callback: ProgressCallback, names: Iterable[str]) -> None:
        self._callback: ProgressCallback | None = callback
        self._waiting = set(names)
        self.total = len(self._waiting)
        self.done = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # no report under way
        self._due: deque[int] = deque()  # counts to report, in order
        self._reporter: int | None = None  # the thread making reports now

    def landed(self, name: str) -> None:
        """Program ``name`` is ready; report it if this call was waiting for it."""
        with self._lock:
            if name not in self._waiting:
                return
            self._waiting.discard(name)
            self.done += 1
            own = self.done
            self._due.append(own)
        self._report_due(own)

    def finish(self) -> None:
        """The call is over: report ``(total, total)`` if the last report was short of it,
        and make every report still due (waiting for a thread in the callback first).

        (Programs that another thread made ready before this call started
        watching are counted here.)
        """
        with self._lock:
            if self.done < self.total:
                self._waiting.clear()
                self.done = self.total
                self._due.append(self.done)
        here = threading.get_ident()
        while True:
            with self._lock:
                while self._reporter is not None and self._reporter != here:
                    self._idle.wait()
                if not self._due or self._reporter == here:  # (called from the callback)
                    return
            self._report_due(self.total)

    def _report_due(self, upto: int) -> None:
        # Make the reports due, up to count ``upto``, unless another thread is making them.
        with self._lock:
            if self._reporter is not None:
                return
            self._reporter = threading.get_ident()
        try:
            while True:
                with self._lock:
                    if not self._due or self._due[0] > upto:
                        return
                    done = self._due.popleft()
                self._report(done)
        finally:
            with self._lock:
                self._reporter = None
                self._idle.notify_all()

    def _report(self, done: int) -> None:
        if self._callback is None:
            return
        try:
            self._callback(done, self.total)
        except Exception as exc:
            log.warning("runtime-cache: on_progress raised %r; no more progress reports", exc)
            self._callback = None
