"""``TieredBackend``: fast tiers over slow ones, e.g. memory over a directory over Redis.

- A read goes through the tiers in order; a hit in a lower tier is copied up into the
  faster ones where they hold nothing (promotion: a newer write there stays).
- A write goes to every tier. Tiers that declare ``remote = True`` (Redis) are written by
  a background thread with a bounded queue, so the caller never waits on the network; the
  queue is flushed on :meth:`TieredBackend.close` and at exit.
- A failing tier is skipped and its error counted; it never hides a hit in another tier.
  Only when every tier fails does the call raise, so the front counts it.
- A tier that fails a write that a tier below it takes removes its older copy of the key
  where it can, so that reads fall through to the newer one (the lowest tier that failed
  keeps its copy: the shared one, which other machines read); what a tier did not write,
  and what it could not remove or kept, are counted (:meth:`TieredBackend.tier_stats`).

From a URL (this is the form ``RUNTIME_CACHE`` takes)::

    RUNTIME_CACHE="memory://?max_size=64MB,dir:///var/cache/app,redis://cache.internal:6379/0"

Tiers are separated by commas, fastest first; each is a URL of its own, so a tier's options
may not contain a comma.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TypeVar

from runtime_cache.api import Backend, Lease, Span, StoredItem, check_text_key, delete_unchanged
from runtime_cache.errors import (
    BackendError,
    BackendUnavailableError,
    EntryTooLargeError,
    InvalidKeyError,
    InvalidURLError,
)
from runtime_cache.fork_locks import renew_in_child
from runtime_cache.refusals import Refusals
from runtime_cache.stored_sizes import stored_size
from runtime_cache.urls import redact_url, tier_urls

from .tier import (
    PROMOTE,
    PROMOTE_OVER,
    Tier,
    TierStats,
    delete_in_tiers,
    raise_if_all_failed,
    raise_if_unwritten,
    settle_unwritten,
)
from .tier_reads import first_answer, read_many, read_one, whole
from .write_behind import FlushingLease, WriteBehind

__all__ = ["TierStats", "TieredBackend"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def _listed(listing: Callable[[str], Iterable[T]], prefix: str) -> list[T]:
    return list(listing(prefix))


class TieredBackend(Backend):
    """Several backends as one, fastest first.

    Args:
        tiers: the backends, fastest first (e.g. memory, directory, Redis).
        queue_items: per remote tier, how many distinct keys may wait to be written.
        queue_bytes: per remote tier, how many bytes may wait to be written.

    Example::

        backend = TieredBackend([MemoryBackend(), DirectoryBackend(path), RedisBackend(url)])
        backend = rc.open_backend("memory://,dir://,redis://cache.internal:6379/0")
    """

    scheme = "tiered"

    def __init__(
        self, tiers: Sequence[Backend], *, queue_items: int = 1024, queue_bytes: int = 64 << 20
    ) -> None:
        if not tiers or not all(isinstance(t, Backend) for t in tiers):
            raise TypeError("TieredBackend needs a non-empty sequence of Backend objects")
        self._tiers: list[Tier] = []
        for backend in tiers:
            tier = Tier(backend, log)
            if backend.remote:
                tier.writer = WriteBehind(
                    backend,
                    max_items=queue_items,
                    max_bytes=queue_bytes,
                    on_error=self._error_hook(tier),
                    on_success=partial(tier.policy.succeeded, "write"),  # (it works again)
                )
            self._tiers.append(tier)
        self.private = all(t.private for t in tiers)
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")
        # Shared if any tier is; opened unsigned on purpose only if every shared tier was.
        self.shared = any(t.shared for t in tiers)
        self.insecure = self.shared and all(t.insecure for t in tiers if t.shared)
        #: The tiers the last listing (``keys``/``scan``) could not reach: its result is partial.
        self.failed_tiers: list[str] = []
        self._checks: list[weakref.ref[Callable[[str, bytes], bool]]] = []
        self._refusals = Refusals()  # the shared tier's synchronous writes refused for size
        #: Tiers :meth:`from_url` left out, as ``(URL, reason)``: the URL redacted.
        self.left_out: list[tuple[str, str]] = []

    @property
    def unlisted_folders(self) -> list[tuple[str, str]]:
        """Folders the tiers' last listings could not read, and why (``dir://``'s)."""
        return [f for t in self._tiers for f in getattr(t.backend, "unlisted_folders", ())]

    @classmethod
    def from_url(cls, url: str, opener: Callable[[str], Backend] | None = None) -> TieredBackend:
        """Open ``"memory://,dir://,redis://host:6379/0"``: one tier per comma-separated URL.

        ``opener`` opens each tier's URL; it defaults to
        :func:`runtime_cache.registry.open_backend` (imported here, not at module
        level, since backends depend only on the contract). A tier this machine cannot
        open now (a :class:`BackendError`: a folder it may not make, a full disk) is left
        out, with a warning, and named in :attr:`left_out`; when no tier opens, the first
        such error is raised.
        """
        if opener is None:
            from runtime_cache.registry import open_backend

            opener = open_backend
        if not isinstance(url, str):
            raise InvalidURLError(f"a backend URL must be a str, not {type(url).__name__}")
        parts = tier_urls(url)
        opened: list[Backend] = []
        failed: BackendError | None = None
        left: list[tuple[str, str]] = []
        try:
            for part in parts:
                try:
                    opened.append(opener(part))
                except BackendError as exc:  # this machine cannot open it now: left out
                    log.warning("runtime-cache: tier %s left out: %s", redact_url(part), exc)
                    failed = failed or exc
                    left.append((redact_url(part), str(exc)))
        except BaseException:
            for backend in opened:
                backend.close()
            raise
        if not opened and failed is not None:
            raise failed
        backend = cls(opened)
        backend.left_out = left
        return backend

    @property
    def tiers(self) -> list[Backend]:
        """The backends, fastest first."""
        return [t.backend for t in self._tiers]

    def tier_stats(self) -> list[TierStats]:
        """Per tier: absorbed errors, promotions, background-writer counters, and what its
        own writes failed to store (``not_written``, ``may_be_stale``)."""
        return [t.stats() for t in self._tiers]

    # ------------------------------------------------------------- bookkeeping
    @staticmethod
    def _error_hook(tier: Tier) -> Callable[[BaseException], None]:
        return lambda exc: tier.policy.failed("background write", exc)

    def _write(self, tiers: Iterable[Tier], items: Mapping[str, bytes], op: str) -> None:
        for key in items:  # queued writes are checked here: the remote tier would be too late
            check_text_key(key)
        errors: list[Exception] = []
        missed: list[tuple[Tier, Exception]] = []
        took: list[Tier] = []
        asked: list[Tier] = []
        refused: dict[int, dict[str, Exception]] = {}  # id(tier) -> the keys it cannot hold
        unqueued: list[tuple[Tier, int]] = []  # remote tiers that dropped some: how many
        for tier in tiers:
            asked.append(tier)
            if tier.writer is not None:
                queued = tier.writer.put(items)
                if queued == len(items) and not tier.policy.failing("write"):
                    took.append(tier)  # (queued: it lands, or its failure is counted there)
                else:  # none to count on: a tier above keeps its copy, and the write may fail
                    if tier.policy.failing("write"):
                        errors.append(BackendUnavailableError(f"{tier.backend!r}: writes failing"))
                    else:  # (its queue is full, or the value larger than it: no outage)
                        errors.append(BackendError(f"{tier.backend!r}: its write queue is full"))
                    unqueued.append((tier, len(items) - queued))  # (queued: counted there)
                continue
            done, refused[id(tier)] = tier.write(op, items, errors)
            if len(refused[id(tier)]) == len(items):
                continue  # it can hold none of them: neither took them nor missed them
            if not done:
                missed.append((tier, errors[-1]))
            else:
                took.append(tier)
            if tier is self._tiers[-1]:  # the shared tier: what its lease's holder asks
                failed = errors[-1] if not done else None
                sized = failed.refused if isinstance(failed, EntryTooLargeError) else set()
                self._refusals.landed(set(items) - sized)
                self._refusals.refused(sized)
        if took:
            settle_unwritten(self._tiers, items, took, missed, unqueued, refused)
        raise_if_unwritten(asked, items, refused, missed)
        whole = sum(len(keys) == len(items) for keys in refused.values())
        raise_if_all_failed(errors, len(asked) - whole)

    def sign_leases(self, keys: tuple[bytes, ...]) -> None:
        for tier in self._tiers:
            tier.backend.sign_leases(keys)

    def check_promotions(self, check: Callable[[str, bytes], bool]) -> None:
        with self._lock:  # (held weakly: a check goes with the Cache that keeps it)
            self._checks = [r for r in self._checks if r() is not None] + [weakref.ref(check)]
        for tier in self._tiers:
            tier.backend.check_promotions(check)

    def _promote(self, upto: int, items: Mapping[str, bytes], op: str = PROMOTE) -> None:
        if not items or upto == 0:
            return
        checks = [c for c in (r() for r in self._checks) if c is not None]
        if self._checks and self._tiers[upto].backend.shared:  # others may have written these
            # Once checked, never unchecked: with every cache gone, nothing is copied up.
            items = {k: v for k, v in items.items() if checks and all(c(k, v) for c in checks)}
        for tier in reversed(self._tiers[:upto]):  # nearest first: a newer entry stops it
            if op == PROMOTE and tier.writer is None:
                items = {k: v for k, v in items.items() if tier.copy_up(k, v, checks)}
            elif items:  # over a refused copy; into a remote tier, queued (see tiered.md)
                tier.copy_over(items)

    # ----------------------------------------------------------------- reading
    def get(self, key: str) -> bytes | None:
        found = read_one(self._tiers, key, None, self._promote)
        return None if found is None else found[0]

    def get_parts(self, key: str, span: Span) -> tuple[bytes, ...] | None:
        # Each tier in parts, as it reads on its own (dir:// takes a junk file unread).
        return read_one(self._tiers, key, span, self._promote)

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        return whole(read_many(self._tiers, keys, self._promote))

    def get_many_parts(self, keys: Iterable[str], span: Span) -> dict[str, tuple[bytes, ...]]:
        return read_many(self._tiers, keys, self._promote, span=span)

    def peek(self, key: str) -> bytes | None:
        return self.peek_many([key]).get(key)

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        return whole(read_many(self._tiers, keys, self._promote, peek=True))

    def get_many_past(
        self, bad: Mapping[str, bytes], *, span: Span | None = None
    ) -> dict[str, bytes]:
        over = partial(self._promote, op=PROMOTE_OVER)  # (over the refused copy above)
        return whole(read_many(self._tiers, bad, over, past=bad, span=span))

    def head(self, key: str, size: int) -> bytes | None:
        return first_answer(
            self._tiers, key, "head", lambda v: v[:size], lambda b: b.head(key, size)
        )

    def stored_size(self, key: str) -> int | None:
        """The size of ``key``'s blob in the tier :meth:`head` reads (``None``: none, or untold)."""
        held = lambda b: None if b.head(key, 1) is None else (stored_size(b, key),)  # noqa: E731
        found = first_answer(self._tiers, key, "head", lambda v: (len(v),), held)
        return None if found is None else found[0]

    @property
    def exact_sizes(self) -> bool:
        """Whether every tier lists its blobs' own sizes (no framing of its own)."""
        return all(getattr(tier.backend, "exact_sizes", False) for tier in self._tiers)

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        """The union of every tier's items; the fastest tier's view of a key wins. Tiers
        that could not be listed are named in :attr:`failed_tiers`."""
        seen: dict[str, StoredItem] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for tier in self._tiers:
            if tier.writer is not None:
                for key in tier.writer.queued_keys():
                    value = tier.writer.lookup(key)
                    if key.startswith(prefix) and value is not None:
                        seen.setdefault(key, StoredItem(key, len(value)))
            ok, items = tier.policy.attempt(
                "scan", partial(_listed, tier.backend.scan, prefix), errors
            )
            if not ok:
                failed.append(repr(tier.backend))  # reprs are redacted
            for item in items or ():
                seen.setdefault(item.key, item)
        self.failed_tiers = failed
        raise_if_all_failed(errors, len(self._tiers))
        return iter(list(seen.values()))

    def keys(self, prefix: str = "") -> Iterator[str]:
        """The union of every tier's keys (and of writes still queued); tiers that could
        not be listed are named in :attr:`failed_tiers`."""
        seen: dict[str, None] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for tier in self._tiers:
            if tier.writer is not None:
                seen.update(
                    dict.fromkeys(k for k in tier.writer.queued_keys() if k.startswith(prefix))
                )
            ok, found = tier.policy.attempt(
                "keys", partial(_listed, tier.backend.keys, prefix), errors
            )
            if not ok:
                failed.append(repr(tier.backend))  # reprs are redacted
            seen.update(dict.fromkeys(found or ()))
        self.failed_tiers = failed
        raise_if_all_failed(errors, len(self._tiers))
        return iter(list(seen))

    # ----------------------------------------------------------------- writing
    def set(self, key: str, value: bytes) -> None:
        self._write(self._tiers, {key: bytes(value)}, "set")

    def set_many(self, items: Mapping[str, bytes]) -> None:
        if items:
            self._write(self._tiers, {k: bytes(v) for k, v in items.items()}, "set_many")

    def delete(self, key: str) -> bool:
        """Delete from every tier, remote ones included, synchronously (deletes are rare);
        after trying the rest, :class:`PartialDeleteError` when some tier failed (it may hold
        the entry still), :class:`BackendError` when every one did."""
        return delete_in_tiers(self._tiers, key, lambda b: b.delete(key), lambda _value: True)

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Remove ``key`` from each tier that still holds ``expected`` (each tier atomically
        where it can); a tier holding other bytes keeps them. Raises as :meth:`delete`."""
        blob = bytes(expected)
        remove = lambda b: b.delete_if(key, blob)  # noqa: E731
        return delete_in_tiers(self._tiers, key, remove, blob.__eq__)

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        """Remove ``key`` from each tier where it is ``listed.size`` bytes long and begins
        with ``head`` (each tier as it checks that); uses are not compared, since the listing
        gave one tier's. Raises as :meth:`delete`."""
        first, same = bytes(head), StoredItem(key, listed.size)

        def queued(value: bytes) -> bool:
            return len(value) == listed.size and value.startswith(first)

        return delete_in_tiers(
            self._tiers, key, lambda b: delete_unchanged(b, key, same, first), queued
        )

    def removable(self, key: str) -> bool:
        """Whether every tier can delete ``key`` (a tier without it can, and one that cannot
        hold it; where none can hold it, its ``InvalidKeyError``)."""
        unheld: list[InvalidKeyError] = []
        for tier in self._tiers:
            try:
                if not tier.backend.removable(key):
                    return False
            except InvalidKeyError as exc:
                unheld.append(exc)
        if len(unheld) == len(self._tiers):
            raise unheld[0]
        return True

    def vacuum(self) -> int:
        total = 0
        for tier in self._tiers:
            _, count = tier.policy.attempt("vacuum", tier.backend.vacuum, [])
            total += count or 0
        return total

    def lease(self, key: str, ttl: float) -> Lease | None:
        """The lease of the last (shared) tier, or ``None`` when it has none."""
        inner = self._tiers[-1].backend.lease(key, ttl)
        return None if inner is None else FlushingLease(inner, self.flush, self._refused)

    def _refused(self, key: str) -> bool:  # the lease's tier refused its last write for size
        writer = self._tiers[-1].writer
        return key in self._refusals or (writer is not None and key in writer.refusals)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued writes to remote tiers were attempted; ``False`` on timeout."""
        return all(t.writer.flush(timeout) for t in self._tiers if t.writer is not None)

    def close(self) -> None:
        """Flush the background writers, then close every tier."""
        for tier in self._tiers:
            if tier.writer is not None:
                tier.writer.close()
            tier.backend.close()

    def __repr__(self) -> str:
        return f"<TieredBackend {' > '.join(repr(t.backend) for t in self._tiers)}>"
