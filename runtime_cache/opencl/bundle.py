"""Pre-compiled program bundles: codec entries (key parts, checksum) packed in one blob.

A bundle is the same format as :meth:`runtime_cache.Cache.dumps`, so it can
also be merged into any cache with :meth:`~runtime_cache.Cache.loads`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .._version import __version__
from ..check import check_entry
from ..codec import (
    DEFAULT_LIMITS,
    Entry,
    Limits,
    SecretKeys,
    decode_bundle,
    encode_bundle,
    encode_entry,
)
from ..errors import CorruptEntryError
from ..keys import CacheKey

__all__ = ["pack_programs", "unpack_programs"]


def pack_programs(
    items: Iterable[tuple[CacheKey, bytes, float]], *, secret: SecretKeys | None = None
) -> bytes:
    """Encode ``(key, binary, build_seconds)`` items as one bundle; with ``secret``, each
    entry and the bundle are signed with its first key (a signed cache loads only those)."""
    now = time.time()
    blobs = [
        encode_entry(
            str(key),
            key.parts,
            binary,
            created_at=now,
            build_seconds=seconds,
            producer=f"runtime-cache {__version__}",
            secret=secret,
        )
        for key, binary, seconds in items
    ]
    return encode_bundle(blobs, secret=secret)


def unpack_programs(
    data: bytes, *, secret: SecretKeys | None = None, limits: Limits = DEFAULT_LIMITS
) -> list[tuple[Entry, bytes]]:
    """Decode a bundle into ``(entry, blob)`` pairs; skip entries that fail the entry check
    (:func:`runtime_cache.check.check_entry`: checksums, key against parts).

    The blob lets a signed cache check the entry's signature with
    :meth:`runtime_cache.Cache.check`. Raises
    :class:`~runtime_cache.errors.InvalidBundleError` for a malformed bundle and,
    with ``secret``, for a bundle that no key of it signed (as ``Cache.loads`` does).
    """
    entries: list[tuple[Entry, bytes]] = []
    for blob in decode_bundle(data, secret=secret, limits=limits):
        try:
            entry = check_entry(None, blob).entry()
        except CorruptEntryError:
            continue
        entries.append((entry, blob))
    return entries
