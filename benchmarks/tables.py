"""Markdown tables for docs/benchmarks.md, one kind per benchmark; every column names its unit."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import labels

Run = Mapping[str, Any]

PHASES = ("setup", "compile", "tune", "load", "run")
#: bench_opencl.py's measurements, in the order the page lists them.
OPENCL_ROWS = {
    "a": "(a) cold: source builds, one at a time",
    "b": "(b) cold: `build_all()`, parallel",
    "c": "(c) warm: `build_all()` from runtime-cache",
    "c2": "(c2) warm: `program()` one at a time",
    "d": "(d) floor: raw `Program(binaries).build()`",
    "h": "(h) warm, binaries vetted once (new machine)",
}


def _num(value: Any, digits: int = 3) -> str:
    """A number for a table cell; a dash for missing or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value).replace("|", "\\|")


def grid(head: Sequence[str], rows: Sequence[Sequence[Any]], right: int = 1) -> str:
    """A Markdown table; columns from ``right`` on are right-aligned (numbers)."""
    align = ["---" if i < right else "---:" for i in range(len(head))]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += [
        "| " + " | ".join(c if isinstance(c, str) else _num(c) for c in r) + " |" for r in rows
    ]
    return "\n".join(lines)


def demo(runs: Sequence[Run]) -> str:
    """Cold and warm seconds per phase, one pair of columns per driver."""
    head = ["phase"]
    for run in runs:
        head += [f"{labels.demo_driver(run)}: cold (s)", "warm (s)"]
    rows: list[list[Any]] = []
    for phase in PHASES:
        row: list[Any] = [phase]
        for run in runs:
            row += [run["demo"]["cold"]["phases"][phase], run["demo"]["warm"]["phases"][phase]]
        rows.append(row)
    total: list[Any] = ["**time to first inference**"]
    speedup: list[Any] = ["speedup, cold / warm (x)"]
    for run in runs:
        cold, warm = run["demo"]["cold"], run["demo"]["warm"]
        total += [cold["time_to_first_inference_s"], warm["time_to_first_inference_s"]]
        speedup += [run["demo"].get("speedup"), ""]
    return grid(head, [*rows, total, speedup])


def opencl(runs: Sequence[Run]) -> str:
    """Milliseconds per kernel for each measurement, one column per driver, then the ratios."""
    head = ["measurement", *(f"{labels.opencl_driver(r)} (ms per kernel)" for r in runs)]
    rows: list[list[Any]] = []
    for key, label in OPENCL_ROWS.items():
        values = [r["median_seconds"].get(key, math.nan) * 1000 / r["n"] for r in runs]
        if not all(isinstance(v, float) and math.isnan(v) for v in values):
            rows.append([label, *values])
    ratios = {
        "warm_over_floor": "warm / floor, c / d (x)",
        "cold_over_warm": "cold / warm, a / c (x)",
        "parallel_over_sequential": "parallel / sequential cold, b / a (x)",
    }
    for key, label in ratios.items():
        rows.append([label, *(r["ratios"].get(key) for r in runs)])
    return grid(head, rows)


def opencl_conditions(runs: Sequence[Run]) -> str:
    """One line per run: file, date, kernels, repetitions, machine."""
    lines = []
    for run in runs:
        reps = f"{run.get('cold_reps', run.get('reps'))} cold and {run.get('warm_reps', '?')} warm"
        lines.append(
            f"- {labels.opencl_driver(run)}: `{run['_file']}`, {run['n']} kernels, medians of "
            f"{reps} repetitions; host: {labels.machine(run)}."
        )
    return "\n".join(lines)


def backends(run: Run) -> str:
    """Put and get in microseconds per backend and value size, against diskcache."""
    rows = []
    for size, subjects in run["results"].items():
        for name, row in subjects.items():
            rows.append(
                [size, name, row["put_us"], row["get_us"], row.get("get_ratio_vs_diskcache")]
            )
    head = ["value size", "backend", "put (µs)", "get (µs)", "get vs diskcache (x)"]
    table = grid(head, rows, right=2)
    front = run.get("front_over_raw")
    if not front:
        return table
    paired = [
        [size, r.get("stored_bytes"), r["get"], r.get("get_cold"), r["put"], len(r["get_rounds"])]
        for size, r in front.items()
    ]
    head = ["value size", "stored (bytes)", "get: front / raw", "get, first read: front / raw"]
    head += ["put: front / raw", "rounds"]
    intro = (
        "The front's cost: `dir via Cache front` over raw `dir`, timed in the same run, one "
        "operation each in turn on the same keys. Raw `dir` stores the very bytes the front "
        "stores (header, metadata and value); each ratio is the median over the rounds of the "
        "round's ratio of medians. `get` reads through the `Cache` that wrote the entries; "
        "`get, first read` through a second `Cache` (and a second raw backend) that has not "
        "seen them, as a process that did not write them."
    )
    load = run.get("meta", {}).get("load_average_1m")
    if load is not None:
        intro += f" Load average (1 min) when the run started: {load}."
    out = f"{table}\n\n{intro}\n\n{grid(head, paired, right=1)}"
    first = [
        [size, r["first_read_raw_us"], r["first_read_front_us"], r["first_read"]]
        for size, r in front.items()
        if "first_read" in r
    ]
    if first:
        processes = next(r["first_read_processes"] for r in front.values() if "first_read" in r)
        head = ["value size", "raw (µs)", "front (µs)", "front / raw"]
        out += (
            f"\n\nA fresh process's first get, after its imports and opening the cache: "
            f"medians of {processes} processes, the order of raw and front alternating.\n\n"
            f"{grid(head, first, right=1)}"
        )
    return out + _front_steps(front)


