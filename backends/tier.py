"""One tier of a :class:`~runtime_cache.backends.tiered.TieredBackend` and its counts, what
a tier does with a write it failed (:meth:`Tier.unwritten`), and deletes across the tiers
(:func:`delete_in_tiers`).

A tier that cannot hold a key (:class:`~runtime_cache.errors.InvalidKeyError`: a ``dir://``
tier and a name another tier listed, ``a b`` or ``../x`` planted in Redis) holds no entry
under it: a read or a delete of that key skips it (:meth:`Tier.attempt`) and goes on to the
other tiers, and a write goes to the others (:meth:`Tier.write`); only where none of them
can hold the key is the error raised, as one store raises it (a caller's own bad key stays
refused). Before, every ``ls``, ``verify`` and ``clear`` of a ``dir://,redis://`` stack
failed on such names, for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

from runtime_cache.api import Backend, peek_head
from runtime_cache.errors import (
    BackendError,
    BackendUnavailableError,
    EntryTooLargeError,
    InvalidKeyError,
    PartialDeleteError,
    ReadOnlyBackendError,
)
from runtime_cache.failure_policy import FailurePolicy
from runtime_cache.fork_locks import renew_in_child

from .write_behind import WriteBehind

__all__ = [
    "PROMOTE",
    "PROMOTE_OVER",
    "Check",
    "Tier",
    "TierStats",
    "delete_in_tiers",
    "raise_if_all_failed",
    "raise_if_unwritten",
    "settle_unwritten",
]

T = TypeVar("T")
#: A cache's check of an entry (:func:`runtime_cache.trust.entrust`): whether it would serve it.
Check = Callable[[str, bytes], bool]


#: The write that copies a value found below into the tiers above it, only where such a
#: tier holds nothing (:meth:`Tier.copy_up`); ``promote-over`` replaces what is there.
PROMOTE = "promote"
PROMOTE_OVER = "promote-over"


@dataclass(frozen=True)
class TierStats:
    """What happened in one tier: errors absorbed, promotions, background writes, and
    entries its own (synchronous) writes failed to store while another tier took them:
    ``not_written``, and of those ``may_be_stale``, whose older copy it could not remove
    (a read-only folder), so it may serve that copy still."""

    backend: str
    remote: bool
    errors: int
    promoted: int
    queued_dropped: int
    queued_written: int
    queued_failed: int
    not_written: int = 0
    may_be_stale: int = 0


class Tier:
    """A backend in a tiered stack: its failure policy, promotions and write-behind queue.

    Args:
        backend: The tier's store.
        log: Where the policy logs the tier's failures and recoveries.
    """

    def __init__(self, backend: Backend, log: logging.Logger) -> None:
        self.backend = backend
        self.writer: WriteBehind | None = None
        # The counts below move from every thread that reads or writes through the stack:
        # ``+=`` on an attribute is a read and a store, and two threads lost counts.
        self._counts_lock = threading.Lock()
        renew_in_child(self, "_counts_lock")
        self.promoted = 0
        self.not_written = 0
        self.may_be_stale = 0
        self.policy = FailurePolicy(
            log, f"tier {backend!r}", "skipping it", recovered_level=logging.INFO
        )

    def attempt(
        self, op: str, call: Callable[[], T], errors: list[Exception], unheld: list[Exception]
    ) -> tuple[bool, T | None]:
        """``call()`` through this tier's policy (:meth:`FailurePolicy.attempt`), for a key
        another tier may have listed: where this tier cannot hold it (``InvalidKeyError``) it
        holds no entry under it, ``(False, None)``, and the error goes into ``unheld`` (for
        :func:`raise_if_all_failed`, which raises it where no tier had the key)."""
        try:
            return self.policy.attempt(op, call, errors)
        except InvalidKeyError as exc:
            unheld.append(exc)
            return False, None

    def write(
        self, op: str, items: Mapping[str, bytes], errors: list[Exception]
    ) -> tuple[bool, dict[str, Exception]]:
        """Write ``items`` into this tier through its policy: whether it took every one it
        can hold (a failure goes into ``errors``), and the keys it cannot hold, with why
        (``InvalidKeyError``: a ``dir://`` tier and a name Redis takes; left to the other
        tiers, as its reads leave them). A batch such a key stopped is written again a key
        at a time: the keys before it are written twice."""
        refused: list[Exception] = []
        if len(items) == 1:
            ((key, value),) = items.items()
            done, _ = self.attempt(op, partial(self.backend.set, key, value), errors, refused)
            return done or bool(refused), {key: refused[0]} if refused else {}
        done, _ = self.attempt(op, partial(self.backend.set_many, items), errors, refused)
        if not refused:
            return done, {}
        failed: list[Exception] = []  # (one in ``errors`` for the tier, as a batch's)
        unheld: dict[str, Exception] = {}
        for key, value in items.items():
            one: list[Exception] = []
            self.attempt(op, partial(self.backend.set, key, value), failed, one)
            if one:
                unheld[key] = one[0]
        errors.extend(failed[-1:])
        return not failed, unheld

    def stats(self) -> TierStats:
        """This tier's counts now."""
        writer = self.writer
        return TierStats(
            repr(self.backend),
            writer is not None,
            self.policy.errors,
            self.promoted,
            writer.dropped if writer else 0,
            writer.written if writer else 0,
            writer.failed if writer else 0,
            self.not_written,
            self.may_be_stale,
        )

    def unwritten(self, items: Mapping[str, bytes], error: Exception, drop: bool = True) -> None:
        """After this tier failed to write ``items`` (``error``) that another tier took:
        with ``drop`` (a tier below took them), remove the older copies it holds of the
        keys it did not take, so that a read falls through to the newer copy below rather
        than serve the older one from here. Counted in ``not_written``; those it could not
        remove, or kept (it may serve them still), in ``may_be_stale``. Runs only on a
        failure: a write that works costs nothing more.

        What it holds is told a key at a time by the first bytes of each value, as many as
        were written and one more: a large file held there (planted) is not read to tell it
        from the value written, and an older copy is read whole only to remove it, alone."""
        backend = self.backend
        try:  # what it holds now: a batch may have landed in part (a disk that filled)
            held: dict[str, bytes] | None = _heads(backend, items)
        except Exception:
            held = None  # unknown: each key is removed unchecked
        refused = error.refused if isinstance(error, EntryTooLargeError) else frozenset()
        if refused:  # the rest of the batch was written
            failed = [key for key in items if key in refused]
        elif held is not None:
            failed = [key for key in items if held.get(key) != items[key]]
        else:
            failed = list(items)
        # Only the copy seen here goes: one another process wrote since stays.
        older = [(key, None if held is None else held.get(key)) for key in failed]
        older = [(key, seen) for key, seen in older if held is None or seen is not None]
        if not drop:  # (the lowest tier that failed: its copy is what other machines read)
            self._count(len(failed), len(older))
            return
        kept = 0
        for index, (key, seen) in enumerate(older):
            try:
                if seen is None:
                    backend.delete(key)
                elif (now := backend.peek(key)) is not None and _still(seen, now, items[key]):
                    backend.delete_if(key, now)
            except (BackendUnavailableError, ReadOnlyBackendError):
                kept += len(older) - index  # the whole store: no use trying the rest
                break
            except Exception:
                kept += 1  # (an entry that cannot go: an immutable file)
        self._count(len(failed), kept)

    def count_promoted(self, count: int) -> None:
        """Count ``count`` entries copied up into this tier."""
        with self._counts_lock:
            self.promoted += count

    def copy_up(self, key: str, value: bytes, checks: Sequence[Check]) -> bool:
        """Copy ``value``, found in a slower tier, into this one where it holds nothing under
        ``key`` (:meth:`Backend.add`). Whether the tiers above may take it as well: not where
        this one holds an entry of its own, newer than the one read below (one that passes
        ``checks``, the caches' entry checks; any value where there are none). Anything
        else there, which the read took for none (junk, what this user cannot read, an
        entry that fails the checks), is replaced, as before ``add``."""
        ok, added = self.attempt(PROMOTE, partial(self.backend.add, key, value), [], [])
        if not ok or added:  # (failed, or cannot hold it: the tiers above may)
            self.count_promoted(int(bool(added)))
            return True
        try:
            held = self.backend.peek(key)  # (as a read takes it, not counted as a use)
        except Exception:
            held = None
        if held is not None and all(check(key, held) for check in checks):
            return False
        self.copy_over({key: value})
        return True

    def copy_over(self, items: Mapping[str, bytes]) -> None:
        """Copy ``items`` into this tier over what it holds (a copy the front refused there;
        a remote tier, through its queue), counting what it stored or queued."""
        if self.writer is not None:
            self.count_promoted(self.writer.put(items))
            return
        done, unheld = self.write(PROMOTE_OVER, items, [])
        self.count_promoted(len(items) - len(unheld) if done else 0)

    def count_unwritten(self, count: int) -> None:
        """Count ``count`` values another tier took and this one did not (its full queue
        dropped them), unread: each in ``not_written`` and ``may_be_stale``, as its older
        copy, if it holds one, is served once the tiers above lose theirs."""
        if count:
            self._count(count, count)

    def _count(self, not_written: int, may_be_stale: int) -> None:
        with self._counts_lock:
            self.not_written += not_written
            self.may_be_stale += may_be_stale


