"""The text ``runtime-cache prune`` prints (its ``--json`` is the report itself): what it
removed and kept on the output, and on the error stream what it could not remove or read
and the cap left unmet."""

from __future__ import annotations

from ..pruning import FUTURE, PruneReport
from .context import CommandContext
from .fmt import clean, count, human_size

__all__ = ["print_prune_report"]


def print_prune_report(report: PruneReport, ctx: CommandContext) -> None:
    """Print ``report`` as text to ``ctx.out`` and ``ctx.err``."""
    if report.dry_run:
        print(
            f"would remove {count(report.removed, 'entry', 'entries')} "
            f"({human_size(report.freed)}); "
            f"{count(report.remaining, 'entry', 'entries')} would remain "
            f"({human_size(report.remaining_bytes)}); nothing was removed (--dry-run)",
            file=ctx.out,
        )
        for key in report.would_remove[:10]:
            print(f"  {clean(key)}", file=ctx.out)
        if len(report.would_remove) > 10:
            print(f"  and {len(report.would_remove) - 10} more (--json lists all)", file=ctx.out)
    else:
        print(
            f"removed {count(report.removed, 'entry', 'entries')} ({human_size(report.freed)}); "
            f"{count(report.remaining, 'entry remains', 'entries remain')} "
            f"({human_size(report.remaining_bytes)})",
            file=ctx.out,
        )
    if report.leftovers:
        leftovers = count(report.leftovers, "stale temporary file", "stale temporary files")
        print(f"also removed {leftovers}", file=ctx.out)
    if report.changed:
        kept = count(len(report.changed), "entry", "entries")
        print(f"kept {kept} written or used during the prune", file=ctx.out)
    for key, reason in report.failed[:5]:
        print(f"runtime-cache: not removed: {clean(key)}: {clean(reason)}", file=ctx.err)
    if len(report.failed) > 5:
        print(f"runtime-cache: {len(report.failed) - 5} more not removed", file=ctx.err)
    _say_what_stays(report, ctx)


def _say_what_stays(report: PruneReport, ctx: CommandContext) -> None:
    """The entries prune could not remove or read, and the cap left unmet, on stderr."""
    if report.stopped:
        print(
            f"runtime-cache: the store stopped answering ({clean(report.stopped)}): what "
            "prune removed by then is counted above (prune again once it is back)",
            file=ctx.err,
        )
    if report.elsewhere:
        tiers = ", ".join(sorted({clean(named) for _, named in report.elsewhere}))
        print(
            f"runtime-cache: {count(len(report.elsewhere), 'entry', 'entries')} removed "
            f"(counted above) may live on in {tiers}, which "
            "could not be reached: prune again once it is back",
            file=ctx.err,
        )
    if report.stuck:
        line = (
            f"runtime-cache: {count(report.stuck, 'entry', 'entries')} "
            f"({human_size(report.stuck_bytes)}) cannot be removed (an immutable file or "
            "folder, a read-only mount, a permission): kept"
        )
        if report.over_cap:
            line += f"; still {human_size(report.over_cap)} over --max-size"
        if report.kept_the_rest and report.remaining > report.stuck:
            line += "; the others were kept too, since removing them could not meet it"
        print(line, file=ctx.err)
    elif report.over_cap and report.stopped:
        print(f"runtime-cache: still {human_size(report.over_cap)} over --max-size", file=ctx.err)
    elif report.over_cap:  # (written meanwhile)
        print(
            f"runtime-cache: still {human_size(report.over_cap)} over --max-size: entries "
            "written or used while prune ran were kept (a later prune weighs them again)",
            file=ctx.err,
        )
    if report.corrupt:
        print(
            f"runtime-cache: found {count(len(report.corrupt), 'corrupt entry', 'corrupt entries')}"
            ": counted at their stored size, and the first to go for size (`runtime-cache "
            "verify --repair` removes them all)",
            file=ctx.err,
        )
    future = sum(why == FUTURE for _, why in report.untrusted)
    if len(report.untrusted) > future:
        print(
            f"runtime-cache: found {count(len(report.untrusted) - future, 'entry', 'entries')}"
            " unsigned while this cache has a secret (no reader of it serves them): the first "
            "to go for size after corrupt ones",
            file=ctx.err,
        )
    if future:
        print(
            f"runtime-cache: found {count(future, 'entry', 'entries')} dated more than a day "
            "in the future (a writer's clock ahead, or a time set by hand: their age cannot "
            "be told): the first to go for size after corrupt ones, and for any --older-than",
            file=ctx.err,
        )
    if report.skipped:
        print(
            f"runtime-cache: skipped {count(len(report.skipped), 'entry', 'entries')} "
            "unreadable here (or in a newer format, or over this cache's limits): not weighed "
            "(see `runtime-cache verify`)",
            file=ctx.err,
        )
        for key, reason in report.skipped[:5]:
            print(f"  {clean(key)}: {clean(reason)}", file=ctx.err)