def _front_steps(front: dict[str, Any]) -> str:
    """Where a get's share goes: each step of the front's get over the raw get."""
    rows = [
        [size, s["raw_get_us"], s["pieces"], s["pieces + checksum"], s["Cache.get"]]
        for size, r in front.items()
        if (s := r.get("front_steps"))
    ]
    if not rows:
        return ""
    head = ["value size", "raw get (µs)", "read in pieces", "pieces + checksum", "Cache.get"]
    return (
        "\n\nWhere a get's share goes: each step timed alone over the same entries written by "
        "the front, key by key in rotating order, as a ratio to the raw get of the whole blob "
        "(median of the rounds). *Read in pieces*: from 32 KiB up, the value is read as a "
        "`bytes` of its own (a second read of the file, a `pread`); a smaller file is read "
        "whole, as the raw get reads it. *Pieces + checksum* adds the xxh3-64 of the value, which "
        "the check cannot skip; `Cache.get` adds the rest of the check (header, metadata, key "
        "match) and the hit's bookkeeping.\n\n"
        f"{grid(head, rows, right=1)}"
    )


def cli(run: Run) -> str:
    """Wall and CPU seconds per command."""
    rows = [
        [label, row.get("median_s"), row.get("median_cpu_s")]
        for label, row in run["results"].items()
    ]
    entries = run.get("meta", {}).get("entries")
    table = grid(["command or phase", "wall time (s)", "children's CPU time (s)"], rows)
    return f"On a directory cache of {entries:,} entries.\n\n{table}" if entries else table


def redis(run: Run) -> str:
    """Latency percentiles, batching and the open breaker, in microseconds."""
    results = run["results"]
    rows = []
    for size, row in results["latency"].items():
        for op, label in (
            ("set", "set"),
            ("get", "get"),
            ("front_put", "Cache.put"),
            ("front_get", "Cache.get"),
        ):
            rows.append([size, label, row[f"{op}_p50_us"], row[f"{op}_p99_us"]])
    latency = grid(["value size", "operation", "p50 (µs)", "p99 (µs)"], rows, right=2)
    batches = [
        [size, row["get_many_100_us"], row["single_gets_100_us"], row["speedup"]]
        for size, row in results["get_many"].items()
    ]
    head = ["value size", "one get_many of 100 (µs)", "100 single gets (µs)", "speedup (x)"]
    outage = results.get("outage", {})
    down = grid(
        ["server down, breaker open", "p50 (µs)", "p99 (µs)"],
        [["get", outage.get("open_get_p50_us"), outage.get("open_get_p99_us")]],
    )
    return "\n\n".join([latency, grid(head, batches), down])


def stress(runs: Sequence[Run]) -> str:
    """Throughput and the invariants of each stress run."""
    head = [
        "run",
        "processes x threads",
        "duration (s)",
        "operations per second (ops/s)",
        "hit rate (%)",
        "torn reads (count)",
        "corrupt (count)",
        "peak size over cap (x)",
    ]
    rows = []
    for run in runs:
        lookups = run["hits"] + run["misses"]
        rows.append(
            [
                f"`{run['_file']}`",
                f"{run['processes']} x {run['threads']}",
                run["seconds"],
                run["ops_per_second"],
                100.0 * run["hits"] / lookups if lookups else None,
                run["torn"],
                run["corrupt"],
                run.get("peak_over_cap"),
            ]
        )
    return grid(head, rows)


def crash(run: Run) -> str:
    """The crash harness's totals."""
    fields = {
        "trials": "trials (count)",
        "writers_per_trial": "writers per trial (count)",
        "processes_killed": "processes killed (count)",
        "entries_checked": "entries checked (count)",
        "bad_entries": "bad entries (count)",
        "wrong_values_served": "wrong values served (count)",
        "acknowledged_entries_lost": "acknowledged entries lost (count)",
        "temp_files_not_cleaned": "temp files left after clean-up (count)",
        "seconds": "duration (s)",
    }
    rows = [[label, run.get(key)] for key, label in fields.items() if key in run]
    return grid(["measure", "value"], rows)