def settle_unwritten(
    tiers: Sequence[Tier],
    items: Mapping[str, bytes],
    took: Sequence[Tier],
    missed: Sequence[tuple[Tier, Exception]],
    unqueued: Sequence[tuple[Tier, int]],
    refused: Mapping[int, Mapping[str, Exception]],
) -> None:
    """After a write of ``items`` that the tiers in ``took`` took: count what the tiers in
    ``unqueued`` (remote ones, with how many their queues dropped) did not write, and have
    each tier in ``missed`` (that failed it) drop its older copies where a tier below took
    the values. ``refused`` holds, by ``id(tier)``, the keys each tier cannot hold."""
    for tier, dropped in unqueued:  # (unread: it is behind; counted as may-be)
        tier.count_unwritten(dropped)
    if not missed:
        return
    # A tier below took the new values: an older copy left in a tier above it that failed
    # would be served before them (a read-only or full folder over Redis served the old
    # entries after an import said "imported 3"). A tier with none below that took them
    # keeps its copy (the shared tier's, which other machines read).
    order = {id(tier): index for index, tier in enumerate(tiers)}
    lowest = max(order[id(tier)] for tier in took)
    for tier, error in missed:
        held = {k: v for k, v in items.items() if k not in refused[id(tier)]}
        tier.unwritten(held, error, drop=order[id(tier)] < lowest)


