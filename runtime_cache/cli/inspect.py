"""Looking at a cache's entries without changing them: ``ls``, ``show`` and ``stats``.

Each handler takes the parsed arguments and a
:class:`~runtime_cache.cli.context.CommandContext` and returns an exit code:
0 ok, 1 problems found (here: entries skipped as corrupt or unreadable, a
missing key, a bad signature).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from typing import Any

from ..errors import CorruptEntryError, SignatureError
from ..stats import EntryInfo, jsonable
from .context import (
    CommandContext,
    Handler,
    KeyNotFound,
    Skipped,
    UsageError,
    binary_stdout,
    resolve_key,
    strict_json,
)
from .fmt import (
    clean,
    count,
    human_age,
    human_seconds,
    human_size,
    iso_time,
    render_table,
    short_device,
    short_key,
    signed_line,
)
from .output import is_stdout, link_replaced, replace_file, write_all, write_text

__all__ = ["SORTS", "SOURCES", "add_parsers", "cmd_ls", "cmd_show", "cmd_stats", "group_stats"]

AddCommand = Callable[[str, Handler, str, Sequence[str]], argparse.ArgumentParser]

# sort name -> (sort key, largest first)
SORTS: dict[str, tuple[Callable[[EntryInfo], Any], bool]] = {
    "key": (lambda i: i.key, False),
    "size": (lambda i: (i.size, i.stored_size), True),  # the SIZE column: the value's
    "age": (lambda i: i.created_at, False),
    "build": (lambda i: i.build_seconds, True),
    "hits": (lambda i: -1 if i.hits is None else i.hits, True),
    "last": (lambda i: 0.0 if i.last_access is None else i.last_access, True),
}

SOURCES = {
    "entries": "the backend listing",
    "bytes": "stored sizes from the backend listing (framing included)",
    "hits": "the backend, across processes (null where the backend does not count hits)",
    "misses": "not stored by backends; counted as one first-build miss per stored entry",
    "hit_rate": "hits / (hits + misses), with misses counted as above",
    "build_seconds": "sum of the build time stored in each entry",
    "seconds_saved": "sum over entries of hits x build time",
    "skipped": "entries left out as corrupt or unreadable (see `runtime-cache verify`)",
}

_INFO_FIELDS = tuple(f.name for f in fields(EntryInfo))


def filters(parser: argparse.ArgumentParser) -> None:
    """Add ``--runtime``, ``--purpose`` and ``--module``."""
    parser.add_argument("--runtime", help="only entries of this runtime, e.g. opencl")
    parser.add_argument("--purpose", help="only entries of this purpose, e.g. program-binary")
    parser.add_argument("--module", help="only entries of this module id")


def add_json(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def add_parsers(add: AddCommand) -> None:
    """Register ``ls``, ``show`` and ``stats``."""
    ls = add(
        "ls",
        cmd_ls,
        "List entries as a table: key, runtime, purpose, module, device, "
        "size, age, build time, hits, last use. Exit code 1 when entries were skipped as "
        "corrupt or unreadable.",
        [
            "runtime-cache ls --runtime opencl --sort size",
            "runtime-cache ls --module resnet18@3f2a --full-keys",
            "runtime-cache ls --json > entries.json",
        ],
    )
    filters(ls)
    ls.set_defaults(reads_only=True)
    ls.add_argument(
        "--sort",
        choices=sorted(SORTS),
        default="key",
        help="order: key (A-Z, the default), size (largest first), age (oldest first), build "
        "(slowest first), hits (most first), last (most recently used first)",
    )
    ls.add_argument("--reverse", action="store_true", help="reverse the order")
    ls.add_argument("--full-keys", action="store_true", help="show whole keys, not short digests")
    add_json(ls)

    show = add(
        "show",
        cmd_show,
        "Show one entry's key parts and metadata (never its value); with a secret, "
        "also check its signature.",
        [
            "runtime-cache show 3f2a91c0d4e5",
            'runtime-cache --secret "$APP_SECRET" show 3f2a91c0d4e5',
            "runtime-cache show 3f2a91c0d4e5 --raw kernel.bin",
        ],
    )
    show.set_defaults(reads_only=True, check=_show_check)
    show.add_argument(
        "key",
        metavar="KEY",
        help="a whole key, a unique prefix of one, or of its digest as ls shows it",
    )
    show.add_argument(
        "--raw",
        metavar="FILE",
        help="also write the entry's value to FILE; with -, only the value, to standard output",
    )
    add_json(show)

    stats = add(
        "stats",
        cmd_stats,
        "Entries, bytes, hits, hit rate and seconds saved, overall and per runtime and "
        "purpose. Exit code 1 when entries were skipped as corrupt or unreadable.",
        [
            "runtime-cache stats",
            "runtime-cache stats --runtime opencl --json",
            "runtime-cache --secret-file ~/.rc-secret --cache redis://cache-host:6379/0 stats",
        ],
    )
    stats.set_defaults(reads_only=True)
    filters(stats)
    add_json(stats)


def cmd_ls(args: argparse.Namespace, ctx: CommandContext) -> int:
    """List entries (no values read); ``--json`` prints entries and what was skipped."""
    skipped = Skipped()
    infos = list(ctx.cache.entries(args.runtime, args.purpose, args.module, on_skip=skipped))
    infos.sort(key=lambda i: i.key)
    keyfunc, descending = SORTS[args.sort]
    infos.sort(key=keyfunc, reverse=descending != args.reverse)
    code = 1 if skipped else 0
    if args.json:
        # One compact json.dumps call runs in C: 10,000 entries take milliseconds.
        found = [{name: getattr(info, name) for name in _INFO_FIELDS} for info in infos]
        listing = {
            "entries": found,
            "skipped": len(skipped),
            "skipped_entries": skipped.as_json(),
            "signed": ctx.cache.signed,
            "unsigned": _unsigned(infos),
        }
        ctx.emitted = True  # (its own writer: one compact line)
        write_text(ctx.out, strict_json(listing, default=_json_default) + "\n")
        return code
    if not infos:
        print("no entries", file=ctx.out)
    else:
        headers = ["KEY", "RUNTIME", "PURPOSE", "MODULE", "DEVICE", "SIZE", "AGE", "BUILD"]
        rows = [
            [
                info.key if args.full_keys else short_key(info.key),
                info.runtime,
                info.purpose,
                _clip(clean(info.module_id), 32),
                short_device(info.device),
                human_size(info.size),
                human_age(ctx.now - info.created_at),
                human_seconds(info.build_seconds),
                "-" if info.hits is None else str(info.hits),
                "-" if info.last_access is None else human_age(ctx.now - info.last_access) + " ago",
            ]
            for info in infos
        ]
        table = render_table([*headers, "HITS", "USED"], rows, right=(5, 6, 7, 8, 9))
        print(table, file=ctx.out)
        total = sum(info.stored_size for info in infos)
        entries = count(len(infos), "entry", "entries")
        print(f"\n{entries}, {human_size(total)} stored", file=ctx.out)
    print(signed_line(ctx.cache.signed, _unsigned(infos)), file=ctx.out)
    skipped.report(ctx)
    return code


def _unsigned(infos: list[EntryInfo]) -> int:
    """How many of ``infos`` carry no signature (their header says so; nothing is verified)."""
    return sum(not info.signed for info in infos)


def _json_default(value: Any) -> Any:
    """What ``json`` cannot encode itself: bytes as hex, mappings and sets as plain JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return jsonable(dict(value)) if hasattr(value, "items") else str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _signature(ctx: CommandContext, skey: str, flag: bool) -> tuple[str, str, bool]:
    """The signature row of ``show``: (label, value, whether it is good)."""
    if not ctx.cache.signed:
        return "signature flag", "set (not checked: no secret)" if flag else "not set", True
    blob = ctx.cache.backend.peek(skey)
    if blob is None:
        return "signature", "not checked: the entry vanished", False
    try:
        ctx.cache.decode(skey, blob)
    except SignatureError as exc:
        return "signature", f"BAD: {exc}", False
    except CorruptEntryError as exc:
        return "signature", f"not checked, the entry is corrupt: {exc}", False
    return "signature", "valid (checked with the secret)", True