#: Fuzz-target fields and their column heads.
FUZZ_COLUMNS = {
    "target": "target",
    "inputs": "inputs (count)",
    "seconds": "duration (s)",
    "violations": "violations (count)",
    "hangs": "hangs (count)",
    "crashes": "crashes (count)",
    "slowest_input_ms": "slowest input (ms)",
}


def fuzz(runs: Sequence[Run]) -> str:
    """Inputs tried and failures found per fuzz target."""
    rows = [[t.get(k) for k in FUZZ_COLUMNS] for run in runs for t in run.get("targets", [])]
    return grid(list(FUZZ_COLUMNS.values()), rows)


def computecache_probe(run: Run) -> str:
    """Load times of raw PTX programs against the state of NVIDIA's ComputeCache folder."""
    rows = [[case, f"{float(seconds):.3f}"] for case, seconds in dict(run["load_seconds"]).items()]
    head = f"{run.get('what', '')} Device: {run.get('device', '')}.\n\n"
    return head + grid(["ComputeCache folder", "load time (s)"], rows)


def warm_ab(runs: Sequence[Run]) -> str:
    """``bench_warm_ab.py``: medians of A and B and the paired ratio, per load path."""
    out = []
    for run in runs:
        rows = [
            [
                {"all": "build_all()", "one": "program() one at a time"}.get(mode, mode),
                f"{float(row['a_median_seconds']) * 1000:.1f}",
                f"{float(row['b_median_seconds']) * 1000:.1f}",
                f"{float(row['paired_ratio_median']):.3f}",
                "{:.3f} to {:.3f}".format(*row["ratio_interval_95"]),
            ]
            for mode, row in dict(run["results"]).items()
        ]
        head = ["load path", "A median (ms)", "B median (ms)", "B/A paired median", "95% interval"]
        title = (
            f"`{run['_file']}`: {run['n']} programs, {run['rounds']} rounds, on {run['device']}; "
            f"A = {run.get('a_label') or Path(str(run['a'])).name}, "
            f"B = {run.get('b_label') or Path(str(run['b'])).name}"
        )
        out.append(title + "\n\n" + grid(head, rows))
    return "\n\n".join(out)


def pyopencl_suite(runs: Sequence[Run]) -> str:
    """``bench_pyopencl_suite.py``: per test module, cold and warm against no cache at all;
    the whole process (exit included) beside the test run, and the detached store apart."""
    out = []
    for run in runs:
        rows = []
        for module, row in dict(run["results"]).items():
            # Before the detached store, the exit stored in the process (cold_flush_seconds).
            exit_seconds = row.get("cold_exit_seconds", row.get("cold_flush_seconds"))
            detached = (
                f"{_num(row['detached_seconds'])} / {_num(row['detached_cpu_seconds'])}"
                if "detached_seconds" in row
                else "n/a"
            )
            rows.append(
                [
                    f"`{module}`",
                    len(row["runs"]["baseline"]),
                    row["tests"],
                    row["programs"],
                    _num(row["baseline_run_seconds"]),
                    _num(row["cold_run_seconds"]),
                    _num(row["cold_over_baseline"]),
                    _num(row["baseline_process_seconds"]),
                    _num(row["cold_process_seconds"]),
                    _num(row["cold_process_over_baseline"])
                    + (
                        f" (per round {_num(row['cold_process_over_baseline_paired'])})"
                        if "cold_process_over_baseline_paired" in row
                        else ""
                    ),
                    _num(exit_seconds),
                    detached,
                    _num(row["warm_run_seconds"]),
                    _num(row["warm_over_baseline"]),
                    f"{row['cold_uncacheable']} / {row['warm_uncacheable']}",
                    f"{row['warm_source_builds']} / {row['warm_binary_loads']}",
                ]
            )
        head = [
            "module",
            "rounds",
            "tests",
            "programs built",
            "no cache: tests (s)",
            "cold: tests (s)",
            "cold / no cache, tests",
            "no cache: process (s)",
            "cold: process (s)",
            "cold / no cache, process (median of per-round ratios)",
            "cold: exit (s)",
            "detached store after exit: s / CPU s",
            "warm: tests (s)",
            "warm / no cache, tests",
            "uncacheable cold / warm",
            "warm source builds / loads",
        ]
        limit = f", the first {run['limit']} tests of each module" if run.get("limit") else ""
        limit += f", code: {run['checkout']}" if run.get("checkout") else ""
        title = (
            f"`{run['_file']}`: pyopencl {run['pyopencl']}, medians of rotated rounds"
            f"{limit}, on {run['results'][next(iter(run['results']))]['device']}"
            f" ({run['results'][next(iter(run['results']))]['platform_version'].split('  ')[0]})"
        )
        out.append(title + "\n\n" + grid(head, rows))
    return "\n\n".join(out)