def _heads(backend: Backend, items: Mapping[str, bytes]) -> dict[str, bytes]:
    """The first bytes of what ``backend`` holds under each key of ``items`` (those it
    holds), as many as ``items`` holds there and one more: equal to that value only where
    the held one is; read a key at a time, as a look, not a use."""
    found = ((key, peek_head(backend, key, len(value) + 1)) for key, value in items.items())
    return {key: head for key, head in found if head is not None}


def _still(seen: bytes, now: bytes, written: bytes) -> bool:
    """Whether ``now`` is still the copy whose head was ``seen`` (``len(written) + 1`` bytes
    of it, or all of a shorter one)."""
    cut = len(written) + 1
    return now[:cut] == seen if len(seen) == cut else now == seen


def raise_if_all_failed(
    errors: list[Exception], tried: int, unheld: Sequence[Exception] = ()
) -> None:
    """Raise when each of the ``tried`` tiers failed (``errors``, one each) or could not
    hold the key (``unheld``: its ``InvalidKeyError``, one a tier): where none could hold
    it, the first refusal (the key is refused, as one store refuses it); else a value too
    large for every tier that could is :class:`EntryTooLargeError` (no outage), every tier
    down :class:`BackendUnavailableError`, and any other failure :class:`BackendError`. A
    tier that could hold the key and has none makes it a miss (a key ending in ``.rce``,
    held by Redis alone under ``dir://``)."""
    if unheld and len(unheld) >= tried:
        raise unheld[0]
    tried -= len(unheld)
    if errors and len(errors) >= tried:
        sized = [e for e in errors if isinstance(e, EntryTooLargeError)]
        if len(sized) == len(errors):  # no outage: a value too large for every tier
            refused = frozenset().union(*(e.refused for e in sized))
            raise EntryTooLargeError(f"every tier refused it: {errors[-1]}", refused)
        if all(isinstance(e, BackendUnavailableError) for e in errors):  # (down, all of them)
            raise BackendUnavailableError(
                f"every tier is unavailable; last error: {errors[-1]}"
            ) from errors[-1]
        raise BackendError(f"every tier failed; last error: {errors[-1]}") from errors[-1]


