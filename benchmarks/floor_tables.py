"""Markdown tables of ``bench_floor.py``'s runs (docs/benchmarks.md and benchmarks-opencl.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import labels
from tables import Run, grid


def _interval(row: Mapping[str, Any], key: str = "interval_95", digits: int = 3) -> str:
    low, high = row[key]
    return f"{low:.{digits}f} to {high:.{digits}f}"


def _load(value: Any) -> str:
    return f"{float(value[0]):.1f}" if isinstance(value, (list, tuple)) and value else "-"


def floor(runs: Sequence[Run]) -> str:
    """``bench_floor.py``: medians per side, paired ratios with intervals, start-up, per n."""
    out = []
    for run in runs:
        mode = run.get("driver_cache", "off")
        carry = mode == "carry"
        rows = []
        for n, res in dict(run["results"]).items():
            med = res["median_seconds"]
            if carry:
                r = res["ratios"]["carry/source"]
                rows.append(
                    [
                        n,
                        f"{med['source'] * 1000:.1f}",
                        f"{med['carry'] * 1000:.1f}",
                        f"{r['median']:.3f}",
                        _interval(r),
                    ]
                )
                continue
            lazy, full = res["ratios"]["lazy/floor"], res["ratios"]["all/floor"]
            cpu = res.get("cpu_ratios", {})
            start = res.get("startup", {})
            rows.append(
                [
                    n,
                    f"{med['floor'] * 1000:.1f}",
                    f"{med['lazy'] * 1000:.1f}",
                    f"{med['all'] * 1000:.1f}",
                    f"{lazy['median']:.3f} ({_interval(lazy)})",
                    f"{full['median']:.3f} ({_interval(full)})",
                    " / ".join(
                        f"{cpu[k]['median']:.3f}" if k in cpu else "-"
                        for k in ("lazy/floor", "all/floor")
                    ),
                    f"{start['median_ms']:.2f} ({_interval(start, 'interval_95_ms', 2)})"
                    if start
                    else "-",
                    f"{start['cpu_median_ms']:.2f}" if "cpu_median_ms" in start else "-",
                ]
            )
        if carry:
            head = [
                "programs",
                "driver cache alone, warm source builds (ms)",
                "ours + driver cache, restored into an empty folder (ms)",
                "ours / driver cache alone, paired median",
                "95% interval",
            ]
        else:
            head = [
                "programs",
                "floor (ms)",
                "lazy: one `program()` at a time (ms)",
                "`build_all()` (ms)",
                "lazy / floor (95% interval)",
                "`build_all()` / floor (95% interval)",
                "CPU time: lazy / floor, `build_all()` / floor",
                "start-up (ms, 95% interval)",
                "start-up, CPU time (ms)",
            ]
        device = run.get("device", {})
        driver = labels.driver_name(
            str(device.get("platform_name", "")), str(device.get("platform_version", ""))
        )
        title = (
            f"`{run['_file']}`: {driver} on {labels.device_name(device)}, "
            f"driver cache {mode}, {run['rounds']} rounds, "
            + (
                f"{run['known_marks']:,} marks on the crash guard's known list, "
                if run.get("known_marks")
                else ""
            )
            + "load average "
            f"{_load(run.get('load_average_start'))} at the start, "
            f"{_load(run.get('load_average_end'))} at the end"
        )
        out.append(title + "\n\n" + grid(head, rows))
        against_source = _against_source(run)
        if against_source:
            out.append(against_source)
    return "\n\n".join(out)


def _against_source(run: Run) -> str:
    """The same run's sides against the driver cache alone (``source``), where it ran."""
    rows = []
    for n, res in dict(run["results"]).items():
        ratios = res["ratios"]
        if "lazy/source" not in ratios:
            continue
        rows.append(
            [
                n,
                f"{res['median_seconds']['source'] * 1000:.1f}",
                *(
                    f"{ratios[k]['median']:.3f} ({_interval(ratios[k])})"
                    for k in ("lazy/source", "all/source", "floor/source")
                ),
            ]
        )
    if not rows:
        return ""
    head = [
        "programs",
        "driver cache alone: warm source builds (ms)",
        "lazy + driver cache / driver cache alone",
        "`build_all()` + driver cache / driver cache alone",
        "floor / driver cache alone (the least a binary cache can reach)",
    ]
    return f"`{run['_file']}`, the same rounds against the driver cache alone\n\n" + grid(
        head, rows
    )
