"""What a lazy module's read-ahead thread hands out, and the switches that turn it off.

The thread itself is :class:`.prefetch.ReadAhead`; :func:`.cached_load.load_ahead` is the
load it makes.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .guard import Binary
from .plan import ProgramPlan

__all__ = [
    "ENV_LOAD_AHEAD",
    "ENV_READ_AHEAD",
    "NOT_HERE",
    "Chunk",
    "Loaded",
    "Loader",
    "Read",
    "load_ahead_enabled",
    "read_ahead_enabled",
    "read_size",
    "weakly",
]

#: ``0`` (or ``off``, ``no``, ``false``) turns the read-ahead thread off: each program's
#: entries are then read on the caller's thread when it asks for the program.
ENV_READ_AHEAD = "RUNTIME_CACHE_OPENCL_READ_AHEAD"

#: ``0`` (or ``off``, ``no``, ``false``) keeps the thread to reading: programs are then
#: handed to the driver only on the caller's thread, when it asks for them.
ENV_LOAD_AHEAD = "RUNTIME_CACHE_OPENCL_LOAD_AHEAD"

#: What was read for one program: its plan, the entries found under its keys, the
#: binaries' digests in the order of the keys (hashed here, off the caller's thread, once),
#: and their standing with the crash guard when read
#: (:meth:`~runtime_cache.opencl.guard.LoadGuard.standing`).
Read = tuple[ProgramPlan, Mapping[str, Binary], list[str], str]

#: ``load(name, read)`` hands one program read ahead to the driver, on the thread: the
#: program, ``None`` when the driver refused it (its entries are evicted), or
#: :data:`NOT_HERE` when it is the caller's to load (its binaries need vetting first).
Loader = Callable[[str, Read], Any]
NOT_HERE = object()


class Chunk:
    """Programs the thread reads in one backend call, and what it found for them."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.started = False
        self.done = threading.Event()
        self.found: dict[str, Read] = {}
        #: (bytes read, seconds saved) per key read: counted as a hit when taken.
        self.tally: dict[str, tuple[int, float]] = {}


def read_size(read: Read) -> int:
    """The bytes ``read`` holds."""
    return sum(len(value) for value in read[1].values())


class Loaded(NamedTuple):
    """A program the thread loaded ahead, and what it was loaded from."""

    program: Any
    read: Read


def _on(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() not in ("0", "off", "no", "false")


def read_ahead_enabled() -> bool:
    """Whether a module's first ``program()`` may start a read-ahead (``ENV_READ_AHEAD``)."""
    return _on(ENV_READ_AHEAD)


def load_ahead_enabled() -> bool:
    """Whether the read-ahead thread also loads what it read (``ENV_LOAD_AHEAD``)."""
    return _on(ENV_LOAD_AHEAD)


def weakly(method: Callable[..., Any], *first: Any) -> Callable[..., Any]:
    """``method`` (a bound method) with ``first`` as its first arguments, holding its
    object weakly, as the read-ahead thread holds its module: a call once the object is
    gone raises ``ReferenceError``."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        live = ref()
        if live is None:
            raise ReferenceError("the module this read-ahead served is gone")
        return live(*first, *args)

    return call
