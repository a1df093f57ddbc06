"""Spans: how the front tells a backend where the part it wants of a value lies.

:meth:`~runtime_cache.api.Backend.get_parts` passes a value's first bytes (its head) to a
span, which answers where the part the caller wants as its own ``bytes`` lies. These live
here, apart from the backend contract, and :mod:`runtime_cache.api` exports them.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = [
    "SPAN_HEAD",
    "HeadOnly",
    "Span",
    "blob_tail",
    "frames_blobs",
    "framing_span",
    "head_only",
]

#: ``span(head) -> (start, end) | None``: see :meth:`~runtime_cache.api.Backend.get_parts`.
Span = Callable[[bytes], "tuple[int, int] | None"]
#: The fewest bytes :meth:`~runtime_cache.api.Backend.get_parts` passes to ``span`` (all
#: of a shorter value).
SPAN_HEAD = 4096


def framing_span(span: Span, tail: Callable[[bytes], int | None] | None = None) -> Span:
    """Mark ``span`` as one that knows its blobs' whole framing (the front's entries): where
    it finds no blob in a head (``None``), or one that ends past the value or more than
    :data:`SPAN_HEAD` bytes before its end, the value is no blob its caller can use, and a
    backend may take it for junk without reading the rest (:func:`frames_blobs`). Another
    span's ``None`` still asks for the whole value. ``tail(head)``, when given, is exactly
    how many bytes follow the value in such a blob (``None``: not known), so a blob of
    another size is junk too (:func:`blob_tail`)."""
    setattr(span, "_frames_blobs", True)  # noqa: B010 (an attribute of a function)
    if tail is not None:
        setattr(span, "_blob_tail", tail)  # noqa: B010
    return span


def blob_tail(span: Span, head: bytes) -> int | None:
    """How many bytes follow the value in the blob ``head`` begins, as the framing span
    ``span`` says (:func:`framing_span`'s ``tail``); ``None`` where it says nothing."""
    tail = getattr(span, "_blob_tail", None)
    return None if tail is None else tail(head)


class HeadOnly(tuple[int, int]):
    """A framing span's answer for a blob its caller will not use and that stays stored.

    It is ``(start, end)``, where the value lies, like any answer, and it adds: the head
    alone tells the caller (the front) that it refuses this blob and keeps it, as it
    keeps an entry of a newer format or one this reader rejects. A backend that reads
    files may then return the head it passed to the span, alone, as ``(head, b"")`` (two
    pieces, the second empty: the one shape no value is read in), once the checks a
    framing span asks for passed, and must not copy that head anywhere (a tier that copies
    values up). Any other backend reads as for any span.
    """

    __slots__ = ()


def head_only(pieces: tuple[bytes | bytearray | memoryview, ...]) -> bool:
    """Whether ``pieces`` (as :meth:`~runtime_cache.api.Backend.get_parts` returns them)
    are a head returned alone for a :class:`HeadOnly` answer: ``(head, b"")``, the head
    :data:`SPAN_HEAD` bytes long."""
    return len(pieces) == 2 and not pieces[1] and len(pieces[0]) == SPAN_HEAD


def frames_blobs(span: Span) -> bool:
    """Whether ``span`` was marked by :func:`framing_span`."""
    return getattr(span, "_frames_blobs", False) is True
