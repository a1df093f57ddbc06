"""The listing and maintenance subcommands of ``runtime-cache``: ls, show, stats, rm, clear,
prune and verify. Each takes the parsed arguments and a :class:`CommandContext` and returns
an exit code (0 ok, 1 problems found); usage problems raise :class:`UsageError` (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, TextIO

from . import listing
from .api import Backend, StoredItem
from .cache import Cache
from .cli_format import (
    human_age,
    human_seconds,
    human_size,
    iso_time,
    render_table,
    short_device,
    short_key,
)
from .codec import decode_meta
from .errors import CorruptEntryError
from .maintenance import prune, verify
from .stats import EntryInfo

__all__ = [
    "SORTS",
    "CommandContext",
    "KeyNotFound",
    "UsageError",
    "cmd_clear",
    "cmd_ls",
    "cmd_prune",
    "cmd_rm",
    "cmd_show",
    "cmd_stats",
    "cmd_verify",
    "read_info",
    "reads_not_counted",
    "resolve_key",
]


class UsageError(Exception):
    """A command line that parses but cannot be run as given (exit code 2)."""


class KeyNotFound(LookupError):
    """No stored key matches what the user typed."""


@dataclass
class CommandContext:
    """What a subcommand works with: the cache, output streams, the secret and the clock."""

    cache: Cache
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    secret: str | None = None
    now: float = field(default_factory=time.time)

    def emit_json(self, value: Any) -> None:
        """Write ``value`` as JSON to the output stream."""
        json.dump(value, self.out, indent=2, sort_keys=False, default=str)
        self.out.write("\n")


# sort name -> (sort key, largest first)
SORTS: dict[str, tuple[Callable[[EntryInfo], Any], bool]] = {
    "key": (lambda i: i.key, False),
    "size": (lambda i: i.stored_size, True),
    "age": (lambda i: i.created_at, False),
    "build": (lambda i: i.build_seconds, True),
    "hits": (lambda i: -1 if i.hits is None else i.hits, True),
    "last": (lambda i: 0.0 if i.last_access is None else i.last_access, True),
}


_INFO_FIELDS = tuple(f.name for f in fields(EntryInfo))


def _json_default(value: Any) -> Any:
    """What ``json`` cannot encode itself: bytes as hex (as EntryInfo.as_dict does)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    return str(value)


@contextmanager
def reads_not_counted(backend: Backend) -> Iterator[None]:
    """Within the block, reads by maintenance (verify, export) are not counted as uses.

    A backend that tracks access on ``get`` through a ``track_access`` switch
    (the directory backend) has it turned off meanwhile, so exporting or
    verifying a cache neither adds hits nor makes every entry "recently used"
    for LRU pruning. Other backends are left as they are.
    """
    saved = getattr(backend, "track_access", None)
    if isinstance(saved, bool):
        backend.track_access = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if isinstance(saved, bool):
            backend.track_access = saved  # type: ignore[attr-defined]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_ls(args: argparse.Namespace, ctx: CommandContext) -> int:
    """List entries (no values read); ``--json`` prints a list of entry dicts."""
    infos = list(ctx.cache.entries(args.runtime, args.purpose, args.module))
    infos.sort(key=lambda i: i.key)
    keyfunc, descending = SORTS[args.sort]
    infos.sort(key=keyfunc, reverse=descending != args.reverse)
    if args.json:
        # One compact json.dumps call runs in C: 10,000 entries take milliseconds.
        found = [{name: getattr(info, name) for name in _INFO_FIELDS} for info in infos]
        ctx.out.write(json.dumps(found, default=_json_default) + "\n")
        return 0
    if not infos:
        print("no entries", file=ctx.out)
        return 0
    headers = ["KEY", "RUNTIME", "PURPOSE", "MODULE", "DEVICE", "SIZE", "AGE", "BUILD", "HITS"]
    headers.append("USED")
    rows: list[list[str]]
    rows = [
        [
            info.key if args.full_keys else short_key(info.key),
            info.runtime,
            info.purpose,
            _clip(info.module_id, 32),
            short_device(info.device),
            human_size(info.size),
            human_age(ctx.now - info.created_at),
            human_seconds(info.build_seconds),
            "-" if info.hits is None else str(info.hits),
            "-" if info.last_access is None else human_age(ctx.now - info.last_access) + " ago",
        ]
        for info in infos
    ]
    print(render_table(headers, rows, right=(5, 6, 7, 8, 9)), file=ctx.out)
    total = sum(info.stored_size for info in infos)
    print(f"\n{len(infos)} entries, {human_size(total)} stored", file=ctx.out)
    return 0