def cmd_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Show one entry's parts and metadata; ``--raw FILE`` also writes its checked value.

    With a secret the signature is verified; exit code 1 when it is bad.
    """
    try:
        skey = resolve_key(ctx.cache, args.key)
        info = ctx.cache.info(skey)
    except KeyNotFound:
        info, skey = None, args.key
    except CorruptEntryError as exc:
        return ctx.fail(f"{args.key}: corrupt entry: {exc}")
    if info is None:
        return ctx.fail(f"no entry {skey}")
    label, verdict, good = _signature(ctx, skey, info.signed)
    if args.raw:
        code = _write_raw(ctx, skey, args.raw)
        if code or is_stdout(args.raw):  # the value went to standard output, alone
            return code
    if args.json:
        checked = ctx.cache.signed
        ctx.emit_json({**info.as_dict(), "signature_valid": good if checked else None})
        return 0 if good else 1
    rows = [
        ("key", info.key),
        ("runtime", info.runtime),
        ("purpose", info.purpose),
        ("module", info.module_id),
        ("device", short_device(info.device, width=80)),
        ("size", f"{human_size(info.size)} (stored {human_size(info.stored_size)})"),
        ("created", f"{iso_time(info.created_at)} ({human_age(ctx.now - info.created_at)} ago)"),
        ("build time", human_seconds(info.build_seconds)),
        ("producer", info.producer),
        (label, verdict),
        ("hits", "-" if info.hits is None else str(info.hits)),
        ("last used", iso_time(info.last_access)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {clean(value)}", file=ctx.out)
    for title, mapping in (("parts", info.parts), ("extra", info.extra)):
        if mapping:
            print(f"{title}:", file=ctx.out)
            for name in sorted(mapping, key=str):
                print(f"  {clean(name)}: {json.dumps(jsonable(mapping[name]))}", file=ctx.out)
    return 0 if good else 1


def _show_check(args: argparse.Namespace) -> None:
    if args.raw == "":  # (an unset variable in a script: `--raw "$OUT"` wrote nothing, exit 0)
        raise UsageError("--raw needs a file name (or - for standard output), not ''")
    if args.raw is not None and is_stdout(args.raw) and args.json:
        raise UsageError("--raw - and --json both write to standard output: give one")


def _write_raw(ctx: CommandContext, skey: str, path: str) -> int:
    blob = ctx.cache.backend.peek(skey)
    if blob is None:
        return ctx.fail(f"{skey} vanished")
    try:
        entry = ctx.cache.decode(skey, blob)
    except CorruptEntryError as exc:
        return ctx.fail(f"{skey}: not written, the entry is bad: {exc}")
    if is_stdout(path):  # (/dev/stdout, or the file it was sent to: never truncated)
        stream = binary_stdout()
        write_all(stream, entry.value)
        stream.flush()
        return 0
    try:  # as export writes a bundle: a link or a FIFO another user planted is not followed
        replaced = replace_file(path, entry.value)
    except OSError as exc:
        return ctx.fail(f"cannot write {clean(path)}: {exc.strerror or exc}")
    if replaced:
        print(link_replaced(path, replaced), file=ctx.err)
    print(f"wrote {human_size(len(entry.value))} to {clean(path)}", file=ctx.err)
    return 0


def group_stats(infos: Iterable[EntryInfo]) -> dict[str, Any]:
    """Entries, bytes, hits, misses, hit rate, build and saved seconds of ``infos``."""
    entries = total = hits = 0
    build = saved = 0.0
    counted = False
    for info in infos:
        entries += 1
        total += info.stored_size
        build += info.build_seconds
        if info.hits is not None:
            counted = True
            hits += info.hits
            saved += info.hits * info.build_seconds
    lookups = hits + entries
    return {
        "entries": entries,
        "bytes": total,
        "hits": hits if counted else None,
        "misses": entries,
        "hit_rate": (hits / lookups if lookups else 0.0) if counted else None,
        "build_seconds": build,
        "seconds_saved": saved if counted else None,
    }


def cmd_stats(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Totals overall and per runtime and purpose, from what the backend keeps."""
    skipped = Skipped()
    infos = list(ctx.cache.entries(args.runtime, args.purpose, args.module, on_skip=skipped))
    groups: dict[tuple[str, str], list[EntryInfo]] = {}
    for info in infos:
        groups.setdefault((info.runtime, info.purpose), []).append(info)
    per = [
        {"runtime": rt, "purpose": pp, **group_stats(items)}
        for (rt, pp), items in sorted(groups.items())
    ]
    overall = {**group_stats(infos), "skipped": len(skipped), "unsigned": _unsigned(infos)}
    code = 1 if skipped else 0
    if args.json:
        ctx.emit_json(
            {"overall": overall, "groups": per, "sources": SOURCES, "signed": ctx.cache.signed}
        )
        return code

    def row(label: tuple[str, str], s: dict[str, Any]) -> list[str]:
        rate = s["hit_rate"]
        return [
            *label,
            str(s["entries"]),
            human_size(s["bytes"]),
            "-" if s["hits"] is None else str(s["hits"]),
            str(s["misses"]),
            "-" if rate is None else f"{rate:.1%}",
            human_seconds(s["build_seconds"]),
            human_seconds(s["seconds_saved"]),
        ]

    headers = ["RUNTIME", "PURPOSE", "ENTRIES", "STORED", "HITS", "MISSES", "HIT RATE", "BUILD"]
    rows = [row((g["runtime"], g["purpose"]), g) for g in per] + [row(("total", ""), overall)]
    print(render_table([*headers, "SAVED"], rows, right=range(2, 9)), file=ctx.out)
    print(
        "\nstored: bytes in the store, each entry's framing included (ls SIZE is the value's)\n"
        "hits:   kept by the backend across processes ('-' where it keeps none)\n"
        "misses: one first-build miss per stored entry (backends keep no misses;\n"
        "        Cache.stats() in your app counts them per process)\n"
        "saved:  hits x build time",
        file=ctx.out,
    )
    print(signed_line(ctx.cache.signed, overall["unsigned"]), file=ctx.out)
    skipped.report(ctx)
    return code
