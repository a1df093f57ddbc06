"""Warm OpenCL loads of two checkouts, compared in rotating rounds of fresh processes.

Each checkout (a folder with its own Python that imports it, e.g. its venv) first fills a
cache of its own with one cold run. Then, round after round, each side loads the same
``--n`` programs warm (``OpenCLModule.build_all()``, and one ``program()`` call at a time)
in a fresh process; the order of the sides rotates from round to round, because these
machines are noisy. The result is the median of each side and the median of the paired
ratios B/A, with a bootstrap 95% interval.

Example (a change against main, on the first OpenCL device)::

    python benchmarks/bench_warm_ab.py --a /work/base --b . --rounds 15 --n 100 \\
        --json benchmarks/results/warm-ab.json

PoCL's scratch folder goes to a fresh tmpfs folder per process (``POCL_CACHE_DIR``) and its
own cache is off, so what is timed is our load path and the driver's binary load.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import interval, machine_info, median, write_json

CHILD = r"""
import json, sys, time
import pyopencl as cl
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import OpenCLModule, opencl_stats

folder, n, mode, index = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from _common import kernel_sources

device = [d for p in cl.get_platforms() for d in p.get_devices()][index]
ctx = cl.Context([device])
sources = kernel_sources(n, "warm-ab")
started = time.perf_counter()
module = OpenCLModule(ctx, sources, cache=rc.Cache(DirectoryBackend(folder)))
if mode == "one":
    for name in sources:
        module.program(name)
else:
    module.build_all()
seconds = time.perf_counter() - started
s = opencl_stats()
print(json.dumps({"seconds": seconds, "builds": s.source_builds, "loads": s.binary_loads,
                  "device": device.name, "platform": device.platform.version}))
"""


def _python(folder: Path) -> str:
    venv = folder / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run(side: Path, cache: Path, guard: Path, n: int, mode: str, index: int) -> dict[str, Any]:
    """One fresh process of ``side``: its result line as a dict."""
    scratch = Path(tempfile.mkdtemp(prefix="pocl-ab-", dir="/dev/shm"))
    env = dict(
        os.environ,
        POCL_KERNEL_CACHE="0",
        POCL_CACHE_DIR=str(scratch),
        RUNTIME_CACHE_GUARD_DIR=str(guard),
    )
    try:
        done = subprocess.run(
            [_python(side), "-c", CHILD, str(cache), str(n), mode, str(index), str(HERE)],
            cwd=cache.parent,  # not the checkout: its source tree must not shadow the install
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{side}: exit {done.returncode}\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run the rounds, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (the change)")
    parser.add_argument("--n", type=int, default=100, help="programs")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", type=int, default=0, help="index over all devices")
    parser.add_argument("--label-a", default="", help="what A is, for the tables")
    parser.add_argument("--label-b", default="", help="what B is, for the tables")
    parser.add_argument("--json", default=str(HERE / "results" / "warm-ab.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="warm-ab-"))
    sides = {"A": args.a.resolve(), "B": args.b.resolve()}
    caches = {k: work / f"cache-{k}" for k in sides}
    guards = {k: work / f"guard-{k}" for k in sides}
    for key, side in sides.items():  # one cold run each fills its own cache
        cold = run(side, caches[key], guards[key], args.n, "all", args.device)
        assert cold["builds"] == args.n, cold
    times: dict[str, dict[str, list[float]]] = {m: {"A": [], "B": []} for m in ("all", "one")}
    device = ""
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        for mode in ("all", "one"):
            for key in order:
                out = run(sides[key], caches[key], guards[key], args.n, mode, args.device)
                assert out["builds"] == 0 and out["loads"] == args.n, out
                times[mode][key].append(out["seconds"])
                device = f"{out['device']} ({out['platform']})"
    shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {}
    print(f"{args.n} programs warm on {device}, {args.rounds} rotating rounds")
    print(f"{'path':<28}{'A median s':>12}{'B median s':>12}{'B/A':>8}{'95% interval':>18}")
    for mode, label in (("all", "build_all()"), ("one", "program() one at a time")):
        a, b = times[mode]["A"], times[mode]["B"]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        low, high = interval(ratios)
        summary[mode] = {
            "a_median_seconds": median(a),
            "b_median_seconds": median(b),
            "paired_ratio_median": median(ratios),
            "ratio_interval_95": [low, high],
            "a_seconds": a,
            "b_seconds": b,
        }
        print(
            f"{label:<28}{median(a):>12.4f}{median(b):>12.4f}{median(ratios):>8.3f}"
            f"{f'[{low:.3f}, {high:.3f}]':>18}"
        )
    record = {
        "benchmark": "warm-ab",
        "host": machine_info(),
        "device": device,
        "n": args.n,
        "rounds": args.rounds,
        "a": str(sides["A"]),
        "b": str(sides["B"]),
        "a_label": args.label_a,
        "b_label": args.label_b,
        "results": summary,
    }
    print(f"wrote {write_json(args.json, record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
