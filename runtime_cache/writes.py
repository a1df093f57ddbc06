"""Storing encoded entries: :class:`Writes` gives :class:`~runtime_cache.cache.Cache` the
store under ``put``, ``put_many`` and ``loads``, and :meth:`~Writes.refused`.

A key the store cannot hold (:class:`~runtime_cache.errors.InvalidKeyError`: a ``dir://``
folder refuses a key component that ends in ``.rce``, which Redis and memory take) stops
a batch write where it stands, with the keys before it written and those after it not: a
batch it stopped is written again a key at a time, so that only such keys are left out,
and what was written is counted (a ``loads`` of three good entries and one such said 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .api import Backend
from .errors import EntryTooLargeError, InvalidKeyError
from .inventory import KeyLike
from .refusals import Refusals
from .refused_heads import RefusedHeads
from .stats import CacheStats, Counters

__all__ = ["Writes"]


class _Host(Protocol):
    """What :class:`Writes`' methods use of the cache they belong to."""

    _counters: Counters[CacheStats]
    _heads: RefusedHeads
    _refusals: Refusals

    @property
    def backend(self) -> Backend: ...

    def _failed(self, op: str, exc: Exception) -> None: ...

    def _succeeded(self, side: str = "read") -> None: ...

    def _bump(self) -> None: ...

    def _store_held(self, blobs: Mapping[str, bytes]) -> tuple[int, list[InvalidKeyError]]: ...


class Writes:
    """The store of :class:`~runtime_cache.cache.Cache`: what its writes go through."""

    def _store(self: _Host, blobs: Mapping[str, bytes]) -> bool:
        # Whether every one of ``blobs`` was stored; a key the store cannot hold is refused
        # (no outage; raised when strict) once the others were written.
        written, unheld = self._store_held(blobs)
        for exc in unheld:
            self._failed("set", exc)
        return written == len(blobs)

    def _store_held(self: _Host, blobs: Mapping[str, bytes]) -> tuple[int, list[InvalidKeyError]]:
        """Store ``blobs``: how many were written, and the refusals of those whose key the
        store cannot hold, not counted yet (the caller says what they are: ``loads``
        counts them in its result). Any other failure is counted (raised when strict)."""
        try:
            if len(blobs) == 1:
                ((skey, blob),) = blobs.items()
                self.backend.set(skey, blob)
            else:
                self.backend.set_many(blobs)
        except InvalidKeyError as exc:
            if len(blobs) == 1:
                return 0, [exc]
            unheld: list[InvalidKeyError]
            written, unheld = 0, []  # (the keys before it were written: written again)
            for skey, blob in blobs.items():
                one, bad = self._store_held({skey: blob})
                written, unheld = written + one, unheld + bad
            return written, unheld
        except Exception as exc:
            self._failed("set", exc)  # (EntryTooLargeError: no outage; it names what it refused)
            refused = getattr(exc, "refused", None) or blobs  # none named: none stored
            stored: Mapping[str, bytes] = {k: v for k, v in blobs.items() if k not in refused}
            sized = refused if isinstance(exc, EntryTooLargeError) else ()
            self._refusals.refused(sized)  # (refused again however often built)
        else:
            self._succeeded("write")
            stored, sized = blobs, ()
            self._heads.forget(blobs.values())
        self._refusals.landed(k for k in blobs if k not in sized)  # the latest store's say
        if stored:
            self._counters.add(stores=len(stored), bytes_written=sum(map(len, stored.values())))
            self._bump()
        return len(stored), []

    def refused(self: _Host, key: KeyLike) -> bool:
        """Whether the backend refused this cache's latest store of ``key`` for its size
        (not when that store failed otherwise, or landed)."""
        return str(key) in self._refusals