def raise_if_unwritten(
    asked: Sequence[Tier],
    items: Mapping[str, bytes],
    refused: Mapping[int, Mapping[str, Exception]],
    missed: Sequence[tuple[Tier, Exception]],
) -> None:
    """After a write of ``items`` to the ``asked`` tiers: raise for a key that some tiers
    cannot hold (``refused``, by ``id(tier)``) where every other one failed (``missed``) or
    none is left, as :func:`raise_if_all_failed` raises for a key no tier took. Counted as
    written by the tier that refused it, such a key was said stored, and the old value in
    the tier that failed served (or dropped, where a tier above took the rest)."""
    failed = {id(tier): error for tier, error in missed}
    for key in items:
        refusals = [keys[key] for keys in refused.values() if key in keys]
        if not refusals:
            continue
        able = [tier for tier in asked if key not in refused.get(id(tier), {})]
        if all(id(tier) in failed for tier in able):
            raise_if_all_failed(
                [failed[id(tier)] for tier in able], len(able) + len(refusals), refusals
            )


def delete_in_tiers(
    tiers: Sequence[Tier],
    key: str,
    remove: Callable[[Backend], bool],
    queued: Callable[[bytes], bool],
) -> bool:
    """Remove ``key`` from every tier with ``remove(backend)``; return whether any tier
    removed it. A write of it queued for a tier goes too where ``queued(value)`` says it is
    the one to remove; where not, the tier is left alone (the queued write replaces what it
    holds). After trying the rest: :class:`PartialDeleteError` when some tier was down (it
    may hold the entry still), :class:`BackendError` when one refused or every one failed. A
    tier that cannot hold ``key`` holds nothing to remove (:meth:`Tier.attempt`)."""
    removed = False
    errors: list[Exception] = []
    unheld: list[Exception] = []
    kept: list[str] = []
    for tier in tiers:
        writer = tier.writer
        one = partial(remove, tier.backend)
        if writer is not None:
            # Hold the writer's lock so a queued write cannot land after the delete.
            with writer.apply_lock:
                waiting = writer.lookup(key)
                if waiting is not None and not queued(waiting):
                    continue  # written again since: that write stays, and replaces this
                removed = writer.discard(key) | removed
                _, done = tier.attempt("delete", one, errors, unheld)
        else:
            _, done = tier.attempt("delete", one, errors, unheld)
        removed = bool(done) | removed
        if len(errors) > len(kept):
            kept.append(repr(tier.backend))
    raise_if_all_failed(errors, len(tiers), () if removed else unheld)
    if errors:  # "removed" would be untrue: the entry may live on in these tiers
        said = f"{len(errors)} of {len(tiers)} tiers could not remove {key!r}"
        said += f" ({', '.join(kept)}); last error: {errors[-1]}"
        down = all(isinstance(e, BackendUnavailableError) for e in errors)  # (not refused)
        error = PartialDeleteError(said, tuple(kept), removed) if down else BackendError(said)
        raise error from errors[-1]
    return removed
