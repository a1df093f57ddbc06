"""Many values in one backend call: :meth:`BatchReads.get_many` and `get_many_views`.

:class:`BatchReads` gives :class:`~runtime_cache.cache.Cache` these methods; each
blob passes :func:`runtime_cache.check.screen_many` (the one entry check) and is
counted as :meth:`Cache.get <runtime_cache.cache.Cache.get>` counts it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from .api import Backend
from .check import screen_many
from .codec import Limits, SecretKeys
from .inventory import KeyLike
from .stats import CacheStats, Counters

__all__ = ["BatchReads"]


class _Host(Protocol):
    """What :class:`BatchReads`' methods use of the cache they belong to."""

    limits: Limits
    _secret: SecretKeys | None
    _counters: Counters[CacheStats]

    @property
    def backend(self) -> Backend: ...

    def _failed(self, op: str, exc: Exception) -> None: ...

    def _succeeded(self, side: str = "read") -> None: ...

    def _discard(self, skey: str, blob: bytes) -> None: ...

    def get_many_views(
        self, keys: Iterable[KeyLike], *, count_misses: bool = True
    ) -> dict[str, memoryview]: ...


class BatchReads:
    """The batch read methods of :class:`~runtime_cache.cache.Cache`."""

    def get_many(self: _Host, keys: Iterable[KeyLike]) -> dict[str, bytes]:
        """Fetch many values in one backend call; returns ``{str(key): value}`` for hits."""
        return {skey: bytes(view) for skey, view in self.get_many_views(keys).items()}

    def get_many_views(
        self: _Host, keys: Iterable[KeyLike], *, count_misses: bool = True
    ) -> dict[str, memoryview]:
        """Like :meth:`get_many`, but each value is a read-only view into the stored blob.

        Verified exactly as :meth:`get_many` does, without copying the values:
        for consumers that hand large values straight to a driver (a view keeps
        its whole blob alive while it lives). ``count_misses=False`` for a read
        ahead of need, whose caller reads again what was missing and counts it
        then: keys not found are not counted as misses here (rejected and
        corrupt entries still are, under those names).
        """
        given = list(keys)
        wanted = [str(k) for k in given]
        try:
            blobs = self.backend.get_many(wanted)
        except Exception as exc:
            self._counters.add(misses=len(wanted) if count_misses else 0)
            self._failed("get_many", exc)
            return {}
        self._succeeded()
        found, counts = screen_many(wanted, given, blobs, self._secret, self.limits, self._discard)
        if not count_misses:
            counts["misses"] = 0
        self._counters.add(**counts)
        return found