def resolve_key(cache: Cache, text: str) -> str:
    """Turn a whole key, or a unique prefix of a key's digest (as ``ls`` shows), into a key.

    Raises :class:`KeyNotFound` when nothing matches, :class:`UsageError` when
    the prefix is ambiguous.
    """
    text = text.strip()
    if not text:
        raise UsageError("an empty key")
    if text.count("/") >= 2:
        return text
    needle = text.lower()
    matches = [k for k in cache.backend.keys("") if k.rsplit("/", 1)[-1].startswith(needle)]
    if not matches:
        raise KeyNotFound(text)
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5])
        raise UsageError(f"{text!r} matches {len(matches)} keys ({shown}...); type more digits")
    return matches[0]


def read_info(cache: Cache, skey: str) -> tuple[EntryInfo, dict[str, Any]] | None:
    """Read one entry's metadata and extras from the head of its blob (never the value).

    Returns ``(info, extra)`` or ``None`` when the key is absent; raises
    :class:`CorruptEntryError` when the head does not decode.
    """
    backend = cache.backend
    stored = next((item for item in backend.scan(skey) if item.key == skey), None)
    try:
        info = listing.read_info(backend, stored or StoredItem(skey, 0), cache.limits)
    except KeyError:
        return None
    if info.key != skey:
        raise CorruptEntryError(f"entry stored under {skey!r} holds key {info.key!r}")
    head = backend.head(skey, listing.HEAD_SIZE) or b""
    meta, needed, _ = decode_meta(head, cache.limits)
    if not meta:  # metadata larger than the first read
        meta, _, _ = decode_meta(backend.head(skey, needed) or b"", cache.limits)
    if stored is None:  # the backend's listing missed it: report what the head says
        info = replace(info, stored_size=len(head))
    return info, dict(meta.get("x", {}))


