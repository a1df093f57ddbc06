"""Entries a reader refuses by their first bytes, so that it does not read them whole.

The front reads an entry in pieces (:meth:`~runtime_cache.api.Backend.get_parts`): a store
that reads files (``dir://``) passes the entry's first bytes, its *head*
(:data:`~runtime_cache.api.SPAN_HEAD` of them), to the front's span, and reads the rest
only where the span asks for it. Some entries are refused, and kept, whatever follows
their head: one of a newer format (its own readers'), one without a signature where this
reader requires one, one whose lengths pass this reader's limits. Others are refused only
once read whole, for a signature or key parts that do not match; this reader then
remembers their heads (a bounded number, :data:`REMEMBERED`), so that one planted file
costs a process one whole read, not one on every get. For all of these the span answers
:class:`~runtime_cache.api.HeadOnly`, and ``dir://`` hands back the head alone (as
``(head, b"")``), which the front counts as the miss the whole entry would have been,
without the check; it then looks past it only in a store of tiers, whose tiers below may
hold a good copy (read in parts too).

A head is remembered only where its metadata holds the key it was read under: an entry
moved under another key is rejected there for its key, and its head, remembered, would make
this reader refuse the good entry under its own key. Heads are remembered by digest
(BLAKE2b, 16 bytes), the most recently refused kept. A remembered head stops being refused when
this cache stores an entry that begins with it (a head copied from a good entry, with a
forged rest, would otherwise hide that entry from this process).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable

from .api import SPAN_HEAD, HeadOnly, Span, framing_span, head_only
from .entry_frame import ENTRY_HEADER, ENTRY_MAGIC, ENTRY_VERSION, FLAG_SIGNED, HEADER_SIZE
from .entry_meta import Limits, unpack_meta

__all__ = ["REMEMBERED", "RefusedHeads"]

#: The most heads one cache remembers (a 16-byte digest each).
REMEMBERED = 4096

Buffer = bytes | bytearray | memoryview


def _digest(head: Buffer) -> bytes:
    return hashlib.blake2b(head[:SPAN_HEAD], digest_size=16).digest()


class RefusedHeads:
    """The heads one cache refuses: its span for the store's reads, and their verdicts.

    ``signed``: the cache requires a signature. ``limits`` is the cache's, kept current by it.
    """

    def __init__(self, signed: bool, limits: Limits) -> None:
        self.signed = signed
        self.limits = limits
        self._seen: dict[bytes, None] = {}  # digests of remembered heads, oldest first
        self._lock = threading.Lock()

        def span(head: bytes) -> tuple[int, int] | None:
            if len(head) < HEADER_SIZE:
                return None
            magic, version, flags, reserved, meta_len, value_len, _, _ = ENTRY_HEADER.unpack_from(
                head
            )
            if magic != ENTRY_MAGIC:
                return None
            start = HEADER_SIZE + meta_len
            where = (start, start + value_len)
            if self._refuses(head, version, flags, reserved, meta_len, value_len):
                return HeadOnly(where)
            return where

        #: The front's span (:func:`~runtime_cache.entry_frame.entry_span`, which it
        #: answers as, but :class:`~runtime_cache.api.HeadOnly` for a refused head).
        self.span: Span = framing_span(span)

    def _refuses(
        self, head: Buffer, version: int, flags: int, reserved: int, meta_len: int, value_len: int
    ) -> bool:
        if version > ENTRY_VERSION:
            return True  # (the check's NewerFormatError: kept, a miss)
        if version != ENTRY_VERSION or flags > FLAG_SIGNED or reserved:
            return False  # corrupt: read whole, so that the check removes it
        if self.signed and not flags & FLAG_SIGNED:
            return True
        limits = self.limits
        if meta_len > limits.max_meta_size or value_len > limits.max_value_size:
            return True
        if not self._seen:
            return False
        digest = _digest(head)
        if digest not in self._seen:
            return False
        with self._lock:  # refused again: the last to be forgotten
            if digest in self._seen:
                del self._seen[digest]
                self._seen[digest] = None
        return True

    @staticmethod
    def kept_head(pieces: tuple[Buffer, ...]) -> str | None:
        """The counter for ``pieces`` (``"misses"`` for a newer format, else ``"rejected"``)
        when they are an entry's head alone (:func:`~runtime_cache.api.head_only`), which
        the store cut as the span refused it; ``None`` for anything else, which the check
        judges."""
        if not head_only(pieces) or len(head := pieces[0]) < HEADER_SIZE:
            return None
        version = ENTRY_HEADER.unpack_from(head)[1]
        return "misses" if version > ENTRY_VERSION else "rejected"

    def remember(self, skey: str, blob: Buffer) -> None:
        """Refuse ``blob``'s head from now on: the whole entry, read under ``skey``, was
        rejected. Only a blob longer than its head whose metadata holds ``skey`` as its key."""
        if len(blob) <= SPAN_HEAD or len(blob) < HEADER_SIZE:
            return
        meta_len = ENTRY_HEADER.unpack_from(blob)[4]
        try:
            meta = unpack_meta(bytes(blob[HEADER_SIZE : HEADER_SIZE + meta_len]), self.limits)
        except Exception:  # (its checksums passed; a reader's limits may refuse it)
            return
        if meta.get("k") != skey:
            return
        digest = _digest(blob)
        with self._lock:
            self._seen.pop(digest, None)
            self._seen[digest] = None
            while len(self._seen) > REMEMBERED:
                del self._seen[next(iter(self._seen))]

    def forget(self, blobs: Iterable[Buffer]) -> None:
        """Refuse the heads of ``blobs`` no more: this cache stored them."""
        if not self._seen:
            return
        with self._lock:
            for blob in blobs:
                self._seen.pop(_digest(blob), None)

    def __len__(self) -> int:
        return len(self._seen)
