"""The names the crash guard knows binaries by: a binary's digest, and its mark under a key.

A binary is blocklisted by its digest (:func:`binary_digest`: the same bytes are the
same danger under any key), and known under a key (:func:`binding`): the same bytes
copied under another program's key are not known there (see :mod:`.guard`).
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

__all__ = ["Binary", "binary_digest", "binding", "bindings"]

#: A program binary as the cache hands it over: bytes, or a view into a stored entry.
Binary = bytes | memoryview


def binary_digest(binary: Binary) -> str:
    """The digest under which a binary is guarded and blocklisted."""
    return xxhash.xxh3_128_hexdigest(binary)


def binding(key: object, digest: str) -> str:
    """The known-list mark of binary ``digest`` stored under cache key ``key``."""
    return xxhash.xxh3_128_hexdigest(f"{key}\n{digest}".encode())


def bindings(keys: Sequence[object] | None, digests: Sequence[str]) -> list[str]:
    """:func:`binding` of each ``(key, digest)`` pair; the bare digests when there are no keys."""
    if keys is None:
        return list(digests)
    return [binding(k, d) for k, d in zip(keys, digests, strict=True)]
