"""Progress of one ``OpenCLModule.build_all``: ``on_progress(done, total)`` as programs land."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

__all__ = ["BuildProgress", "ProgressCallback"]

log = logging.getLogger(__name__)

#: ``on_progress(done, total)``: programs ready so far, and how many the call has to make ready.
ProgressCallback = Callable[[int, int], None]


class BuildProgress:
    """Counts the programs of one call as they are loaded or built, and reports each one.

    Loader and builder threads call :meth:`landed`; the callback runs under a
    lock, so ``done`` never goes backwards, and it should be quick. A callback
    that raises is logged once and not called again: a progress bar must not
    stop a build.
    """

    def __init__(self, callback: ProgressCallback, names: Iterable[str]) -> None:
        self._callback: ProgressCallback | None = callback
        self._waiting = set(names)
        self.total = len(self._waiting)
        self.done = 0
        self._lock = threading.Lock()

    def landed(self, name: str) -> None:
        """Program ``name`` is ready; report it if this call was waiting for it."""
        with self._lock:
            if name not in self._waiting:
                return
            self._waiting.discard(name)
            self.done += 1
            self._report()

    def finish(self) -> None:
        """The call is over: report ``(total, total)`` if the last report was short of it.

        (Programs that another thread made ready before this call started
        watching are counted here.)
        """
        with self._lock:
            if self.done < self.total:
                self._waiting.clear()
                self.done = self.total
                self._report()

    def _report(self) -> None:
        if self._callback is None:
            return
        try:
            self._callback(self.done, self.total)
        except Exception as exc:
            log.warning("runtime-cache: on_progress raised %r; no more progress reports", exc)
            self._callback = None
