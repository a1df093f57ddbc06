"""What the tiers of a tiered store did not write during a command (``import``), and how
that is said.

A tier that did not take a value may still hold an older copy of its key. A local tier
removes that copy where it can, so reads find the new value in another tier; one it
could not remove (a read-only folder), and any in a remote tier whose background write
failed, may still be served. The report names each such tier, since the command's own
count ("imported 3") says only that some tier took the entries.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TextIO

from ..cache import Cache
from ..urls import IN_PROCESS_SCHEMES
from .fmt import clean
from .fmt import count as fmt_count

__all__ = [
    "IN_PROCESS",
    "PENDING",
    "TierCounts",
    "TierLosses",
    "durable_tiers",
    "say_losses",
    "tier_counts",
]

#: Per tier: (entries it did not write, of those the ones it may serve an older copy of).
TierCounts = dict[str, tuple[int, int]]

#: The name under which a tier's writes still queued when the command stopped waiting show.
PENDING = "(background writes still pending)"


#: What is said of a store, or the tiers of one, that nothing written to outlives the command.
IN_PROCESS = "lives in this command's process only (memory://)"


def durable_tiers(cache: Cache) -> set[str]:
    """The tiers of a tiered backend, named as :func:`tier_counts` names them, that outlive
    this process: all but the ``memory://`` ones. Empty for any other backend."""
    tiers = getattr(cache.backend, "tiers", None) or ()
    return {repr(t) for t in tiers if getattr(t, "scheme", "") not in IN_PROCESS_SCHEMES}


def tier_counts(cache: Cache) -> TierCounts:
    """Per tier of a tiered backend, the entries it failed to write so far, and of those the
    ones it may still serve an older copy of; empty for any other backend.

    A remote tier counts what its background writer failed or dropped (a failed batch is
    also one of the tier's ``errors``: not counted twice; said "4 operations" for 3
    entries); nothing removed an older copy there. A local tier counts what its own writes
    failed while another tier took them, and the older copies it could not remove."""
    stats = getattr(cache.backend, "tier_stats", None)
    if not callable(stats):
        return {}
    found: TierCounts = {}
    for s in stats():
        if s.remote:
            lost = s.queued_failed + s.queued_dropped
            found[s.backend] = (lost, lost)
        else:
            found[s.backend] = (s.not_written, s.may_be_stale)
    return found


@dataclass
class TierLosses:
    """What each tier did not write between two :func:`tier_counts`."""

    #: Per tier, the entries it did not write.
    not_written: dict[str, int] = field(default_factory=dict)
    #: Per tier, the entries of which it may still serve an older copy.
    may_serve_older: dict[str, int] = field(default_factory=dict)

    @classmethod
    def between(cls, before: TierCounts, after: TierCounts) -> TierLosses:
        """The counts of ``after`` less those of ``before``; tiers with none left out."""
        losses = cls()
        for tier, (lost, stale) in after.items():
            was_lost, was_stale = before.get(tier, (0, 0))
            if lost > was_lost:
                losses.not_written[tier] = lost - was_lost
            if stale > was_stale:
                losses.may_serve_older[tier] = stale - was_stale
        return losses


def say_losses(losses: TierLosses, out: TextIO, durable: Collection[str] | None = None) -> None:
    """One line per tier that did not write entries: how many, and whether it may still
    serve older copies of them. ``durable`` (:func:`durable_tiers`), where given: when no
    other tier is among them, the line says that the others (``memory://``) end with the
    command, so the entries are kept nowhere."""
    for tier, lost in losses.not_written.items():
        line = f"not written to the tier {clean(tier)}: {fmt_count(lost, 'entry', 'entries')}"
        stale = losses.may_serve_older.get(tier, 0)
        nowhere = tier != PENDING and durable is not None and not set(durable) - {tier}
        if stale:
            some = "them" if stale == lost else f"{stale} of them"
            line += f"; it may still serve older copies of {some}"
        elif tier != PENDING:
            line += "; any older copies there were removed"
            line += "" if nowhere else ": reads find the new ones in other tiers"
        if nowhere:
            line += f"; every other tier {IN_PROCESS}: once it exits, none of them is kept"
        print(line, file=out)