def cmd_show(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Show one entry's parts and metadata; ``--raw FILE`` also writes its checked value."""
    try:
        skey = resolve_key(ctx.cache, args.key)
        found = read_info(ctx.cache, skey)
    except KeyNotFound:
        found = None
        skey = args.key
    except CorruptEntryError as exc:
        print(f"runtime-cache: {args.key}: corrupt entry: {exc}", file=ctx.err)
        return 1
    if found is None:
        print(f"runtime-cache: no entry {skey}", file=ctx.err)
        return 1
    info, extra = found
    if args.raw:
        code = _write_raw(ctx, skey, args.raw)
        if code:
            return code
    if args.json:
        ctx.emit_json({**info.as_dict(), "extra": _plain(extra)})
        return 0
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
        ("signed", "yes" if info.signed else "no"),
        ("hits", "-" if info.hits is None else str(info.hits)),
        ("last used", iso_time(info.last_access)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}", file=ctx.out)
    for title, mapping in (("parts", info.parts), ("extra", extra)):
        if mapping:
            print(f"{title}:", file=ctx.out)
            for name in sorted(mapping):
                print(f"  {name}: {json.dumps(_plain(mapping[name]))}", file=ctx.out)
    return 0


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return value


def _write_raw(ctx: CommandContext, skey: str, path: str) -> int:
    blob = ctx.cache.backend.get(skey)
    if blob is None:
        print(f"runtime-cache: {skey} vanished", file=ctx.err)
        return 1
    try:
        entry = ctx.cache.decode(skey, blob)
    except CorruptEntryError as exc:
        print(f"runtime-cache: {skey}: not written, the entry is bad: {exc}", file=ctx.err)
        return 1
    with open(path, "wb") as handle:
        handle.write(entry.value)
    print(f"wrote {human_size(len(entry.value))} to {path}", file=ctx.err)
    return 0


_SOURCES = {
    "entries": "the backend listing",
    "bytes": "stored sizes from the backend listing (framing included)",
    "hits": "the backend, across processes (null where the backend does not count hits)",
    "misses": "not stored by backends; counted as one first-build miss per stored entry",
    "hit_rate": "hits / (hits + misses), with misses counted as above",
    "build_seconds": "sum of the build time stored in each entry",
    "seconds_saved": "sum over entries of hits x build time",
}


def _group_stats(infos: Iterable[EntryInfo]) -> dict[str, Any]:
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
    infos = list(ctx.cache.entries(args.runtime, args.purpose, args.module))
    groups: dict[tuple[str, str], list[EntryInfo]] = {}
    for info in infos:
        groups.setdefault((info.runtime, info.purpose), []).append(info)
    per = [
        {"runtime": rt, "purpose": pp, **_group_stats(items)}
        for (rt, pp), items in sorted(groups.items())
    ]
    overall = _group_stats(infos)
    if args.json:
        ctx.emit_json({"overall": overall, "groups": per, "sources": _SOURCES})
        return 0

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

    headers = ["RUNTIME", "PURPOSE", "ENTRIES", "SIZE", "HITS", "MISSES", "HIT RATE", "BUILD"]
    rows = [row((g["runtime"], g["purpose"]), g) for g in per] + [row(("total", ""), overall)]
    print(render_table([*headers, "SAVED"], rows, right=range(2, 9)), file=ctx.out)
    print(
        "\nhits:   kept by the backend across processes ('-' where it keeps none)\n"
        "misses: one first-build miss per stored entry (backends keep no misses;\n"
        "        Cache.stats() in your app counts them per process)\n"
        "saved:  hits x build time",
        file=ctx.out,
    )
    return 0


def cmd_rm(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove entries; exit code 1 when any key was not there."""
    missing = 0
    for text in args.keys:
        try:
            skey = resolve_key(ctx.cache, text)
        except KeyNotFound:
            skey = ""
        if skey and ctx.cache.delete(skey):
            print(f"removed {skey}", file=ctx.out)
        else:
            missing += 1
            print(f"runtime-cache: no entry {text}", file=ctx.err)
    return 1 if missing else 0


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def cmd_clear(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove every entry, after a yes on the terminal or with ``--yes``."""
    keys = list(ctx.cache.backend.keys(""))
    if not keys:
        print("the cache is empty", file=ctx.out)
        return 0
    if not args.yes:
        if not _stdin_is_terminal():
            raise UsageError("refusing to clear without --yes: there is no terminal to ask")
        ctx.err.write(f"Remove all {len(keys)} entries from {ctx.cache.backend!r}? [y/N] ")
        ctx.err.flush()
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("aborted; nothing removed", file=ctx.err)
            return 1
    removed = sum(1 for key in keys if ctx.cache.delete(key))
    print(f"removed {removed} entries", file=ctx.out)
    return 0


def cmd_prune(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove entries unused for ``--older-than``, then LRU ones over ``--max-size``."""
    if args.max_size is None and args.older_than is None:
        raise UsageError("prune needs --max-size and/or --older-than")
    report = prune(ctx.cache, max_size=args.max_size, older_than=args.older_than, now=ctx.now)
    if args.json:
        ctx.emit_json(asdict(report))
        return 0
    print(
        f"removed {report.removed} entries ({human_size(report.freed)}); "
        f"{report.remaining} entries remain ({human_size(report.remaining_bytes)})",
        file=ctx.out,
    )
    if report.leftovers:
        print(f"also removed {report.leftovers} stale temp files", file=ctx.out)
    return 0


def cmd_verify(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Check every entry; exit code 1 when bad ones were found (removed with ``--repair``)."""
    with reads_not_counted(ctx.cache.backend):
        report = verify(ctx.cache, repair=args.repair)
    if args.json:
        ctx.emit_json(
            {
                "checked": report.checked,
                "bad": [{"key": k, "reason": r} for k, r in report.bad],
                "removed": report.removed,
                "ok": report.ok,
                "signatures_checked": ctx.cache.signed,
            }
        )
        return 0 if report.ok else 1
    for skey, reason in report.bad:
        print(f"BAD  {skey}: {reason}", file=ctx.out)
    signatures = "with signatures" if ctx.cache.signed else "no secret, signatures not checked"
    print(
        f"checked {report.checked} entries ({signatures}): {len(report.bad)} bad, "
        f"{report.removed} removed",
        file=ctx.out,
    )
    if report.bad and not args.repair:
        print("run `runtime-cache verify --repair` to remove the bad entries", file=ctx.out)
    return 0 if report.ok else 1
