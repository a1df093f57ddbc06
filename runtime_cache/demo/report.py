"""The demo's result: cold against warm, as a JSON-ready dict and as a text table."""

from __future__ import annotations

from typing import Any

from ..opencl.driver_cache import PURPOSE as DRIVER_CACHE_PURPOSE
from ..units import format_size
from .phases import PHASES

__all__ = ["compare", "format_text"]


def _ratio(cold: float, warm: float) -> float | None:
    return round(cold / warm, 2) if warm > 0 else None


def compare(cold: dict[str, Any], warm: dict[str, Any], **context: Any) -> dict[str, Any]:
    """Combine the two runs' reports (from :mod:`runtime_cache.demo.run`) into the result.

    ``context`` adds fields such as the cache URL and what happened to the entries.
    """
    identical = cold["output_sha256"] == warm["output_sha256"] and cold["output"] == warm["output"]
    return {
        "model": cold["model"],
        "module_id": cold["module_id"],
        "layers": cold["layers"],
        "device": cold["device"],
        **context,
        "cold": cold,
        "warm": warm,
        "speedup": _ratio(cold["time_to_first_inference_s"], warm["time_to_first_inference_s"]),
        "speedup_wall": _ratio(cold["wall_s"], warm["wall_s"]),
        "outputs_identical": identical,
        "max_abs_error": max(cold["max_abs_error"], warm["max_abs_error"]),
    }


def format_text(result: dict[str, Any]) -> str:
    """The result as the table the demo prints."""
    cold, warm = result["cold"], result["warm"]
    lines = [
        f"runtime-cache demo: first inference of {result['model']} "
        f"({result['layers']} layers) on {result['device']}",
        f"cache: {result.get('cache', '?')}",
        "",
        f"  {'':<24}{'cold':>10}{'warm':>10}",
    ]
    for name in PHASES:
        lines.append(f"  {name:<24}{cold['phases'][name]:>9.2f}s{warm['phases'][name]:>9.2f}s")
    speedup = result["speedup"]
    served = warm["cache_stats"]["hits"] > 0  # no hits: whatever the clock says, not ours
    lines.append(
        f"  {'time to first inference':<24}{cold['time_to_first_inference_s']:>9.2f}s"
        f"{warm['time_to_first_inference_s']:>9.2f}s"
        + (f"   {speedup:.1f}x faster" if speedup and served else "")
        + ("   (no cache hits: no speed-up from the cache)" if not served else "")
    )
    lines.append(f"  {'process wall time':<24}{cold['wall_s']:>9.2f}s{warm['wall_s']:>9.2f}s")
    lines.append("")
    digest = cold["output_sha256"][:16]
    if result["outputs_identical"]:
        lines.append(f"outputs identical: yes (sha256 {digest}...)")
    else:
        lines.append(
            f"outputs identical: NO (cold {digest}..., warm {warm['output_sha256'][:16]}...)"
        )
    lines.append(f"largest error against numpy: {result['max_abs_error']:.1e}")
    lines.append(
        f"cold: tuned {cold['tuned_layers']} layers and compiled their programs; "
        f"warm: {warm['tuned_layers']} tuned, {warm['cache_stats']['hits']} cache hits"
    )
    for name, run in (("cold", cold), ("warm", warm)):
        errors = run["cache_stats"].get("errors", 0)
        if errors:  # a full disk, a dead server: what the cache could not do, and why
            last = run["cache_stats"].get("last_error")
            lines.append(f"{name}: {errors} cache errors (the last: {last})")
    carried = warm.get("driver_cache")
    entries = result.get("entries")
    stored = bool(entries and entries["by_purpose"].get(DRIVER_CACHE_PURPOSE))
    if result.get("carry_driver_cache") and carried and not carried.get("carried", True):
        lines.append("driver cache: none to carry (this driver keeps no cache runtime-cache knows)")
    elif result.get("carry_driver_cache") and carried and not stored:
        lines.append(
            "driver cache: not carried (its entry was not stored; "
            f"{carried['restored_files']} files restored)"
        )
    elif result.get("carry_driver_cache") and carried:
        where = (
            "a new, empty folder" if result.get("fresh_driver_cache") else "the cold run's folder"
        )
        lines.append(
            f"driver cache: carried by runtime-cache; warm run in {where}, "
            f"{carried['restored_files']} files restored"
        )
    if entries is not None and not entries["count"]:
        lines.append("cache entries: none stored")
    elif entries:
        kinds = ", ".join(f"{n} {purpose}" for purpose, n in sorted(entries["by_purpose"].items()))
        fate = (
            "kept (see `runtime-cache ls`)" if result.get("kept") else "removed (--keep keeps them)"
        )
        lines.append(
            f"cache entries: {entries['count']} ({kinds}), {format_size(entries['bytes'])}; {fate}"
        )
    return "\n".join(lines)
