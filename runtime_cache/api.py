"""The backend contract: bytes in, bytes out.

Every storage backend subclasses :class:`Backend`. A backend stores opaque
``bytes`` under ``str`` keys and knows nothing of the entry format; the front
(:class:`runtime_cache.Cache`) encodes, checks and signs entries.

Backends import only this module and :mod:`runtime_cache.errors`.

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
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar
from urllib.parse import SplitResult, parse_qsl, urlsplit

from .errors import InvalidURLError

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
    :meth:`delete_if`, :meth:`head`, :meth:`scan`, :meth:`close`.

    Failures are raised as :class:`runtime_cache.errors.BackendError` (or a
    subclass); a vanished value is ``None``, never an error.
    """

    #: The URL scheme this class is registered under, e.g. ``"dir"``.
    scheme: ClassVar[str] = ""
    #: Whether the storage sits across a network (e.g. Redis). A tiered backend
    #: writes to remote tiers from a background thread so callers never wait on them.
    remote: ClassVar[bool] = False
    #: Whether others (other users, other machines) can write this store. A
    #: :class:`~runtime_cache.Cache` over a shared store needs a secret, or
    #: :attr:`insecure` set on purpose: anyone who can write it could plant binaries.
    shared: bool = False
    #: Set by ``insecure=1`` in the URL (or by hand): a shared store used unsigned on purpose.
    insecure: bool = False

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

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Remove ``key`` only if it still holds ``expected``; return whether it was removed.

        The front removes a corrupt entry this way, so a good entry that another
        process stored in between is kept. This default (read, compare, delete)
        is best effort: a store landing between the read and the delete is lost.
        Backends that can do it atomically override it.
        """
        current = self.peek(key)
        if current is None or bytes(current) != bytes(expected):
            return False
        return self.delete(key)

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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``"500MB"``, ``"64KiB"`` or ``1024``.

    >>> parse_size("1.5 MiB")
    1572864
    """
    if isinstance(text, int):
        if not 0 <= text < 2**63:
            raise InvalidURLError(f"a size must be 0 to 2**63-1 bytes: {text}")
        return text
    match = _SIZE.match(text)
    unit = (match.group(2) or "").lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise InvalidURLError(f"not a size: {text!r} (try 500MB, 64KiB or 1024)")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if not size < 2**63:  # also catches inf from a long run of digits
        raise InvalidURLError(f"size {text!r} is too large")
    return int(size)


def parse_duration(text: str | float) -> float:
    """Parse a duration such as ``"30d"``, ``"2h"``, ``"250ms"`` or ``1.5`` into seconds.

    >>> parse_duration("2h")
    7200.0
    """
    if isinstance(text, (int, float)):
        if not 0 <= text < 10**12:  # also refuses NaN and inf
            raise InvalidURLError(f"a duration must be 0 to 10**12 seconds: {text}")
        return float(text)
    match = _DURATION.match(text)
    if match is None:
        raise InvalidURLError(f"not a duration: {text!r} (try 250ms, 30s, 2h or 30d)")
    seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    if not seconds < 10**12:  # about 31,700 years; also catches inf from a long run of digits
        raise InvalidURLError(f"duration {text!r} is too long")
    return seconds


_PASSWORD = re.compile(r"^(['\"]?[A-Za-z][A-Za-z0-9+.-]*://[^/?#@]*?:)[^/?#@]*@")


def redact_url(url: object) -> str:
    """Return ``repr(url)`` with any password in it replaced by ``***``, for messages and logs.

    >>> redact_url("redis://app:hunter2@cache:6379/0")
    "'redis://app:***@cache:6379/0'"
    """
    return _PASSWORD.sub(r"\1***@", repr(url))


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL: scheme, location and query options.

    Backends use it to read their options and to reject unknown ones::

        url = BackendURL.parse("memory://?max_size=64MB")
        max_size = parse_size(url.pop("max_size", "256MB"))
        url.reject_unknown()
    """

    scheme: str
    netloc: str
    path: str
    options: dict[str, str]
    raw: str

    @classmethod
    def parse(cls, url: str) -> BackendURL:
        """Split ``url``; raise :class:`InvalidURLError` when it is not a URL."""
        if not isinstance(url, str) or "://" not in url:
            raise InvalidURLError(f"not a backend URL (expected scheme://...): {redact_url(url)}")
        if "\x00" in url or len(url) > 4096:
            raise InvalidURLError("a backend URL may not hold NUL bytes or exceed 4096 characters")
        try:
            parts: SplitResult = urlsplit(url)
            options = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
            _ = parts.port  # a non-numeric or out-of-range port fails here, not at first use
        except ValueError as exc:
            raise InvalidURLError(f"cannot parse backend URL {redact_url(url)}: {exc}") from exc
        if not parts.scheme:
            raise InvalidURLError(f"backend URL has no scheme: {redact_url(url)}")
        return cls(parts.scheme.lower(), parts.netloc, parts.path, options, url)

    def pop(self, name: str, default: str | None = None) -> str | None:
        """Take the option ``name`` out of the query, returning ``default`` if absent."""
        return self.options.pop(name, default)

    def reject_unknown(self) -> None:
        """Raise :class:`InvalidURLError` if options are left that nobody took."""
        if self.options:
            names = ", ".join(sorted(self.options))
            where = redact_url(self.raw)
            raise InvalidURLError(f"unknown option(s) {names} in backend URL {where}")
