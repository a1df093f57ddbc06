"""``memory://``: an in-process store, bounded by bytes, least recently used out first."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from runtime_cache.api import Backend, Lease, StoredItem
from runtime_cache.errors import EntryTooLargeError, InvalidKeyError, InvalidURLError
from runtime_cache.fork_locks import renew_in_child
from runtime_cache.units import parse_size
from runtime_cache.urls import BackendURL, redact_url

__all__ = ["MemoryBackend"]


class LocalLease(Lease):
    """A lease among the threads of this process: a key in a set, under a lock."""

    local = True

    def __init__(self, held: set[str], lock: threading.Lock, key: str, ttl: float) -> None:
        super().__init__(key, ttl)
        self._taken, self._taken_lock = held, lock

    def _take(self) -> bool:
        with self._taken_lock:
            if self.key in self._taken:
                return False
            self._taken.add(self.key)
            return True

    def _extend(self) -> bool:
        return True

    def _drop(self) -> None:
        with self._taken_lock:
            self._taken.discard(self.key)


class MemoryBackend(Backend):
    """A thread-safe LRU dict of bytes, holding at most ``max_size`` bytes of values.

    A value larger than ``max_size`` is refused
    (:class:`~runtime_cache.errors.EntryTooLargeError`). It keeps hits and last
    access per key, for listings and pruning.

    URL: ``memory://?max_size=256MB``.
    """

    scheme = "memory"
    exact_sizes = True  # (its listed sizes are its blobs' own: no framing)
    #: Only this process can write it.
    private = True

    def __init__(self, max_size: int | str = "256MB") -> None:
        self.max_size = parse_size(max_size)
        if self.max_size <= 0:  # (0 stored nothing, and said so on every put)
            raise InvalidURLError(
                "memory:// needs a max_size above 0: it holds values in this process's "
                "memory (RUNTIME_CACHE=off turns caching off)"
            )
        self._data: OrderedDict[str, bytes] = OrderedDict()
        self._access: dict[str, tuple[int, float]] = {}
        self._size = 0
        self._lock = threading.Lock()
        self._leased: set[str] = set()
        self._lease_lock = threading.Lock()
        renew_in_child(self, "_lock", "_lease_lock")

    @classmethod
    def from_url(cls, url: str) -> MemoryBackend:
        """Open from ``memory://?max_size=...``."""
        parsed = BackendURL.parse(url)
        if parsed.netloc or parsed.path.strip("/"):  # (memory://host was taken, host ignored)
            raise InvalidURLError(f"memory:// takes no host or path: {redact_url(url)}")
        max_size = parsed.pop("max_size", "256MB") or "256MB"
        parsed.reject_unknown()
        return cls(max_size=max_size)

    @property
    def size(self) -> int:
        """Bytes of values held now."""
        return self._size

    def __len__(self) -> int:
        return len(self._data)

    @staticmethod
    def _check(key: str) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidKeyError(f"a key must be a non-empty str, not {key!r}")

    def get(self, key: str) -> bytes | None:
        self._check(key)
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
                hits, _ = self._access.get(key, (0, 0.0))
                self._access[key] = (hits + 1, time.time())
            return value

    def set(self, key: str, value: bytes) -> None:
        self._store(key, value, replace=True)

    def add(self, key: str, value: bytes) -> bool:
        return self._store(key, value, replace=False)

    def _store(self, key: str, value: bytes, replace: bool) -> bool:
        self._check(key)
        value = bytes(value)
        if len(value) > self.max_size:
            # Never kept; storing it would first push out every other value.
            raise EntryTooLargeError(
                f"memory://: {key!r} is {len(value)} bytes, over max_size "
                f"({self.max_size} bytes); not stored",
                frozenset((key,)),
            )
        with self._lock:
            if not replace and key in self._data:
                return False
            old = self._data.pop(key, None)
            if old is not None:
                self._size -= len(old)
            self._data[key] = value
            self._size += len(value)
            self._access[key] = (0, time.time())
            while self._size > self.max_size:
                victim, dropped = self._data.popitem(last=False)
                self._access.pop(victim, None)
                self._size -= len(dropped)
        return True

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        found = {}
        for key in keys:
            value = self.get(key)
            if value is not None:
                found[key] = value
        return found

    def delete(self, key: str) -> bool:
        self._check(key)
        with self._lock:
            old = self._data.pop(key, None)
            self._access.pop(key, None)
            if old is None:
                return False
            self._size -= len(old)
            return True

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Remove ``key`` only if it holds ``expected``, atomically (under the lock)."""
        self._check(key)
        with self._lock:
            current = self._data.get(key)
            if current is None or current != bytes(expected):
                return False
            del self._data[key]
            self._access.pop(key, None)
            self._size -= len(current)
            return True

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        """Remove ``key`` only while it is ``listed.size`` bytes long, begins with ``head``
        and was not used after ``listed.last_access``, atomically (under the lock)."""
        self._check(key)
        with self._lock:
            current = self._data.get(key)
            if current is None or len(current) != listed.size or current[: len(head)] != head:
                return False
            last = self._access.get(key, (0, 0.0))[1]
            if listed.last_access is not None and last > listed.last_access:
                return False
            del self._data[key]
            self._access.pop(key, None)
            self._size -= len(current)
            return True

    def keys(self, prefix: str = "") -> Iterator[str]:
        with self._lock:
            return iter([k for k in self._data if k.startswith(prefix)])

    def head(self, key: str, size: int) -> bytes | None:
        with self._lock:
            value = self._data.get(key)
        return None if value is None else value[:size]

    def stored_size(self, key: str) -> int | None:
        """The size of ``key``'s value, or ``None`` where there is none."""
        with self._lock:
            value = self._data.get(key)
        return None if value is None else len(value)

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        with self._lock:
            items = []
            for k, v in self._data.items():
                if k.startswith(prefix):
                    hits, last = self._access.get(k, (0, 0.0))
                    items.append(StoredItem(k, len(v), last, hits))
        return iter(items)

    def lease(self, key: str, ttl: float) -> Lease:
        """A lease among this process's threads (the values live in this process only)."""
        return LocalLease(self._leased, self._lease_lock, key, ttl)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._data.clear()
            self._access.clear()
            self._size = 0

    def __repr__(self) -> str:
        return f"<MemoryBackend {len(self._data)} items, {self._size}/{self.max_size} bytes>"
