"""The backend contract: bytes in, bytes out.

Every storage backend subclasses :class:`Backend`. A backend stores opaque ``bytes`` under
``str`` keys and knows nothing of the entry format; the front encodes, checks and signs them.

Backends import this module (its :class:`Lease` lives in :mod:`runtime_cache.lease`),
:mod:`runtime_cache.errors`, :mod:`runtime_cache.urls` and :mod:`runtime_cache.units`.

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
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

from .errors import BackendError, EntryTooLargeError, InvalidKeyError, InvalidURLError
from .lease import Lease
from .spans import SPAN_HEAD, HeadOnly, Span, blob_tail, frames_blobs, framing_span, head_only

# Kept importable from here for code written before they moved to .units and .urls.
from .units import parse_duration, parse_size
from .urls import BackendURL, redact_url

__all__ = [
    "MAX_TEXT_KEY",
    "READING_ONLY",
    "SPAN_HEAD",
    "Backend",
    "BackendURL",
    "HeadOnly",
    "Lease",
    "Span",
    "StoredItem",
    "blob_tail",
    "check_text_key",
    "delete_unchanged",
    "frames_blobs",
    "framing_span",
    "head_only",
    "parse_duration",
    "parse_size",
    "peek_head",
    "reads_ranges",
    "redact_url",
]


#: True (in this thread's context) while code that only reads opens stores: a backend opened
#: then does no upkeep that writes (``dir://``'s hourly vacuum). The command line's reading
#: commands set it, so that ``ls`` in a folder that is no cache writes nothing there.
READING_ONLY: ContextVar[bool] = ContextVar("runtime_cache_reading_only", default=False)

#: The longest text key, in characters (as ``dir://``'s): the library's own keys
#: (``runtime/purpose/digest``) are at most 162, and a ``redis://`` listing never takes in
#: a longer name (Redis allows 512 MB ones, which anyone who can write it could plant).
MAX_TEXT_KEY = 1024


def check_text_key(key: object) -> str:
    """``key`` if it is a non-empty ``str`` of at most :data:`MAX_TEXT_KEY` characters that
    encodes as UTF-8 (a remote store's key: no lone surrogates);
    :class:`~runtime_cache.errors.InvalidKeyError` otherwise."""
    if not isinstance(key, str) or not key:
        raise InvalidKeyError(f"a key must be a non-empty str, not {key!r}")
    if len(key) > MAX_TEXT_KEY:
        raise InvalidKeyError(f"a key must be 1-{MAX_TEXT_KEY} characters: {key[:80]!r}...")
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidKeyError(f"a key must be valid UTF-8 text: {key!r}") from None
    return key


def reads_ranges(backend: Backend) -> bool:
    """Whether the front may read ``backend``'s values alone (:meth:`Backend.get_range`): its
    class defines ``get_range`` (not the default), and ``get_parts`` nowhere below that, so
    a subclass that changes ``get_parts`` alone still sees every read the front makes. (A
    ``get_parts`` set on the instance is looked for on every read: :class:`Cache`.)"""
    return type(backend).get_range is not Backend.get_range and _owns(
        backend, "get_range", "get_parts"
    )


def _owns(backend: Backend, special: str, general: str) -> bool:
    """Whether the class of ``backend`` that defines ``special`` is the one that defines
    ``general``, or one below it: a subclass that changes ``general`` alone would be
    passed by were ``special`` called."""
    order = type(backend).__mro__
    owner, base = (next(c for c in order if name in vars(c)) for name in (special, general))
    return order.index(owner) <= order.index(base)


def delete_unchanged(backend: Backend, key: str, listed: StoredItem, head: bytes) -> bool:
    """:meth:`Backend.delete_if_unchanged` of ``backend``, where its class defines that at or
    below the class that defines ``delete``; else the default (compare the head, then
    ``delete``), so a subclass that changes ``delete`` alone (to refuse, to count, to log)
    still sees every removal maintenance makes, as does a ``delete`` set on the instance.
    Returns whether ``key`` was removed."""
    hooked = "delete" in getattr(backend, "__dict__", {})  # set on the instance (a test, a log)
    if _owns(backend, "delete_if_unchanged", "delete") and not hooked:
        return backend.delete_if_unchanged(key, listed, head)
    return Backend.delete_if_unchanged(backend, key, listed, head)


def peek_head(backend: Backend, key: str, size: int) -> bytes | None:
    """At most the first ``size`` bytes of ``key``'s value, read as a look, not a use:
    :meth:`Backend.head` where the backend's class defines it, else ``peek(key)[:size]``
    (the default ``head`` reads through ``get``, which may count a use)."""
    if type(backend).head is Backend.head:
        value = backend.peek(key)
        return None if value is None else value[:size]
    return backend.head(key, size)


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

    Required: :meth:`get`, :meth:`set`, :meth:`delete`, :meth:`keys`. Optional, with
    defaults built on those: :meth:`get_many`, :meth:`set_many`, :meth:`add`,
    :meth:`delete_if`, :meth:`delete_if_unchanged`, :meth:`head`, :meth:`get_parts`,
    :meth:`get_range`, :meth:`scan`, :meth:`close`; and :meth:`lease` (default: none).

    Failures are raised as :class:`runtime_cache.errors.BackendError` (or a subclass); a
    vanished value is ``None``, never an error."""

    #: The URL scheme this class is registered under, e.g. ``"dir"``.
    scheme: ClassVar[str] = ""
    #: Whether the storage sits across a network (Redis): tiers write it from a thread.
    remote: ClassVar[bool] = False
    #: Whether only this user can write the storage (memory, a folder others cannot write):
    #: values that go unvetted into a driver (its cache files) come only from such or signed.
    private: bool = False
    #: Whether others (other users, other machines) can write this store: a Cache over
    #: it needs a secret, or :attr:`insecure` set on purpose (they could plant binaries).
    shared: bool = False
    #: Set by ``insecure=1`` in the URL (or by hand): a shared store used unsigned on purpose.
    insecure: bool = False
    #: The URL :func:`~runtime_cache.open_backend` opened this backend from (``None`` when
    #: made in code): how another process reopens the same store (it may hold a password).
    opened_from: str | None = None

    @classmethod
    def from_url(cls, url: str) -> Backend:
        """Create a backend from a URL such as ``"memory://?max_size=64MB"``."""
        raise InvalidURLError(
            f"{cls.__name__} cannot be opened from a URL ({redact_url(url)}): make it in "
            f"Python and pass it to Cache({cls.__name__}(...))"
        )

    @classmethod
    def url_is_shared(cls, url: str) -> bool:
        """Whether ``url`` alone says the store is shared (so a cache without a secret is
        refused before the store is opened); defaults to :attr:`shared`."""
        return cls.shared is True  # (a property, set per instance, is read once it opens)

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

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        """Remove ``key`` only while it is still the value ``listed`` (an item of
        :meth:`scan`) whose first bytes were ``head``: it begins with ``head``, is
        ``listed.size`` bytes long and, where the store keeps last uses, was not used after
        ``listed.last_access``. Return whether it was removed.

        ``prune`` removes entries this way, so one written again or used while it ran is
        kept (an entry's head holds its creation time and checksums: a rewrite changes it).
        Like :meth:`delete_if`, this default (read the head, compare, delete) is best
        effort, and checks neither size nor use; backends that can check more, or do it
        atomically, override it.
        """
        current = self.head(key, len(head))
        if current is None or bytes(current) != bytes(head):
            return False
        return self.delete(key)

    def get_parts(self, key: str, span: Span) -> tuple[bytes, ...] | None:
        """Like :meth:`get`, but the value may come back in pieces that join to it.

        The front reads through this. ``span(head)`` is given the first bytes of
        the value (at least :data:`SPAN_HEAD` of them, or all of it) and answers
        ``(start, end)``: where the part the caller wants as its own ``bytes``
        lies, or ``None``. A backend that reads files can then read that part
        alone, so the caller needs no copy of it: it returns ``(value[:start],
        value[start:end], value[end:])``. This default returns ``(value,)``.
        """
        value = self.get(key)
        return None if value is None else (value,)

    def get_range(self, key: str, start: int, end: int, size: int) -> tuple[bytes, bytes] | None:
        """``(value[start:end], value[end:])`` of ``key``'s value, a tuple of two ``bytes``,
        when it is ``size`` bytes long and ``0 <= start <= end <= size``, read without the
        bytes before ``start``; ``None`` when it is not that long, not there, or this
        backend cannot read a part alone (this default).

        The front asks this for an entry it checked before, whose header it remembers,
        and checks the answer against that header. On ``None`` it reads the entry with
        :meth:`get_parts`, so a ``None`` here counts no use and reports no junk: that read
        does. An answer that fails the check, or an exception (never raised to the caller,
        even by a strict cache), is read again with :meth:`peek` or :meth:`get_parts`, so
        a backend that counts uses here must count none in :meth:`peek`. The front uses it
        only where :func:`reads_ranges` says so."""
        return None

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Return the values of those ``keys`` that are present."""
        found: dict[str, bytes] = {}
        for key in keys:
            value = self.get(key)
            if value is not None:
                found[key] = value
        return found

    def get_many_parts(self, keys: Iterable[str], span: Span) -> dict[str, tuple[bytes, ...]]:
        """:meth:`get_many`, each value in the pieces :meth:`get_parts` would give (the
        front's batch reads: a store that reads files applies what ``span`` says, as one
        read does). This default gives each value whole, as one piece."""
        return {key: (value,) for key, value in self.get_many(keys).items()}

    def get_many_past(
        self, bad: Mapping[str, bytes], *, span: Span | None = None
    ) -> dict[str, bytes]:
        """The keys of ``bad`` read again, past the blobs ``bad`` holds: the front refused
        them (corrupt, and removed; or rejected, and kept). Returns what is stored that
        differs from those bytes. This default reads once more (another process may have
        stored a good entry since); stores that lie in tiers look below a tier that still
        holds the refused blob. With ``span`` (the front's, where ``bad`` holds heads it
        refused unread), values are read as :meth:`get_many_parts` reads them, and a head
        read alone (:func:`head_only`) is no find."""
        if span is None:
            return {k: v for k, v in self.get_many(bad).items() if bytes(v) != bytes(bad[k])}
        found = self.get_many_parts(bad, span)
        joined = {k: b"".join(p) for k, p in found.items() if not head_only(p)}
        return {k: v for k, v in joined.items() if v != bytes(bad[k])}

    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Store every ``key -> value`` pair of ``items``.

        A value :meth:`set` refuses for its size does not stop the others: one
        :class:`~runtime_cache.errors.EntryTooLargeError` naming every refused key
        follows them."""
        refused: set[str] = set()
        last: EntryTooLargeError | None = None
        for key, value in items.items():
            try:
                self.set(key, value)
            except EntryTooLargeError as exc:
                refused.update(exc.refused or (key,))
                last = exc
        if last is not None:
            raise EntryTooLargeError(
                f"{len(refused)} of {len(items)} values not stored: {last}", frozenset(refused)
            )

    def peek(self, key: str) -> bytes | None:
        """Like :meth:`get`, but not counted as a use (no hit, no last-access bump).

        Maintenance (verify, export) reads through this, so it never disturbs
        LRU order or hit counts. Backends that track access override it.
        """
        return self.get(key)

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        """Like :meth:`get_many`, but not counted as a use."""
        return self.get_many(keys)

    def add(self, key: str, value: bytes) -> bool:
        """Store ``value`` under ``key`` only where nothing is (a tier's copy up, which must
        not replace a newer write): whether it stored. This default looks, then stores (what
        it cannot read there too); the built-in backends do it in one step."""
        with contextlib.suppress(BackendError):
            if self.head(key, 1) is not None:
                return False
        self.set(key, value)
        return True

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

    def removable(self, key: str) -> bool:
        """Whether :meth:`delete` of ``key`` can be expected to succeed, told without
        removing it (``prune`` plans around entries that cannot go); a guess, not a promise."""
        return True

    def check_promotions(self, check: Callable[[str, bytes], bool]) -> None:
        """Copy an entry from a store others can write into another store only if
        ``check(key, blob)`` accepts it (given by each :class:`~runtime_cache.Cache`: its
        secret, its limits). Only stores that copy between stores (tiers) need it. Checks
        add up, held weakly: the caller keeps ``check`` alive while it applies."""
        return None  # a store that copies nothing between stores has nothing to check

    def sign_leases(self, keys: tuple[bytes, ...]) -> None:
        """Sign build leases with the secret ``keys`` (the first signs, any verifies), so a
        taker can tell a lease planted without the secret and take it at once (given by a
        :class:`~runtime_cache.Cache` with a secret; only stores others write need it)."""
        return None

    def lease(self, key: str, ttl: float) -> Lease | None:
        """A build lease on ``key`` shared by every process using this storage, or ``None``.

        The lease is returned not held: :meth:`Lease.acquire` tries once, without
        waiting. ``ttl`` (seconds) bounds how long a holder that stopped renewing
        (killed, hung) keeps others out. ``None`` means this backend offers no
        leases, and callers build without one.
        """
        return None

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
