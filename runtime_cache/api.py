"""The backend contract: bytes in, bytes out.

Every storage backend subclasses :class:`Backend`. A backend stores opaque
``bytes`` under ``str`` keys and knows nothing of the entry format; the front
(:class:`runtime_cache.Cache`) encodes, checks and signs entries.

Backends import this module, :mod:`runtime_cache.errors`, and the helpers in
:mod:`runtime_cache.urls` (URLs, redaction) and :mod:`runtime_cache.units`
(sizes, durations, booleans).

Example, a minimal backend::

    class DictBackend(Backend):
        scheme = "dict"

        def __init__(self) -> None:
            self._d: dict[str, bytes] = {}

        def get(self, key: str) -> bytes | None:
            return self._d.get(key)

        def set(self, key: str, value: bytes) -> None:
            self._d[key] = value

        def delete(self, key: str) -> bool:
            return self._d.pop(key, None) is not None

        def keys(self, prefix: str = "") -> Iterator[str]:
            return iter([k for k in list(self._d) if k.startswith(prefix)])
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

from .errors import InvalidURLError

# Kept importable from here for code written before they moved: URL helpers live in
# runtime_cache.urls, sizes and durations in runtime_cache.units.
from .units import parse_duration, parse_size
from .urls import BackendURL, redact_url

__all__ = [
    "Backend",
    "BackendURL",
    "StoredItem",
    "parse_duration",
    "parse_size",
    "redact_url",
]


@dataclass(frozen=True)
class StoredItem:
    """What a backend knows of one stored blob without reading it.

    ``last_access`` is a Unix time and ``hits`` a count across processes; both are
    ``None`` where the backend cannot keep them.
    """

    key: str
    size: int
    last_access: float | None = None
    hits: int | None = None


class Backend(abc.ABC):
    """Abstract storage of ``bytes`` values under ``str`` keys.

    Required: :meth:`get`, :meth:`set`, :meth:`delete`, :meth:`keys`.
    Optional, with defaults built on those: :meth:`get_many`, :meth:`set_many`,
    :meth:`head`, :meth:`scan`, :meth:`close`.

    Failures are raised as :class:`runtime_cache.errors.BackendError` (or a
    subclass); a vanished value is ``None``, never an error.
    """

    #: The URL scheme this class is registered under, e.g. ``"dir"``.
    scheme: ClassVar[str] = ""
    #: Whether the storage sits across a network (e.g. Redis). A tiered backend
    #: writes to remote tiers from a background thread so callers never wait on them.
    remote: ClassVar[bool] = False
    #: Whether only this user can write the storage (a memory store, a folder of
    #: ours that others cannot write). Values that go unvetted into a driver (the
    #: driver's own cache files) are read only from private or signed caches.
    private: bool = False

    @classmethod
    def from_url(cls, url: str) -> Backend:
        """Create a backend from a URL such as ``"memory://?max_size=64MB"``."""
        raise InvalidURLError(f"{cls.__name__} cannot be opened from a URL: {url!r}")

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None:
        """Return the value stored under ``key``, or ``None``."""

    @abc.abstractmethod
    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``, replacing any old value atomically."""

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it was there."""

    @abc.abstractmethod
    def keys(self, prefix: str = "") -> Iterator[str]:
        """Iterate over the stored keys that start with ``prefix``."""

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Return the values of those ``keys`` that are present."""
        found: dict[str, bytes] = {}
        for key in keys:
            value = self.get(key)
            if value is not None:
                found[key] = value
        return found

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Store every ``key -> value`` pair of ``items``."""
        for key, value in items.items():
            self.set(key, value)

    def peek(self, key: str) -> bytes | None:
        """Like :meth:`get`, but not counted as a use (no hit, no last-access bump).

        Maintenance (verify, export) reads through this, so it never disturbs
        LRU order or hit counts. Backends that track access override it.
        """
        return self.get(key)

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Like :meth:`get_many`, but not counted as a use."""
        return self.get_many(keys)

    def head(self, key: str, size: int) -> bytes | None:
        """Return at most the first ``size`` bytes of a value (for reading metadata)."""
        value = self.get(key)
        return None if value is None else value[:size]

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        """Iterate over stored items with their size, last access and hits where known."""
        for key in self.keys(prefix):
            value = self.get(key)
            if value is not None:
                yield StoredItem(key, len(value))

    def vacuum(self) -> int:
        """Remove leftovers such as stale temp files; return how many were removed."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources. Calling it twice is harmless."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"
