"""The listing and maintenance subcommands of ``runtime-cache``: ls, show, rm, clear, prune
and verify. (``stats`` is in :mod:`runtime_cache.cli_stats`, bundles in
:mod:`runtime_cache.cli_bundle`.) Each takes the parsed arguments and a
:class:`~runtime_cache.cli_context.CommandContext` and returns an exit code (0 ok, 1
problems found); usage problems raise ``UsageError`` (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, replace
from typing import Any

from . import listing
from .api import StoredItem
from .cache import Cache
from .cli_context import CommandContext, KeyNotFound, UsageError
from .cli_format import (
    human_age,
    human_seconds,
    human_size,
    iso_time,
    render_table,
    short_device,
    short_key,
    signed_line,
)
from .codec import decode_meta
from .errors import CorruptEntryError
from .maintenance import prune, verify
from .stats import EntryInfo

__all__ = [
    "SORTS",
    "cmd_clear",
    "cmd_ls",
    "cmd_prune",
    "cmd_rm",
    "cmd_show",
    "cmd_verify",
    "read_info",
    "resolve_key",
]


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
        print(signed_line(ctx.cache.signed), file=ctx.out)
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
    print(signed_line(ctx.cache.signed), file=ctx.out)
    return 0


def resolve_key(cache: Cache, text: str) -> str:
    """Turn what the user typed into a stored key.

    Accepted: a whole key (``opencl/program-binary/<32 hex digits>``), a prefix
    of a whole key (``opencl/tuning/3f2a``), or a prefix of a key's digest as
    ``ls`` shows it (``3f2a91c0d4e5``). Raises :class:`KeyNotFound` when nothing
    matches, :class:`UsageError` when the prefix is ambiguous.
    """
    text = text.strip()
    if not text:
        raise UsageError("an empty key")
    if "/" in text:
        if text.count("/") >= 2 and len(text.rsplit("/", 1)[-1]) == 32:
            return text  # a whole key: no listing needed
        matches = list(cache.backend.keys(text))
    else:
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


def cmd_rm(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Remove entries; exit code 1 when any key was not there.

    Every argument is resolved before anything is removed, so an ambiguous
    prefix (a usage error) removes nothing.
    """
    resolved: list[tuple[str, str]] = []
    for text in args.keys:
        try:
            resolved.append((text, resolve_key(ctx.cache, text)))
        except KeyNotFound:
            resolved.append((text, ""))
    missing = 0
    for text, skey in resolved:
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
    report = verify(ctx.cache, repair=args.repair)
    if args.json:
        ctx.emit_json(
            {
                "checked": report.checked,
                "bad": [{"key": k, "reason": r} for k, r in report.bad],
                "removed": report.removed,
                "newer_format_kept": report.newer,
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
    if report.newer:
        print(
            f"kept {report.newer} entries in a newer format (a newer version reads them)",
            file=ctx.out,
        )
    if report.bad and not args.repair:
        print("run `runtime-cache verify --repair` to remove the bad entries", file=ctx.out)
    return 0 if report.ok else 1
