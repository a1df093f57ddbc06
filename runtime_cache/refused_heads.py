"""Entries a reader refuses by their first bytes, so that it does not read them whole.

The front reads an entry in pieces (:meth:`~runtime_cache.api.Backend.get_parts`): a store
that reads files (``dir://``) passes the entry's first bytes, its *head*
(:data:`~runtime_cache.api.SPAN_HEAD` of them), to the front's span, and reads the rest
only where the span asks for it. Some entries are refused, and kept, whatever follows
their head: one of a newer format (its own readers'), one without a signature where this
reader requires one, one whose lengths pass this reader's limits. Others are refused only
once read whole (a wrong signature, a key or key parts that do not match); this reader then
remembers their heads, by digest, with the keys each was refused under (a bounded number,
:data:`REMEMBERED`, the least recently refused forgotten first), so that one planted file
costs a process one whole read, not one on every get. For all of these the span answers
:class:`~runtime_cache.api.HeadOnly`, and ``dir://`` hands back the head alone (as
``(head, b"")``), which the front counts as the miss the whole entry would have been,
without the check; it then looks past it only in a store of tiers, whose tiers below may
hold a good copy (read in parts too).

The span cannot tell which key it reads. A head cut for a key it was not refused under (a
good entry, copied under another key, where it was refused for that key) is read whole
again for this one (:meth:`RefusedHeads.whole_again`), so that the copy hides nothing. A
remembered head stops being refused when this cache stores an entry that begins with it (a
head copied from a good entry, with a forged rest, would otherwise hide that entry from
this process).

A backend whose ``get_many_past`` takes no ``span`` (one written before it had one) gets
none of this: the front's reads past a refused entry would then read it whole.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable

import xxhash

from .api import SPAN_HEAD, Backend, HeadOnly, Span, framing_span, head_only
from .entry_frame import (
    ENTRY_HEADER,
    ENTRY_MAGIC,
    ENTRY_VERSION,
    FLAG_SIGNED,
    HEADER_SIZE,
    entry_tail,
)
from .entry_frame import entry_span as plain_span
from .entry_meta import Limits
from .fork_locks import renew_in_child
from .signing import SIG_SIZE

__all__ = ["REMEMBERED", "RefusedHeads", "cuts_heads"]

#: The most heads one cache remembers (a digest each, and the keys it was refused under).
REMEMBERED = 4096
#: An entry header's first 8 bytes (magic, version, flags, reserved) and its two lengths.
_LEAD = struct.Struct("<8sIQ")
#: The most keys one remembered head is refused under.
KEYS_A_HEAD = 8

Buffer = bytes | bytearray | memoryview


def cuts_heads(backend: Backend) -> bool:
    """Whether the front may let ``backend`` cut refused heads: its ``get_many_past`` reads
    past them (it takes ``span``)."""
    past = type(backend).get_many_past
    code = getattr(past, "__code__", None)
    return past is Backend.get_many_past or (code is not None and "span" in code.co_varnames)


def _digest(head: Buffer) -> bytes:
    # (A crafted collision gives nothing a copied head does not: see the module's text.)
    return xxhash.xxh3_128_digest(head[:SPAN_HEAD])


class RefusedHeads:
    """The heads one cache refuses: its span for the store's reads, and their verdicts.

    ``signed``: the cache requires a signature. ``limits`` is the cache's, kept current by it.
    ``enabled`` False (see :func:`cuts_heads`): the plain span, and nothing refused unread.
    """

    def __init__(self, signed: bool, limits: Limits, enabled: bool = True) -> None:
        self.signed = signed
        self.limits = limits
        self.enabled = enabled
        self._seen: dict[bytes, set[str]] = {}  # head digest: keys, least recent first
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

        # A good entry's first 8 bytes (magic, version, flags, reserved), as this reader
        # takes them: its read then costs one unpack and a look-up.
        good = {ENTRY_MAGIC + bytes((ENTRY_VERSION, FLAG_SIGNED, 0, 0))}
        if not signed:
            good.add(ENTRY_MAGIC + bytes((ENTRY_VERSION, 0, 0, 0)))

        def span(head: bytes) -> tuple[int, int] | None:
            if len(head) < HEADER_SIZE:
                return None
            lead, meta_len, value_len = _LEAD.unpack_from(head)
            start = HEADER_SIZE + meta_len
            limits = self.limits
            if (
                lead in good
                and meta_len <= limits.max_meta_size
                and value_len <= limits.max_value_size
                and not self._seen
            ):
                return start, start + value_len
            magic, version, flags, reserved = ENTRY_HEADER.unpack_from(head)[:4]
            if magic != ENTRY_MAGIC:
                return None
            refused = self._verdict(version, flags, reserved, meta_len, value_len) is not None
            if refused or (self._seen and self._refused(head)):
                return HeadOnly((start, start + value_len))
            return start, start + value_len

        #: The front's span (:func:`~runtime_cache.entry_frame.entry_span`, which it
        #: answers as, but :class:`~runtime_cache.api.HeadOnly` for a refused head).
        self.span: Span = framing_span(span, entry_tail) if enabled else plain_span

    def _verdict(
        self, version: int, flags: int, reserved: int, meta_len: int, value_len: int
    ) -> str | None:
        # What a header alone says: "misses" (a newer format), "rejected", or None.
        if version == ENTRY_VERSION and not reserved and flags <= FLAG_SIGNED:
            limits = self.limits
            if (self.signed and not flags) or not (
                meta_len <= limits.max_meta_size and value_len <= limits.max_value_size
            ):
                return "rejected"
            return None
        return "misses" if version > ENTRY_VERSION else None  # (else corrupt: read whole)

    def _refused(self, head: Buffer) -> bool:
        digest = _digest(head)
        with self._lock:  # refused again: the last to be forgotten
            keys = self._seen.pop(digest, None)
            if keys is not None:
                self._seen[digest] = keys
        return keys is not None

    def _cut(self, pieces: tuple[Buffer, ...]) -> str | None:
        # The header's verdict ("" for none) on pieces that are a head cut alone; else None.
        if not (self.enabled and head_only(pieces)):
            return None
        magic, version, flags, reserved, meta_len, value_len, _, _ = ENTRY_HEADER.unpack_from(
            pieces[0]
        )
        whole = HEADER_SIZE + meta_len + value_len + (SIG_SIZE if flags & FLAG_SIGNED else 0)
        if magic != ENTRY_MAGIC or whole <= SPAN_HEAD:
            return None
        return self._verdict(version, flags, reserved, meta_len, value_len) or ""

    def whole_again(self, skey: str, pieces: tuple[Buffer, ...]) -> bool:
        """Whether ``pieces``, read under ``skey``, are a head the store cut that must be read
        whole for this key: its header is good, and it was refused under other keys only,
        or is no longer remembered."""
        if self._cut(pieces) != "":
            return False
        keys = self._seen.get(_digest(pieces[0]))
        return keys is None or skey not in keys

    def kept_head(self, pieces: tuple[Buffer, ...]) -> str | None:
        """The counter for ``pieces`` (``"misses"`` for a newer format, else ``"rejected"``)
        when they are an entry's head alone (:func:`~runtime_cache.api.head_only`), which
        the store cut as the span refused it; ``None`` for anything else, which the check
        judges."""
        cut = self._cut(pieces)
        return None if cut is None else (cut or "rejected")

    def remember(self, skey: str, blob: Buffer) -> None:
        """Refuse ``blob``'s head from now on: the whole entry, read under ``skey``, was
        rejected. Only a blob longer than its head."""
        if not self.enabled or len(blob) <= SPAN_HEAD:
            return
        digest = _digest(blob)
        with self._lock:
            keys = self._seen.pop(digest, set())
            if len(keys) < KEYS_A_HEAD:
                keys.add(skey)
            self._seen[digest] = keys
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
