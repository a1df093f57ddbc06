"""``runtime-cache stats``: totals overall and per runtime and purpose, from what the backend
keeps (entries, sizes, build times, hits across processes)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from .cli_context import CommandContext
from .cli_format import human_seconds, human_size, render_table, signed_line
from .stats import EntryInfo

__all__ = ["SOURCES", "cmd_stats", "group_stats"]

SOURCES = {
    "entries": "the backend listing",
    "bytes": "stored sizes from the backend listing (framing included)",
    "hits": "the backend, across processes (null where the backend does not count hits)",
    "misses": "not stored by backends; counted as one first-build miss per stored entry",
    "hit_rate": "hits / (hits + misses), with misses counted as above",
    "build_seconds": "sum of the build time stored in each entry",
    "seconds_saved": "sum over entries of hits x build time",
}


def group_stats(infos: Iterable[EntryInfo]) -> dict[str, Any]:
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
        {"runtime": rt, "purpose": pp, **group_stats(items)}
        for (rt, pp), items in sorted(groups.items())
    ]
    overall = group_stats(infos)
    if args.json:
        ctx.emit_json(
            {"overall": overall, "groups": per, "sources": SOURCES, "signed": ctx.cache.signed}
        )
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
    print(signed_line(ctx.cache.signed), file=ctx.out)
    return 0
