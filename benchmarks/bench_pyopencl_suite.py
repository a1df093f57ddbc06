"""pyopencl's own test modules under ``install()``: cold and warm against no cache at all.

Each module of pyopencl's test suite (from the sdist of the installed version:
``pip download --no-deps --no-binary :all: pyopencl==<version>``, whose ``test/`` folder
``--tests`` names) runs with pytest in a fresh process, three ways:

* ``baseline``: plain pyopencl, no runtime-cache;
* ``cold``: ``install()`` on a fresh, empty ``dir://`` cache;
* ``warm``: ``install()`` on the cache that ``cold`` just filled.

The cache is the process-wide one, as an app gets it: ``install()`` with no argument, and
``RUNTIME_CACHE=dir://<folder>`` (runs before 2026-12-01's g17imp passed
``rc.Cache(DirectoryBackend(folder))`` to ``install()``, which imported the cache's front
and backend up front; the same code runs either way once a program is built).

Rounds rotate the order of baseline and cold (warm follows its cold run), because the
machine is noisy. Each process times the test run itself (``pytest.main``) and the whole
process, exit included: the figure that counts is the cold process against the baseline
process. A cold process stores what it built at exit (``install()``'s deferred store: on
PoCL it hands the programs to a detached process, :mod:`runtime_cache.opencl.detached_store`);
its ``exit_seconds`` is the time from the end of the tests to that store's end. The
detached store's own seconds and CPU seconds are recorded apart (its ``<pid>.json``), and
the benchmark waits for it to finish before the warm run and before the next timed
process. It records ``opencl_stats()``. PoCL's own kernel cache gets a fresh
folder per process, and ``RUNTIME_CACHE_OPENCL_ICD=off`` keeps the platform list the
same with and without runtime-cache, so ``PYOPENCL_TEST`` picks the same device.

Example (PoCL 3.1 is platform 0 here; the first 40 tests of each module)::

    python benchmarks/bench_pyopencl_suite.py --tests /tmp/pyopencl-2026.1.4/test \\
        --platform 0 --limit 40 --rounds 1 --json benchmarks/results/pyopencl-suite-pocl-3.1.json

The children import the runtime-cache of ``--checkout`` (default: this one) through
``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine_info, median, write_json

HERE = Path(__file__).resolve().parent
MODULES = [
    "test_algorithm.py",
    "test_array.py",
    "test_arrays_in_structs.py",
    "test_clmath.py",
    "test_clrandom.py",
    "test_enqueue_copy.py",
    "test_wrapper.py",
]

CHILD = r"""
import atexit, json, sys, time
started = time.perf_counter()
mode, ids = sys.argv[1], sys.argv[2:]
if mode != "baseline":
    from runtime_cache.opencl import install, opencl_stats
    install()  # the process-wide cache, as an app gets it: RUNTIME_CACHE is dir://<cache>

    def at_exit():  # registered first, so it runs after install()'s own store at exit
        s = opencl_stats()
        stats = {k: getattr(s, k) for k in s.__dataclass_fields__}
        print("EXIT " + json.dumps({"exit_seconds": time.perf_counter() - run_end, "stats": stats}))

    atexit.register(at_exit)
import pyopencl as cl
import pytest
run_start = time.perf_counter()
code = pytest.main(["-q", "-p", "no:cacheprovider", *ids])
run_end = time.perf_counter()
out = {"code": int(code), "run_seconds": run_end - run_start}
if mode != "baseline":
    s = opencl_stats()
    out["stats"] = {k: getattr(s, k) for k in s.__dataclass_fields__}
platform = cl.get_platforms()[0]
out["platform"] = platform.version
out["device"] = platform.get_devices()[0].name
print("RESULT " + json.dumps(out), flush=True)
"""


def wait_detached(folder: Path, timeout: float = 1800.0) -> list[dict[str, Any]]:
    """Wait for the detached stores a cold process left (their ``<pid>.running`` files in
    ``folder``), then return their records (``<pid>.json``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = [int(p.stem) for p in folder.glob("*.running") if p.stem.isdigit()]
        if not [pid for pid in running if Path(f"/proc/{pid}").exists()]:
            break
        time.sleep(0.1)
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]


