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
:class:`~runtime_cache.api.HeadOnly`, and ``dir://`` hands back the head alone, which the
front counts as the miss the whole entry would have been, without the check.

A head is remembered only where it names the key it was read under: an entry moved under
another key is rejected there for its key, and its head, remembered, would make this
reader refuse the good entry under its own key. A remembered head stops being refused when
this cache stores an entry that begins with it (a head copied from a good entry, with a
forged rest, would otherwise hide that entry from this process).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .api import SPAN_HEAD, HeadOnly, Span, framing_span
from .entry_frame import ENTRY_HEADER, ENTRY_MAGIC, ENTRY_VERSION, FLAG_SIGNED, HEADER_SIZE
from .entry_meta import Limits
from .signing import SIG_SIZE

__all__ = ["REMEMBERED", "RefusedHeads"]

#: The most heads one cache remembers (each :data:`~runtime_cache.api.SPAN_HEAD` bytes).
REMEMBERED = 64


class RefusedHeads:
    """The heads one cache refuses: its span for the store's reads, and their verdicts.

    ``signed``: the cache requires a signature. ``limits`` is the cache's, kept current by it.
    """

    def __init__(self, signed: bool, limits: Limits) -> None:
        self.signed = signed
        self.limits = limits
        self._seen: dict[bytes, None] = {}  # remembered heads, oldest first
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
            if self._verdict(head, version, flags, reserved, meta_len, value_len) is None:
                return where
            return HeadOnly(where)

        #: The front's span (:func:`~runtime_cache.entry_frame.entry_span`, which it
        #: answers as, but :class:`~runtime_cache.api.HeadOnly` for a refused head).
        self.span: Span = framing_span(span)

    def _verdict(
        self, head: bytes, version: int, flags: int, reserved: int, meta_len: int, value_len: int
    ) -> str | None:
        if version > ENTRY_VERSION:
            return "misses"  # (the check's NewerFormatError: kept, no other count)
        if version != ENTRY_VERSION or flags > FLAG_SIGNED or reserved:
            return None  # corrupt: read whole, so that the check removes it
        if self.signed and not flags & FLAG_SIGNED:
            return "rejected"
        limits = self.limits
        if meta_len > limits.max_meta_size or value_len > limits.max_value_size:
            return "rejected"
        if self._seen and head[:SPAN_HEAD] in self._seen:
            return "rejected"
        return None

    def kept_head(self, blob: bytes) -> str | None:
        """The counter a blob goes to (``"misses"`` or ``"rejected"``) when it is the head
        alone of a refused entry, as ``dir://`` returns one; ``None`` for anything else."""
        if len(blob) != SPAN_HEAD:
            return None
        magic, version, flags, reserved, meta_len, value_len, _, _ = ENTRY_HEADER.unpack_from(blob)
        whole = HEADER_SIZE + meta_len + value_len + (SIG_SIZE if flags & FLAG_SIGNED else 0)
        if magic != ENTRY_MAGIC or whole <= SPAN_HEAD:
            return None
        return self._verdict(blob, version, flags, reserved, meta_len, value_len)

    def remember(self, skey: str, blob: bytes) -> None:
        """Refuse ``blob``'s head from now on: the whole entry, read under ``skey``, was
        rejected. Only a blob longer than its head, whose head names ``skey``."""
        if len(blob) <= SPAN_HEAD or skey.encode() not in blob[HEADER_SIZE:SPAN_HEAD]:
            return
        head = bytes(blob[:SPAN_HEAD])
        with self._lock:
            self._seen[head] = None
            while len(self._seen) > REMEMBERED:
                del self._seen[next(iter(self._seen))]

    def forget(self, blobs: Iterable[bytes]) -> None:
        """Refuse the heads of ``blobs`` no more: this cache stored them."""
        if not self._seen:
            return
        with self._lock:
            for blob in blobs:
                self._seen.pop(bytes(blob[:SPAN_HEAD]), None)

    def __len__(self) -> int:
        return len(self._seen)
