"""Removing entries: :class:`Removals` gives :class:`~runtime_cache.cache.Cache` its
:meth:`~Removals.delete`, its compare-and-delete of an entry its user judged bad
(:meth:`~Removals.delete_if_holds`), and maintenance's delete of an entry only while it is
the one listed (:meth:`~Removals.delete_if_unchanged`, which ``prune`` uses).
"""

from __future__ import annotations

import logging
from typing import Protocol

from .api import Backend, StoredItem, delete_unchanged
from .check import Checked
from .errors import CorruptEntryError, NewerFormatError, RejectedEntryError
from .failure_policy import FailurePolicy
from .inventory import KeyLike, key_text
from .stats import CacheStats, Counters

__all__ = ["Removals"]

log = logging.getLogger(__name__)


class _Host(Protocol):
    """What :class:`Removals`' methods use of the cache they belong to."""

    _counters: Counters[CacheStats]
    _policy: FailurePolicy

    @property
    def backend(self) -> Backend: ...

    def check(self, skey: str | None, blob: bytes | memoryview) -> Checked: ...

    def _failed(self, op: str, exc: Exception) -> None: ...

    def _succeeded(self, side: str = "read") -> None: ...

    def _bump(self) -> None: ...


class Removals:
    """The delete methods of :class:`~runtime_cache.cache.Cache`."""

    def delete_if_holds(self: _Host, key: KeyLike, value: bytes) -> None:
        """Remove ``key``'s entry only while it still holds ``value`` (one judged bad by
        its user), or bytes now damaged; keep one stored since, and one this cache rejects
        or reads in a newer format (its owner's). Compare-and-delete, best effort."""
        skey = str(key)
        try:
            blob = self.backend.peek(skey)
            if blob is None:
                return
            try:
                held: bytes | None = bytes(self.check(skey, blob).value)
            except (RejectedEntryError, NewerFormatError):
                return  # not this cache's to judge: the read path counts and keeps it
            except CorruptEntryError:
                held = None  # damaged bytes: gone either way
            if held is None or held == value:
                self.backend.delete_if(skey, bytes(blob))
        except Exception as exc:  # advisory: a failing store only keeps the entry
            log.debug("runtime-cache: could not remove %s: %s", skey, exc)

    def delete(self: _Host, key: KeyLike) -> bool:
        """Remove ``key``; return whether it was there. With a tier down: strict, raises
        :class:`~runtime_cache.errors.PartialDeleteError`; else whether a reached tier held it."""
        skey = key_text(key)  # (a TypeError is the caller's, not the store's failure)
        try:
            removed = self.backend.delete(skey)
        except Exception as exc:
            self._failed("delete", exc)
            return getattr(exc, "removed", False) is True  # (a PartialDeleteError's)
        self._succeeded("write")
        if removed:
            self._bump()
        return removed

    def delete_if_unchanged(self: _Host, key: KeyLike, listed: StoredItem, head: bytes) -> bool:
        """Remove ``key``'s entry only while it is still the one ``listed`` (an item of the
        backend's ``scan``) that began with ``head``: not written again, nor used since
        where the store keeps uses (:meth:`~runtime_cache.api.Backend.delete_if_unchanged`,
        or its default where the backend's class changed only ``delete``: see
        :func:`~runtime_cache.api.delete_unchanged`). Return whether it was removed.

        For maintenance, which reports each entry it could not remove: a failure of the
        store is counted in ``stats().errors`` and raised, strict or not."""
        skey = key_text(key)
        try:
            removed = delete_unchanged(self.backend, skey, listed, bytes(head))
        except Exception as exc:
            self._counters.add(errors=1)
            self._policy.note("delete", exc)
            raise
        self._succeeded("write")
        if removed:
            self._bump()
        return removed