def collect(
    tests: Path, module: str, limit: int | None, keyword: str | None, platform: str
) -> list[str]:
    """The node ids of ``module`` that will run (the first ``limit``, in pytest's order)."""
    args = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    args += [module] + (["-k", keyword] if keyword else [])
    done = subprocess.run(
        args,
        cwd=tests,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=_env(PYOPENCL_TEST=platform),
    )
    prefix = tests.name + "/"  # ids are relative to the sdist's root; pytest runs in tests/
    ids = [line.removeprefix(prefix) for line in done.stdout.splitlines() if "::" in line]
    return ids[:limit] if limit else ids


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, RUNTIME_CACHE_OPENCL_ICD="off", **extra)
    env.pop("RUNTIME_CACHE", None)
    return env


def run(
    checkout: Path, tests: Path, mode: str, cache: Path, ids: list[str], platform: str
) -> dict[str, Any]:
    """One fresh pytest process: its result line, plus the whole process's seconds."""
    scratch = Path(tempfile.mkdtemp(prefix="pocl-suite-"))
    env = _env(
        PYTHONPATH=str(checkout),
        PYOPENCL_TEST=platform,
        PYOPENCL_CTX=platform,
        POCL_CACHE_DIR=str(scratch / "pocl"),
        RUNTIME_CACHE_GUARD_DIR=str(cache.parent / "guard"),
        RUNTIME_CACHE_OPENCL_DETACHED_DIR=str(scratch / "detached"),
    )
    if mode != "baseline":
        env["RUNTIME_CACHE"] = f"dir://{cache.resolve()}"
    detached: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, mode, *ids],
            cwd=tests,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        ended = time.perf_counter()
        # Before the next timed process, and before PoCL's folder goes: the detached
        # store builds there too.
        detached = wait_detached(scratch / "detached")
        waited = time.perf_counter() - ended
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        raise SystemExit(
            f"{mode}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-2000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    result["process_seconds"] = ended - started
    for line in done.stdout.splitlines():
        if line.startswith("EXIT "):
            result.update(json.loads(line[len("EXIT ") :]))
    errors = [r["error"] for r in detached if "error" in r]
    if errors:
        raise SystemExit(f"{mode}: the detached store failed: {errors}")
    if detached:
        result["detached"] = detached
        result["detached_seconds"] = sum(r.get("seconds", 0.0) for r in detached)
        result["detached_cpu_seconds"] = sum(r.get("cpu_seconds", 0.0) for r in detached)
        result["detached_wait_seconds"] = waited
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the modules; print a table; write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, required=True, help="pyopencl's test/ folder")
    parser.add_argument("--checkout", type=Path, default=HERE.parent)
    parser.add_argument("--modules", nargs="*", default=MODULES)
    parser.add_argument("--limit", type=int, default=None, help="first N tests of each module")
    parser.add_argument("-k", dest="keyword", default=None, help="pytest -k for every module")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--round-offset", type=int, default=0, help="start the rotation here (to add rounds later)"
    )
    parser.add_argument("--platform", default="0", help="PYOPENCL_TEST / PYOPENCL_CTX")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--label", default=None, help="what --checkout is, for the table")
    args = parser.parse_args(argv)
    tests = args.tests.resolve()
    results: dict[str, Any] = {}
    for module in args.modules:
        ids = collect(tests, module, args.limit, args.keyword, args.platform)
        rows: dict[str, list[dict[str, Any]]] = {"baseline": [], "cold": [], "warm": []}
        for index in range(args.rounds):
            work = Path(tempfile.mkdtemp(prefix="suite-cache-"))
            try:
                order = (
                    ["baseline", "cold"]
                    if (index + args.round_offset + MODULES.index(module)) % 2 == 0
                    else [
                        "cold",
                        "baseline",
                    ]
                )
                for mode in order:
                    rows[mode].append(
                        run(args.checkout, tests, mode, work / "cache", ids, args.platform)
                    )
                    if mode == "cold":
                        rows["warm"].append(
                            run(args.checkout, tests, "warm", work / "cache", ids, args.platform)
                        )
            finally:
                shutil.rmtree(work, ignore_errors=True)
        results[module] = summarize(rows, len(ids))
        show(module, results[module])
    payload = {
        "benchmark": "pyopencl-suite",
        **machine_info(),
        "pyopencl": _pyopencl_version(),
        "rounds": args.rounds,
        "limit": args.limit,
        "keyword": args.keyword,
        "platform": args.platform,
        "checkout": args.label or args.checkout.resolve().name,
        "results": results,
    }
    if args.json:
        write_json(args.json, payload)
    return 0


