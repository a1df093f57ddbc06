"""Which keys' latest writes a store refused for their size: :class:`Refusals`.

A value over a store's cap is refused again however often it is built, unlike a write
that failed (a timeout, a full disk), which the next try may land. A build lease's
holder asks this before it lets the key go (:meth:`runtime_cache.lease.Lease.note_unstored`):
only a refusal that will repeat is worth telling the other processes about.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

__all__ = ["KEPT", "Refusals"]

#: How many refused keys :class:`Refusals` remembers (the newest).
KEPT = 4096


class Refusals:
    """The newest :data:`KEPT` keys whose latest write a store refused for its size.

    Thread-safe, and safe in a forked child (whose copy of a lock another thread held
    at the fork would stay held).
    """

    def __init__(self) -> None:
        self._keys: dict[str, None] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _locked(self) -> threading.Lock:
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        return self._lock

    def refused(self, keys: Iterable[str]) -> None:
        """Note that the latest writes of ``keys`` were refused for their size."""
        keys = tuple(keys)
        if not keys:  # (most writes: no lock taken)
            return
        with self._locked():
            for key in keys:
                self._keys.pop(key, None)
                self._keys[key] = None
            while len(self._keys) > KEPT:
                del self._keys[next(iter(self._keys))]

    def landed(self, keys: Iterable[str]) -> None:
        """Note that the latest writes of ``keys`` were not refused for their size (they
        landed, or failed otherwise)."""
        if not self._keys:  # (the common case: nothing to forget, no lock taken)
            return
        with self._locked():
            for key in keys:
                self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)
