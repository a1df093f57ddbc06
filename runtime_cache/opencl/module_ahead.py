"""The read-ahead of :class:`~runtime_cache.opencl.OpenCLModule`: its lazy loads' hooks.

:class:`LazyReadAhead` gives the module the three steps of :mod:`.prefetch` that touch its
own state: starting the read-ahead at its first ``program()``, the loads the thread makes
for it (none of a program it has), and stopping it, adopting what it loaded, before a
batch load (``build_all``, ``set_precompiled_programs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..cache import Cache
from .ahead_terms import NOT_HERE, Read, load_ahead_enabled, read_ahead_enabled, weakly
from .cached_load import load_ahead, loads_ahead, taken
from .holdings import NameLock
from .module_host import ModuleCore
from .prefetch import ReadAhead

__all__ = ["LazyReadAhead"]


class _Host(ModuleCore, Protocol):
    """What :class:`LazyReadAhead`'s methods use of the module they belong to."""

    _ahead: ReadAhead | None

    def _name_lock(self, name: str) -> NameLock: ...

    @property
    def _load_ahead(self) -> Callable[[Cache, str, Read], Any]: ...


class LazyReadAhead:
    """The read-ahead methods of :class:`~runtime_cache.opencl.OpenCLModule`."""

    _ahead: ReadAhead | None  # (set by the module: None until its first program())

    def _read_ahead(self: _Host, cache: Cache, name: str) -> ReadAhead | None:
        """The module's read-ahead, started by its first ``program()`` (see :mod:`.prefetch`)."""
        with self._lock:
            if (
                self._ahead is None
                and len(self.sources) > 1
                and not self._programs
                and read_ahead_enabled()
            ):
                loads = load_ahead_enabled() and loads_ahead(self.context)
                load = weakly(self._load_ahead, cache) if loads else None
                ahead = ReadAhead(cache, list(self.sources), weakly(self._plan), load)
                ahead.start(name, owner=self)  # (dropped, the module stops its thread)
                self._ahead = ahead
            return self._ahead

    def _stop_reading_ahead(self: _Host) -> list[str]:
        """Stop the read-ahead (the loads that follow read what is left their own way),
        adopt what it loaded and nobody took, and return the programs still missing."""
        with self._lock:
            missing = [n for n in self.sources if n not in self._programs]
            ahead = self._ahead
            if ahead is not None:
                ahead.stop()
        if ahead is None:
            return missing
        for name in ahead.loads_begun():  # (stopped: no load begins after this)
            if name not in missing:
                continue
            # Held as program() holds it: a caller waiting for the same load ahead takes
            # it, or this does, never both (the other then loaded it again). Only these
            # names: the others are not waited for (a long build holding one).
            with self._name_lock(name):
                got = ahead.take_loaded(name)
                if got is not None:
                    self._adopt(name, taken(got, self.cache), 0.0, cached=True)
                    missing.remove(name)
        return missing

    def _load_ahead(self: _Host, cache: Cache, name: str, read: Read) -> Any:
        # On the read-ahead thread: no name is held (the caller's take() waits for this).
        with self._lock:
            if name in self._programs:
                return NOT_HERE
        return load_ahead(self.context, cache, read)
