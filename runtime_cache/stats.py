"""Value types the front reports: :class:`CacheStats` and :class:`EntryInfo`."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, Generic, TypeVar, overload

from .fork_locks import renew_in_child

__all__ = ["CacheStats", "Counters", "EntryInfo", "jsonable"]


@dataclass(frozen=True)
class CacheStats:
    """Counters of one :class:`~runtime_cache.Cache` in this process.

    ``corrupt`` counts entries that failed to decode (they were deleted and
    treated as misses); ``rejected`` counts entries with a missing or wrong
    signature while a secret is set; ``errors`` counts backend failures that
    were absorbed as misses or skipped stores; ``seconds_saved`` sums the
    ``build_seconds`` of every hit.

    Build leases across processes (see :mod:`runtime_cache.fleet`):
    ``leases_won`` counts leases this process took to build an entry;
    ``lease_waits`` misses on which another process held the lease, and
    ``wait_seconds`` the time spent waiting on them; ``takeovers`` builds
    done after such a wait because the holder died, failed or passed the deadline;
    ``unshared_builds`` builds done without keeping the lease, because an earlier
    holder noted that the store refused the entry for its size.
    """

    hits: int = 0
    misses: int = 0
    stores: int = 0
    errors: int = 0
    corrupt: int = 0
    rejected: int = 0
    builds: int = 0
    build_seconds: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    seconds_saved: float = 0.0
    leases_won: int = 0
    lease_waits: int = 0
    wait_seconds: float = 0.0
    takeovers: int = 0
    unshared_builds: int = 0

    @property
    def lookups(self) -> int:
        """Hits plus misses."""
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Hits over lookups, 0.0 when nothing was looked up."""
        return self.hits / self.lookups if self.lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict, with ``hit_rate`` added."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["hit_rate"] = self.hit_rate
        return out


#: A frozen dataclass of counters, e.g. :class:`CacheStats`.
S = TypeVar("S")


class Counters(Generic[S]):
    """Mutable, thread-safe counters behind a frozen dataclass of them.

    ``Counters()`` counts the fields of :class:`CacheStats`; ``Counters(Kind)``
    those of another frozen dataclass (the OpenCL consumer's ``OpenCLStats``).
    A field annotated ``float`` stays a float in the snapshot; others are ints.

    >>> counters = Counters()
    >>> counters.add(hits=2, build_seconds=0.5)
    >>> counters.snapshot().hits
    2
    """

    @overload
    def __init__(self: Counters[CacheStats]) -> None: ...

    @overload
    def __init__(self, kind: type[S]) -> None: ...

    def __init__(self, kind: Any = CacheStats) -> None:
        self._kind = kind
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")
        self._values: dict[str, float] = {f.name: 0 for f in fields(kind)}
        #: Hits not yet added to the counters: ``(bytes_read, seconds_saved)`` each. A
        #: deque's append and popleft are atomic, so :meth:`hit` takes no lock.
        self._hits: deque[tuple[int, float]] = deque()
        self._mute = threading.local()  # (the names :meth:`muted` holds, for each thread)

    @contextmanager
    def muted(self, *names: str) -> Iterator[None]:
        """Within the block, this thread's :meth:`add` leaves the counters ``names`` alone
        (a read that repeats one already counted: its miss counted once)."""
        outer: frozenset[str] = getattr(self._mute, "names", frozenset())
        self._mute.names = outer | frozenset(names)
        try:
            yield
        finally:
            self._mute.names = outer

    def add(self, **amounts: float) -> None:
        """Add to one or more counters atomically."""
        muted = getattr(self._mute, "names", None)
        if muted:
            amounts = {k: v for k, v in amounts.items() if k not in muted}
        with self._lock:
            for name, amount in amounts.items():
                self._values[name] += amount

    def take_back(self, **amounts: float) -> None:
        """Subtract from one or more counters atomically, none below zero (what was counted
        before a :meth:`reset` is not taken from what came after it)."""
        with self._lock:
            self._fold()
            for name, amount in amounts.items():
                self._values[name] = max(0, self._values[name] - amount)

    def hit(self, bytes_read: int, seconds_saved: float) -> None:
        """Count one hit: ``add(hits=1, bytes_read=..., seconds_saved=...)``, on the hot path."""
        hits = self._hits
        hits.append((bytes_read, seconds_saved))
        if len(hits) >= 256:
            with self._lock:
                self._fold()

    def _fold(self) -> None:
        # Under the lock: move the pending hits into the counters. Only this pops, and it
        # pops as many as it saw: another thread's append is never lost.
        hits = self._hits
        if hits:
            done = [hits.popleft() for _ in range(len(hits))]
            values = self._values
            values["hits"] += len(done)
            values["bytes_read"] += sum(map(itemgetter(0), done))
            values["seconds_saved"] += sum(map(itemgetter(1), done))

    def values(self, *names: str) -> tuple[float, ...]:
        """The current values of the named counters, read together without a whole
        :meth:`snapshot` (a hot path's few counters)."""
        with self._lock:
            self._fold()
            return tuple(self._values[name] for name in names)

    def snapshot(self) -> S:
        """A frozen copy of the counters."""
        with self._lock:
            self._fold()
            values = dict(self._values)
        converted: dict[str, Any] = {
            f.name: float(values[f.name]) if f.type in ("float", float) else int(values[f.name])
            for f in fields(self._kind)
        }
        snapshot: S = self._kind(**converted)
        return snapshot

    def reset(self) -> None:
        """Set every counter back to zero."""
        with self._lock:
            self._fold()
            for name in self._values:
                self._values[name] = 0


@dataclass(frozen=True)
class EntryInfo:
    """Metadata of one stored entry, read without loading its value.

    ``hits`` and ``last_access`` come from the backend where it keeps them
    (across processes), and are ``None`` where it cannot. ``extra`` is the
    small dict given to :meth:`~runtime_cache.Cache.put`. ``signed`` is the
    entry's signature flag, not a verified signature.
    """

    key: str
    runtime: str
    purpose: str
    module_id: str
    device: Any
    parts: Mapping[str, Any]
    size: int
    stored_size: int
    created_at: float
    build_seconds: float
    producer: str
    signed: bool
    hits: int | None = None
    last_access: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (bytes in parts shown as hex)."""
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}


def jsonable(value: Any) -> Any:
    """``value`` with mappings as dicts (keys as text, bytes keys as Python writes them),
    tuples as lists, bytes as hex and floats that strict JSON has no number for (NaN,
    infinities) as text: ready for ``json`` with ``allow_nan=False``.

    >>> jsonable({"k": (b"\\x01", 2, float("nan")), b"\\xff": 1})
    {'k': ['01', 2, 'NaN'], "b'\\\\xff'": 1}
    """
    if isinstance(value, Mapping):
        found: dict[str, Any] = {}
        for key, item in value.items():
            name = _json_key(key)
            again = 1
            while name in found:  # two keys that read alike (b'00' and "b'00'"): both kept
                again += 1
                name = f"{_json_key(key)} ({again})"
            found[name] = jsonable(item)
        return found
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    if isinstance(value, float) and (value != value or value in (_INF, -_INF)):
        return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    return value


_INF = float("inf")


def _json_key(key: Any) -> str:
    # Bytes as Python writes them (b'\\x00'), as `show` prints them: as hex, b"\\x00" and
    # the text "00" became one key, and one of the two was lost.
    return repr(bytes(key)) if isinstance(key, (bytes, bytearray)) else str(key)
