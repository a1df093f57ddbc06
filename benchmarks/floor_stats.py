"""bench_floor.py's numbers: per-side medians, paired ratios with intervals, the start-up."""

from __future__ import annotations

from typing import Any

from _common import interval, median


def _paired(a: list[float], b: list[float]) -> dict[str, Any]:
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {"median": median(ratios), "interval_95": list(interval(ratios)), "per_round": ratios}


def summarize(
    times: dict[str, list[float]],
    cpu: dict[str, list[float]],
    firsts: dict[str, list[float]],
    first_cpu: dict[str, list[float]],
    pairs: list[tuple[str, str]],
) -> dict[str, Any]:
    """Medians per side, paired ratios per pair, and the start-up difference."""
    out: dict[str, Any] = {
        "median_seconds": {s: median(v) for s, v in times.items()},
        "seconds": times,
        "median_cpu_seconds": {s: median(v) for s, v in cpu.items()},
        "cpu_seconds": cpu,
        "ratios": {f"{a}/{b}": _paired(times[a], times[b]) for a, b in pairs},
        "cpu_ratios": {f"{a}/{b}": _paired(cpu[a], cpu[b]) for a, b in pairs},
    }
    if firsts.get("lazy") and firsts.get("floor"):
        diffs = [x - y for x, y in zip(firsts["lazy"], firsts["floor"], strict=True)]
        out["first_seconds"] = firsts
        out["startup"] = {
            "median_ms": median(diffs) * 1000,
            "interval_95_ms": [v * 1000 for v in interval(diffs)],
            "per_round_ms": [d * 1000 for d in diffs],
            "lazy_first_median_ms": median(firsts["lazy"]) * 1000,
            "floor_first_median_ms": median(firsts["floor"]) * 1000,
        }
        cpu_diffs = [x - y for x, y in zip(first_cpu["lazy"], first_cpu["floor"], strict=True)]
        out["startup"]["cpu_median_ms"] = median(cpu_diffs) * 1000
        out["startup"]["cpu_interval_95_ms"] = [v * 1000 for v in interval(cpu_diffs)]
    return out


def print_report(
    results: dict[str, Any], device: dict[str, Any], mode: str, ns: list[int], sides: list[str]
) -> None:
    """Print the medians, ratios and start-up of one run, n by n."""
    print(f"\n{device.get('name')} | {device.get('platform_version')} | driver cache {mode}")
    print(f"{'n':>4} {'side':8} {'median ms':>10}")
    for n in ns:
        for side in sides:
            print(f"{n:>4} {side:8} {results[str(n)]['median_seconds'][side] * 1000:10.2f}")
        for pair, row in results[str(n)]["ratios"].items():
            low, high = row["interval_95"]
            c = results[str(n)]["cpu_ratios"][pair]
            print(
                f"{n:>4} {pair:14} {row['median']:.3f} [{low:.3f}, {high:.3f}]"
                f"   cpu {c['median']:.3f} [{c['interval_95'][0]:.3f}, {c['interval_95'][1]:.3f}]"
            )
        if "startup" in results[str(n)]:
            s = results[str(n)]["startup"]
            low, high = s["interval_95_ms"]
            print(
                f"{n:>4} start-up {s['median_ms']:.2f} ms [{low:.2f}, {high:.2f}]"
                f"   cpu {s['cpu_median_ms']:.2f} ms"
            )
