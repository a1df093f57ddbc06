"""Reading entry metadata without values, and screening bundle entries before they are merged."""

from __future__ import annotations

from .api import Backend, StoredItem
from .codec import Limits, decode_entry, decode_meta
from .errors import CorruptEntryError, SignatureError
from .keys import CacheKey
from .stats import EntryInfo

__all__ = ["read_info", "screen_bundle"]

#: Bytes read first for a listing; larger metadata costs one more read.
HEAD_SIZE = 4096


def read_info(backend: Backend, item: StoredItem, limits: Limits) -> EntryInfo:
    """Decode an entry's metadata from the head of its blob.

    Raises ``KeyError`` when the entry vanished, and :class:`CorruptEntryError`
    when its head does not decode.
    """
    head = backend.head(item.key, HEAD_SIZE)
    if head is None:
        raise KeyError(item.key)
    meta, needed, signed = decode_meta(head, limits)
    if not meta:
        head = backend.head(item.key, needed)
        if head is None:
            raise KeyError(item.key)
        meta, _, signed = decode_meta(head, limits)
        if not meta:
            raise CorruptEntryError("entry head is truncated")
    parts = meta["p"]
    return EntryInfo(
        key=meta["k"],
        runtime=str(parts.get("runtime", "")),
        purpose=str(parts.get("purpose", "")),
        module_id=str(parts.get("module_id", "")),
        device=parts.get("device"),
        parts=parts,
        size=meta["n"],
        stored_size=item.size,
        created_at=meta["c"],
        build_seconds=meta["b"],
        producer=meta["v"],
        signed=signed,
        hits=item.hits,
        last_access=item.last_access,
        extra=dict(meta.get("x", {})),
    )


def screen_bundle(
    blobs: list[bytes], secret: bytes | None, limits: Limits
) -> tuple[dict[str, bytes], int, int]:
    """Keep the bundle entries that verify and whose key matches their parts.

    Returns ``(accepted, rejected, corrupt)``: the accepted blobs by key, and
    how many were refused for their signature or for corruption.
    """
    accepted: dict[str, bytes] = {}
    rejected = corrupt = 0
    for blob in blobs:
        try:
            entry = decode_entry(blob, secret=secret, limits=limits)
            if str(CacheKey.from_parts(entry.parts)) != entry.key:
                raise CorruptEntryError("entry key does not match its parts")
        except SignatureError:
            rejected += 1
            continue
        except (CorruptEntryError, TypeError, ValueError):
            corrupt += 1
            continue
        accepted[entry.key] = blob
    return accepted, rejected, corrupt