def _pyopencl_version() -> str:
    from importlib import metadata

    return metadata.version("pyopencl")


def summarize(rows: dict[str, list[dict[str, Any]]], tests: int) -> dict[str, Any]:
    """Medians per mode, the cold/baseline and warm/baseline ratios, and the counters."""
    out: dict[str, Any] = {"tests": tests, "runs": rows}
    for mode, items in rows.items():
        out[f"{mode}_run_seconds"] = median(r["run_seconds"] for r in items)
        out[f"{mode}_process_seconds"] = median(r["process_seconds"] for r in items)
    base = out["baseline_run_seconds"]
    out["cold_over_baseline"] = out["cold_run_seconds"] / base
    out["warm_over_baseline"] = out["warm_run_seconds"] / base
    out["cold_process_over_baseline"] = (
        out["cold_process_seconds"] / out["baseline_process_seconds"]
    )
    cold = rows["cold"]
    # Per round (baseline and cold ran side by side): the ratio of each pair, and its median.
    pairs = [
        c["process_seconds"] / b["process_seconds"]
        for b, c in zip(rows["baseline"], cold, strict=True)
    ]
    out["cold_process_over_baseline_per_round"] = pairs
    out["cold_process_over_baseline_paired"] = median(pairs)
    out["cold_exit_seconds"] = median(r.get("exit_seconds", 0.0) for r in cold)
    out["detached_seconds"] = median(r.get("detached_seconds", 0.0) for r in cold)
    out["detached_cpu_seconds"] = median(r.get("detached_cpu_seconds", 0.0) for r in cold)
    out["detached_stored"] = sum(d.get("stored", 0) for r in cold for d in r.get("detached", []))
    last_cold, last_warm = cold[-1]["stats"], rows["warm"][-1]["stats"]
    out["cold_handed_off"] = last_cold.get("stores_handed_off", 0)
    out["cold_stores_dropped"] = last_cold.get("stores_dropped", 0)
    out["programs"] = last_cold["source_builds"] + last_cold["binary_loads"]
    out["cold_uncacheable"] = last_cold["uncacheable"]
    out["warm_uncacheable"] = last_warm["uncacheable"]
    out["warm_source_builds"] = last_warm["source_builds"]
    out["warm_binary_loads"] = last_warm["binary_loads"]
    out["codes"] = sorted({r["code"] for rs in rows.values() for r in rs})
    out["device"] = rows["baseline"][-1]["device"]
    out["platform_version"] = rows["baseline"][-1]["platform"]
    return out


def show(module: str, row: dict[str, Any]) -> None:
    print(
        f"{module:26s} tests {row['tests']:4d} programs {row['programs']:5d}  "
        f"baseline {row['baseline_run_seconds']:7.2f}s cold {row['cold_run_seconds']:7.2f}s "
        f"(x{row['cold_over_baseline']:.3f}) process baseline "
        f"{row['baseline_process_seconds']:7.2f}s cold {row['cold_process_seconds']:7.2f}s "
        f"(x{row['cold_process_over_baseline']:.3f}; exit {row['cold_exit_seconds']:.2f}s, "
        f"{row['cold_handed_off']} handed off; detached {row['detached_seconds']:.1f}s, "
        f"{row['detached_cpu_seconds']:.1f}s CPU) "
        f"warm {row['warm_run_seconds']:7.2f}s (x{row['warm_over_baseline']:.3f})  "
        f"uncacheable cold/warm {row['cold_uncacheable']}/{row['warm_uncacheable']} "
        f"warm builds {row['warm_source_builds']} loads {row['warm_binary_loads']} "
        f"exit codes {row['codes']}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
