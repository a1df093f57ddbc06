"""Reading through the tiers of a :class:`~runtime_cache.backends.tiered.TieredBackend`.

A key is looked for tier by tier, fastest first: in the writes queued for a tier, then in
the tier itself; a failing tier is skipped, its error kept for :func:`.tier.raise_if_all_failed`.
Values are carried as pieces (``tuple[bytes, ...]``): a read with a ``span`` asks each
tier for ``get_parts``/``get_many_parts``, so a tier that reads files applies what the span
says (``dir://`` takes a file that holds no entry for junk, unread), as it does when read on
its own. What is found below the first tier is handed to ``promote`` whole, to be copied up,
but a head a tier handed back alone (:class:`~runtime_cache.api.HeadOnly`). A tier that
cannot hold a key holds no entry under it (:meth:`.tier.Tier.attempt`): a batch it refuses
for one key is read there a key at a time, and a key no tier can hold raises its error
(one that some tier could hold and none has is a miss).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import TypeVar

from runtime_cache.api import Backend, Span, head_only
from runtime_cache.errors import PartialReadError
from runtime_cache.partial_reads import found_so_far

from .tier import Tier, raise_if_all_failed

__all__ = ["Pieces", "Promote", "first_answer", "read_many", "read_one", "whole"]

#: A value, as the pieces that join to it.
Pieces = tuple[bytes, ...]
#: ``promote(index, {key: value})``: copy what tier ``index`` held into the tiers above it.
Promote = Callable[[int, Mapping[str, bytes]], None]


T = TypeVar("T")


def first_answer(
    tiers: Sequence[Tier],
    key: str,
    op: str,
    queued: Callable[[bytes], T],
    ask: Callable[[Backend], T | None],
) -> T | None:
    """What the first tier that holds ``key`` answers: ``queued(value)`` of a write queued
    for it, else ``ask(backend)`` (not ``None``), the tiers that fail skipped; ``None``
    when no tier holds it (a read that looks, not a use: nothing is copied up)."""
    errors: list[Exception] = []
    unheld: list[Exception] = []  # (a tier that cannot hold the key: absent there)
    for tier in tiers:
        value = tier.writer.lookup(key) if tier.writer else None
        if value is not None:
            return queued(value)
        _, answer = tier.attempt(op, partial(ask, tier.backend), errors, unheld)
        if answer is not None:
            return answer
    raise_if_all_failed(errors, len(tiers), unheld)
    return None


def read_one(tiers: Sequence[Tier], key: str, span: Span | None, promote: Promote) -> Pieces | None:
    """``key``'s value from the first tier that holds it (``get_parts`` with ``span``, else
    ``get``), copied up; ``None`` when no tier does."""
    errors: list[Exception] = []
    unheld: list[Exception] = []
    for index, tier in enumerate(tiers):
        queued = tier.writer.lookup(key) if tier.writer else None
        found: Pieces | None = None if queued is None else (queued,)
        if found is None:
            if span is None:
                get = partial(tier.backend.get, key)
                ok, value = tier.attempt("get", get, errors, unheld)
                found = None if value is None else (value,)
            else:
                read = partial(tier.backend.get_parts, key, span)
                ok, found = tier.attempt("get", read, errors, unheld)
            if not ok:
                continue
        if found is not None:
            if index and not head_only(found):
                promote(index, {key: _whole(found)})
            return found
    raise_if_all_failed(errors, len(tiers), unheld)
    return None


def read_many(
    tiers: Sequence[Tier],
    keys: Iterable[str],
    promote: Promote,
    *,
    peek: bool = False,
    past: Mapping[str, bytes] | None = None,
    span: Span | None = None,
) -> dict[str, Pieces]:
    """The values of ``keys`` found through the tiers; a peek counts as no use and promotes
    nothing. A value equal to ``past[key]`` (refused by the front and still there: rejected,
    or its removal failed) is no find, so a good copy below is found and copied up over it.
    With ``span``, each tier is read in parts (``get_many_parts``)."""
    wanted = list(dict.fromkeys(keys))
    found: dict[str, Pieces] = {}
    errors: list[Exception] = []
    unheld: dict[str, list[Exception]] = {}  # keys a tier cannot hold: each one's refusal
    for index, tier in enumerate(tiers):
        missing = [k for k in wanted if k not in found]
        if not missing:
            break
        here: dict[str, Pieces] = {}
        if tier.writer is not None:
            for key in missing:
                queued = tier.writer.lookup(key)
                if queued is not None:
                    here[key] = (queued,)
            missing = [k for k in missing if k not in here]
        if missing:
            if span is not None:
                batch = partial(_parts_so_far, tier.backend.get_many_parts, span=span)
            else:
                read = tier.backend.peek_many if peek else tier.backend.get_many
                batch = partial(_whole_so_far, read)
            here.update(_held(tier, batch, missing, errors, unheld))
        if past is not None:  # (a head read alone is refused again: no find either)
            here = {
                k: v for k, v in here.items() if not head_only(v) and _whole(v) != bytes(past[k])
            }
        if not peek and index and here:
            up = {k: _whole(v) for k, v in here.items() if not head_only(v)}
            if up:
                promote(index, up)
        found.update(here)
    for key, refused in unheld.items():
        if key not in found and len(refused) == len(tiers):  # (no tier can hold it)
            raise refused[0]
    if not found:  # (tiers that can hold none of the keys are no failure of them)
        none_held = min((len(unheld.get(key, ())) for key in wanted), default=0)
        raise_if_all_failed(errors, len(tiers) - none_held)
    return found


def _held(
    tier: Tier,
    batch: Callable[[list[str]], dict[str, Pieces]],
    keys: list[str],
    errors: list[Exception],
    unheld: dict[str, list[Exception]],
) -> dict[str, Pieces]:
    """``batch(keys)`` from ``tier``; where it cannot hold one of them, ``keys`` a key at a
    time: those it cannot hold are absent there, noted in ``unheld``, the rest read. A
    failure counts one in ``errors``, as a batch's does."""
    refused: list[Exception] = []
    _, got = tier.attempt("get_many", partial(batch, keys), errors, refused)
    if not refused:
        return got or {}
    found: dict[str, Pieces] = {}
    failed: list[Exception] = []
    for key in keys:
        refused.clear()
        _, one = tier.attempt("get_many", partial(batch, [key]), failed, refused)
        found.update(one or {})
        if refused:
            unheld.setdefault(key, []).append(refused[0])
    errors.extend(failed[-1:])
    return found


def whole(found: Mapping[str, Pieces]) -> dict[str, bytes]:
    """``found`` with each value joined (one piece: as it is, no copy)."""
    return {key: _whole(pieces) for key, pieces in found.items()}


def _whole(pieces: Pieces) -> bytes:
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _parts_so_far(
    read: Callable[[list[str], Span], dict[str, Pieces]], keys: list[str], *, span: Span
) -> dict[str, Pieces]:
    # read(keys, span), or what it found when it failed on some keys only (the keys left
    # out are then the front's counted misses).
    try:
        return read(keys, span)
    except PartialReadError as exc:
        return {k: (v,) for k, v in exc.found.items()}


def _whole_so_far(
    read: Callable[[list[str]], dict[str, bytes]], keys: list[str]
) -> dict[str, Pieces]:
    return {k: (v,) for k, v in found_so_far(partial(read, keys)).items()}
