"""Pre-compiled program bundles: codec entries (key parts, checksum) packed in one blob.

A bundle is the same format as :meth:`runtime_cache.Cache.dumps`, so it can
also be merged into any cache with :meth:`~runtime_cache.Cache.loads`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .._version import __version__
from ..check import check_entry
from ..codec import Entry, decode_bundle, encode_bundle, encode_entry
from ..errors import CorruptEntryError
from ..keys import CacheKey

__all__ = ["pack_programs", "unpack_programs"]


def pack_programs(items: Iterable[tuple[CacheKey, bytes, float]]) -> bytes:
    """Encode ``(key, binary, build_seconds)`` items as one bundle."""
    now = time.time()
    blobs = [
        encode_entry(
            str(key),
            key.parts,
            binary,
            created_at=now,
            build_seconds=seconds,
            producer=f"runtime-cache {__version__}",
        )
        for key, binary, seconds in items
    ]
    return encode_bundle(blobs)


def unpack_programs(data: bytes) -> list[tuple[Entry, bytes]]:
    """Decode a bundle into ``(entry, blob)`` pairs; skip entries that fail the entry check
    (:func:`runtime_cache.check.check_entry`: checksums, key against parts).

    The blob lets a signed cache check the entry's signature with
    :meth:`runtime_cache.Cache.check`. Raises
    :class:`~runtime_cache.errors.InvalidBundleError` for a malformed bundle.
    """
    entries: list[tuple[Entry, bytes]] = []
    for blob in decode_bundle(data):
        try:
            entry = check_entry(None, blob).entry()
        except CorruptEntryError:
            continue
        entries.append((entry, blob))
    return entries
