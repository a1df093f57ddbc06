"""Reading entry metadata without values (for listings), checked as every read is."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .api import Backend, StoredItem
from .check import check_binding
from .codec import HEADER_SIZE, Limits, decode_meta
from .errors import CorruptEntryError, NewerFormatError, OverLimitError, RuntimeCacheError
from .signing import SIG_SIZE
from .stats import EntryInfo
from .stored_sizes import stored_size

#: Told ``(key, reason)`` for each entry a listing or a dump leaves out as corrupt or unreadable.
OnSkip = Callable[[str, str], None]
#: Told ``(done, total)`` as a long operation advances.
OnProgress = Callable[[int, int], None]

__all__ = [
    "OnProgress",
    "OnSkip",
    "list_entries",
    "read_heads",
    "read_info",
    "read_info_and_head",
    "skip_kind",
    "skip_reason",
]

#: Bytes read first for a listing; larger metadata costs one more read.
HEAD_SIZE = 4096


def read_info(backend: Backend, item: StoredItem, limits: Limits) -> EntryInfo:
    """Decode an entry's metadata from the head of its blob.

    Raises ``KeyError`` when the entry vanished, and :class:`CorruptEntryError`
    when its head does not decode or does not belong under its storage key
    (:func:`~runtime_cache.check.check_binding`; the value and signature are
    checked when the entry is read).
    """
    return read_info_and_head(backend, item, limits)[0]


def read_info_and_head(
    backend: Backend, item: StoredItem, limits: Limits
) -> tuple[EntryInfo, bytes]:
    """:func:`read_info`, with the entry's frame header as read (its first
    :data:`~runtime_cache.codec.HEADER_SIZE` bytes: lengths, and checksums of its metadata,
    creation time included, and of its value), which tells this entry from one written
    again under its key (see :meth:`~runtime_cache.api.Backend.delete_if_unchanged`)."""
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
    first = bytes(head[:HEADER_SIZE])  # (of the head decoded)
    check_binding(item.key, meta)
    declared = needed + meta["n"] + (SIG_SIZE if signed else 0)
    if item.size and item.size != declared:  # (0: a size the caller does not know)
        exact = getattr(backend, "exact_sizes", False)  # (else its sizes may count framing)
        if item.size < declared or exact:
            _check_size(backend, item.key, first, declared, exact)
    parts = meta["p"]
    info = EntryInfo(
        key=meta["k"],
        runtime=str(parts.get("runtime", "")),
        purpose=str(parts.get("purpose", "")),
        module_id=str(parts.get("module_id", "")),
        device=parts.get("device"),
        parts=parts,
        size=meta["n"],
        stored_size=max(item.size, declared) if item.size else 0,  # (checked above)
        created_at=meta["c"],
        build_seconds=meta["b"],
        producer=meta["v"],
        signed=signed,
        hits=item.hits,
        last_access=item.last_access,
        extra=dict(meta.get("x", {})),
    )
    return info, first


def _check_size(backend: Backend, key: str, first: bytes, declared: int, exact: bool) -> None:
    """Raise :class:`CorruptEntryError` where the entry at ``key`` (whose frame header is
    ``first``) holds fewer than the ``declared`` bytes its header says (or, in a store whose
    sizes are ``exact``, more): a head that claims a value the store does not hold (a
    planted 190 bytes listed as 1 GiB built in 1,000 s) is corrupt, as a read of it is. The
    listing's size may be older than the head read after it (an entry written again
    between): its size now tells (:func:`stored_size`, no value read: a sparse file was
    read whole so), with its header again, the one read. A size the store cannot tell
    passes."""
    now = stored_size(backend, key)
    again = backend.head(key, HEADER_SIZE)
    if again is None:
        raise KeyError(key)
    if now is None or bytes(again) != first or now == declared:
        return  # (written again meanwhile, or the listing's size was older than the head)
    if now > declared and not exact:
        return  # (a store whose sizes may count framing of its own)
    raise CorruptEntryError(f"entry is {now} bytes, its header says {declared}")


def read_heads(
    backend: Backend,
    limits: Limits,
    failed: Callable[[str, Exception], None],
    prefix: str = "",
    headers: dict[str, bytes] | None = None,
) -> Iterator[tuple[StoredItem, EntryInfo | RuntimeCacheError]]:
    """Each stored item under ``prefix`` with its metadata, or the error that reading it
    raised (corrupt, or unreadable here). Entries that vanish while listing are left out;
    other failures of the backend go to ``failed(op, exc)`` (the front's failure policy).
    ``headers``, where given, gets each good entry's frame header as read, by storage key
    (see :func:`read_info_and_head`)."""
    try:
        items = list(backend.scan(prefix))
    except Exception as exc:
        failed("scan", exc)
        return
    for item in items:
        try:
            info, header = read_info_and_head(backend, item, limits)
        except KeyError:
            continue
        except RuntimeCacheError as exc:
            yield item, exc
            continue
        except Exception as exc:
            failed("head", exc)
            continue
        if headers is not None:
            headers[item.key] = header
        yield item, info


def skip_kind(exc: Exception) -> str:
    """What an entry whose head raised ``exc`` is: ``"newer format"`` or ``"over this
    cache's limits"`` (another reader's, maybe), ``"corrupt"`` (bad for every reader), or
    ``"unreadable"`` (here)."""
    if isinstance(exc, NewerFormatError):
        return "newer format"
    if isinstance(exc, OverLimitError):
        return "over this cache's limits"
    return "corrupt" if isinstance(exc, CorruptEntryError) else "unreadable"


def skip_reason(exc: RuntimeCacheError) -> str:
    """What a listing tells ``on_skip`` of an entry whose head raised ``exc``."""
    return f"{skip_kind(exc)}: {exc}"


def list_entries(
    backend: Backend,
    limits: Limits,
    failed: Callable[[str, Exception], None],
    runtime: str | None = None,
    purpose: str | None = None,
    module_id: str | None = None,
    on_skip: OnSkip | None = None,
) -> Iterator[EntryInfo]:
    """Iterate over entry metadata, filtered, without loading values (``Cache.entries``).

    Entries that vanish while listing are skipped; those that fail the check or
    cannot be read are skipped and told to ``on_skip(key, reason)``. Backend
    failures go to ``failed(op, exc)`` (the front's failure policy).
    """
    prefix = ""
    if runtime is not None:
        prefix = f"{runtime}/" if purpose is None else f"{runtime}/{purpose}/"
    for item, info in read_heads(backend, limits, failed, prefix):
        if isinstance(info, RuntimeCacheError):
            if on_skip is not None:
                on_skip(item.key, skip_reason(info))
            continue
        if purpose is not None and info.purpose != purpose:
            continue
        if module_id is not None and info.module_id != module_id:
            continue
        yield info
