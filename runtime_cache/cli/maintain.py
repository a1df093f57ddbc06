"""Changing a cache: ``rm``, ``clear``, ``prune`` and ``verify``.

Each handler takes the parsed arguments and a
:class:`~runtime_cache.cli.context.CommandContext` and returns an exit code (0
ok, 1 problems found); usage problems raise ``UsageError`` (exit code 2).
Names the backend lists but cannot take as keys (a stray ``82 copy.rce`` in a
folder) are skipped and reported, never fatal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict

from ..errors import (
    BackendUnavailableError,
    InvalidKeyError,
    PartialDeleteError,
    RuntimeCacheError,
)
from ..maintenance import prune, verify
from ..units import parse_duration, parse_size
from .context import CommandContext, Handler, KeyNotFound, UsageError, resolve_key
from .fmt import Progress, clean, count, store_name
from .inspect import add_json
from .prune_text import print_prune_report

__all__ = ["add_parsers", "cmd_clear", "cmd_prune", "cmd_rm", "cmd_verify"]

AddCommand = Callable[[str, Handler, str, Sequence[str]], argparse.ArgumentParser]


def _with_unit(text: str, examples: str) -> str:
    # A unit, but for zero ("--older-than 3", meant as days, removed all but 3 s' worth).
    number = text.strip().replace(".", "", 1)
    if number.isdigit() and number.strip("0"):
        raise argparse.ArgumentTypeError(f"{text!r} has no unit: write {examples}")
    return text


def _size(text: str) -> int:
    number = text.strip().replace(".", "", 1)
    if number and not number.strip("0"):  # a bare zero: in a cache's URL, no cap
        raise argparse.ArgumentTypeError(
            f"{text!r} would remove every entry (a max_size of 0 in a cache's URL means no "
            "cap): write 0B to mean it, or use clear"
        )
    try:
        return parse_size(_with_unit(text, "500MB, 2GiB or 4096B"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(_with_unit(text, "30d, 12h, 90m or 45s"))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parsers(add: AddCommand) -> None:
    """Register ``rm``, ``clear``, ``prune`` and ``verify``."""
    rm = add(
        "rm",
        cmd_rm,
        "Remove entries by key (exit code 1 if any is missing or could not be removed).",
        [
            "runtime-cache rm 3f2a91c0d4e5",
            "runtime-cache rm opencl/tuning/77b0 9c1d --json",
        ],
    )
    rm.add_argument("keys", nargs="+", metavar="KEY", help="whole keys or unique digest prefixes")
    rm.set_defaults(removes_only=True)
    add_json(rm)

    clear = add(
        "clear",
        cmd_clear,
        "Remove every entry (asks first unless --yes).",
        [
            "runtime-cache clear",
            "runtime-cache --cache dir:///var/cache/app clear --yes --json",
        ],
    )
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    clear.set_defaults(removes_only=True)
    add_json(clear)

    prune_cmd = add(
        "prune",
        cmd_prune,
        "Remove entries unused for a while, then least recently "
        "used ones until the cache fits a size (--older-than, --max-size: at least one is "
        "needed); stale temporary files go too. Exit code 1 when some could not be removed "
        "(an immutable file, a permission; where those alone exceed the size, the rest is "
        "kept), a tier that is down may still hold some it removed from the others, or the "
        "store stopped answering midway (what was removed by then is reported). An "
        "entry written again, or used (where the store keeps uses: dir://, memory://), "
        "while prune runs is kept, and counted as kept, not removed.",
        [
            "runtime-cache prune --older-than 30d",
            "runtime-cache prune --max-size 500MB --dry-run",
            "runtime-cache prune --max-size 2GiB --older-than 12h --json",
        ],
    )
    prune_cmd.add_argument(
        "--max-size",
        type=_size,
        metavar="SIZE",
        help="e.g. 500MB or 2GiB (a unit is needed); entries' stored sizes, as ls sums them "
        "(a dir:// cache's own max_size counts the disk blocks its files take, which is more)",
    )
    prune_cmd.add_argument(
        "--older-than",
        type=_duration,
        metavar="AGE",
        help="e.g. 30d, 12h, 90m (a unit is needed, but for 0: every entry)",
    )
    prune_cmd.add_argument(
        "--dry-run",
        action="store_true",
        help="remove nothing: say what would be removed and what would remain",
    )
    prune_cmd.set_defaults(removes_only=True, check=_prune_check)
    add_json(prune_cmd)

    verify_cmd = add(
        "verify",
        cmd_verify,
        "Check every entry's checksum, key and (with a secret) "
        "signature; exit code 1 when bad ones are found, or the store stopped answering "
        "midway (what was found and removed by then is reported).",
        [
            "runtime-cache verify",
            'runtime-cache --secret "$APP_SECRET" verify --json',
            "runtime-cache verify --repair",
        ],
    )
    verify_cmd.add_argument("--repair", action="store_true", help="remove the bad entries")
    verify_cmd.set_defaults(reads_only=True)  # --repair only removes
    add_json(verify_cmd)


def cmd_rm(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove entries; exit code 1 when any key was not there or could not be removed.

    Every argument is resolved before anything is removed, so an ambiguous
    prefix (a usage error) removes nothing.
    """
    resolved: list[tuple[str, str]] = []
    for text in args.keys:
        try:
            resolved.append((text, resolve_key(ctx.cache, text)))
        except KeyNotFound:
            resolved.append((text, ""))
    removed: list[str] = []
    missing: list[str] = []
    failed: list[tuple[str, str]] = []
    for text, skey in resolved:
        try:
            gone = bool(skey) and ctx.cache.delete(skey)
        except InvalidKeyError:
            gone = False
        except BackendUnavailableError:
            raise  # the whole store is down: said once
        except RuntimeCacheError as exc:  # (a tier that kept it): the other keys go on
            failed.append((skey, _not_removed(exc)))
            if not args.json:
                print(f"runtime-cache: {clean(_not_removed(exc))}: {clean(skey)}", file=ctx.err)
            continue
        if gone:
            removed.append(skey)
            if not args.json:
                print(f"removed {clean(skey)}", file=ctx.out)
        else:
            missing.append(text)
            if not args.json:
                print(f"runtime-cache: no entry {clean(text)}", file=ctx.err)
    if args.json:
        ctx.emit_json(
            {
                "removed": removed,
                "missing": missing,
                "failed": [{"key": k, "reason": r} for k, r in failed],
            }
        )
    return 1 if missing or failed else 0


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def cmd_clear(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove every entry, after a yes on the terminal or with ``--yes``.

    Names that are no valid key, or that cannot be removed, are skipped and
    reported (exit code 1); the rest are removed.
    """
    keys = list(ctx.cache.backend.keys(""))
    if not keys:
        if args.json:
            ctx.emit_json({"removed": 0, "skipped": []})
        else:
            print("the cache is empty", file=ctx.out)
        return 0
    if not args.yes:
        if not _stdin_is_terminal():
            raise UsageError("refusing to clear without --yes: there is no terminal to ask")
        where = store_name(ctx.cache.backend)
        ctx.err.write(f"Remove all {len(keys)} entries from {where}? [y/N] ")
        ctx.err.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("aborted; nothing removed", file=ctx.err)
            ctx.json_error("aborted; nothing removed", 1)
            return 1
    removed = partly = 0
    skipped: list[tuple[str, str]] = []
    for key in keys:
        try:
            removed += ctx.cache.delete(key)
        except BackendUnavailableError as exc:  # the rest is left: say what was done
            done = f"removed {removed} of {len(keys)} before"
            raise BackendUnavailableError(f"{exc} ({done})") from exc
        except InvalidKeyError as exc:
            skipped.append((key, f"not a cache key: {exc}"))
        except RuntimeCacheError as exc:
            skipped.append((key, _not_removed(exc)))
            partly += isinstance(exc, PartialDeleteError) and exc.removed
    if args.json:
        ctx.emit_json(
            {
                "removed": removed,
                "partly_removed": partly,
                "skipped": [{"key": k, "reason": r} for k, r in skipped],
            }
        )
    else:
        some = f", and {partly} from the tiers that could be reached" if partly else ""
        print(f"removed {count(removed, 'entry', 'entries')}{some}", file=ctx.out)
        _report_skipped(ctx, skipped)
    return 1 if skipped else 0


def _not_removed(exc: RuntimeCacheError) -> str:
    """Why an entry is not (wholly) removed: a delete that only down tiers failed removed it
    from the others, and says which still hold it."""
    if isinstance(exc, PartialDeleteError):
        why = exc.__cause__ or exc
        done = "removed, except from" if exc.removed else "in no tier reached; not looked for in"
        return f"{done} {', '.join(exc.failed)}, which could not be reached: {why}"
    return f"not removed: {exc}"


def _report_skipped(ctx: CommandContext, skipped: list[tuple[str, str]]) -> None:
    if skipped:
        print(f"runtime-cache: skipped {count(len(skipped), 'name', 'names')}:", file=ctx.err)
        for key, reason in skipped[:10]:  # (a store that went down: thousands)
            print(f"  {clean(key)}: {clean(reason)}", file=ctx.err)
        if len(skipped) > 10:
            print(f"  and {len(skipped) - 10} more (--json lists all)", file=ctx.err)


def _progress(ctx: CommandContext, label: str, args: argparse.Namespace) -> Progress:
    """A bar on the error stream, drawn only on a terminal and never with ``--json``."""
    return Progress(0, label, ctx.err, enabled=not args.json and ctx.is_terminal())


def _prune_check(args: argparse.Namespace) -> None:
    if args.max_size is None and args.older_than is None:
        raise UsageError("prune needs --max-size and/or --older-than")


def cmd_prune(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove entries unused for ``--older-than``, then LRU ones over ``--max-size``."""
    _prune_check(args)
    progress = _progress(ctx, "prune", args)
    try:
        report = prune(
            ctx.cache,
            max_size=args.max_size,
            older_than=args.older_than,
            now=ctx.now,
            on_progress=progress.at,
            dry_run=args.dry_run,
        )
    finally:
        progress.close()
    # Over the cap only for entries written or used while prune ran (a cache in use) is
    # no failure: a cron job would alert at most runs. Over it for entries that cannot go is.
    over_cap = report.over_cap and report.stuck
    trouble = report.failed or report.skipped or report.elsewhere or report.stopped
    code = 1 if trouble or over_cap else 0
    if args.json:
        ctx.emit_json(asdict(report))
        return code
    print_prune_report(report, ctx)
    return code


def cmd_verify(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Check every entry; exit code 1 when bad ones were found (removed with ``--repair``)."""
    progress = _progress(ctx, "verify", args)
    try:
        report = verify(ctx.cache, repair=args.repair, on_progress=progress.at)
    finally:
        progress.close()
    unsigned_cache = bool(report.unsigned) and report.unsigned == report.checked
    if args.json:
        ctx.emit_json(
            {
                "checked": report.checked,
                "bad": [{"key": k, "reason": r} for k, r in report.bad],
                "removed": report.removed,
                "unsigned": report.unsigned,
                "newer_format_kept": report.newer,
                "over_limit_kept": report.over_limit,
                "signature_failures_kept": report.signature_kept,
                "skipped": [{"key": k, "reason": r} for k, r in report.skipped],
                "ok": report.ok,
                "signatures_checked": ctx.cache.signed,
                "stopped": report.stopped,
            }
        )
        return 0 if report.ok else 1
    for skey, reason in report.bad:
        print(f"BAD  {clean(skey)}: {clean(reason)}", file=ctx.out)
    _report_skipped(ctx, report.skipped)
    signatures = "with signatures" if ctx.cache.signed else "no secret, signatures not checked"
    print(
        f"checked {count(report.checked, 'entry', 'entries')} ({signatures}): "
        f"{len(report.bad)} bad, "
        f"{report.removed} removed",
        file=ctx.out,
    )
    if report.stopped:
        print(
            f"runtime-cache: verify stopped: {clean(report.stopped)}: the rest was not checked",
            file=ctx.err,
        )
    if report.newer:
        print(
            f"kept {count(report.newer, 'entry', 'entries')} in a newer format (a newer "
            "version reads them)",
            file=ctx.out,
        )
    if report.over_limit:
        print(
            f"kept {count(report.over_limit, 'entry', 'entries')} larger than this reader's "
            "limits (a process with larger limits reads them)",
            file=ctx.out,
        )
    if report.signature_kept and unsigned_cache:
        print(
            "the cache is unsigned: it was filled without a secret, so --repair keeps its "
            "entries; check it without --secret, or fill it again with the secret set",
            file=ctx.out,
        )
    elif report.signature_kept:
        print(
            f"{count(report.signature_kept, 'entry fails its', 'entries fail their')} "
            "signature check and none verified with this secret: either the secret is wrong "
            "or every entry was forged, and --repair cannot tell, so it keeps them (with a "
            "wrong secret it would remove good entries); if the secret is right, "
            "`runtime-cache clear` removes them",
            file=ctx.out,
        )
    elif report.unsigned and not args.repair:
        print(
            f"{count(report.unsigned, 'entry is', 'entries are')} unsigned (stored without a "
            "secret): reads reject them, and --repair would delete them",
            file=ctx.out,
        )
    elif report.bad and not args.repair:
        print("run `runtime-cache verify --repair` to remove the bad entries", file=ctx.out)
    return 0 if report.ok else 1
