"""The size of a blob stored now, without reading it.

A listing's sizes are taken before the heads it reads after them: an entry written again
between has a head newer than its size. :func:`stored_size` asks the store again for one
key, so that such an entry is not taken for one whose head claims what is not stored.
"""

from __future__ import annotations

from .api import Backend, StoredItem

__all__ = ["stored_item", "stored_size"]


def stored_item(backend: Backend, key: str) -> StoredItem | None:
    """What the backend's :meth:`~runtime_cache.api.Backend.scan` of ``key`` lists for it."""
    return next((item for item in backend.scan(key) if item.key == key), None)


def stored_size(backend: Backend, key: str) -> int | None:
    """The size of the blob stored under ``key`` now, or ``None`` where there is none (or
    the store cannot tell it): the backend's own ``stored_size(key)`` where it has one (a
    ``stat``, a ``STRLEN``; no value read), else what its
    :meth:`~runtime_cache.api.Backend.scan` of ``key`` lists."""
    own = getattr(backend, "stored_size", None)
    if callable(own):
        size: int | None = own(key)
        return size
    item = stored_item(backend, key)
    return None if item is None else item.size
