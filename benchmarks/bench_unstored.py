"""Benchmark a fleet's cold start on an entry the shared store refuses (over its cap).

``--procs`` fresh processes call ``get_or_build`` on one key at once; the build sleeps
``--build`` seconds and makes a value larger than the store keeps (``dir://`` with a
64 KB ``max_size``, ``redis://`` with a 50,000-byte ``max_entry_size``), so nothing
lands. With the holder's note (``on``, the default policy) the waiters build side by side
once the first build is done; with the note made to run out at once (``off``,
``LeasePolicy.unstored_note`` of a nanosecond) they take the lease over one after
another, as before notes. Each round runs every backend and both modes in a rotated
order; the wall time runs from the processes' start until the last one returns.
Prints medians and writes JSON.

Usage::

    python benchmarks/bench_unstored.py --procs 6 --build 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, machine_info, median, write_json
from bench_fleet import start_redis

CHILD = textwrap.dedent(
    """
    import json, sys, time
    import runtime_cache as rc
    from runtime_cache.fleet import LeasePolicy

    url, build_seconds, note = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    cache = rc.Cache(rc.open_backend(url), secret="bench-secret")
    cache.fleet.policy = LeasePolicy(default_expected=4 * build_seconds, unstored_note=note)
    key = rc.make_key(module_id="big", runtime="bench", purpose="unstored", device=None)

    def build():
        time.sleep(build_seconds)
        return b"x" * 100_000  # over both stores' caps

    started = time.monotonic()
    value = cache.get_or_build(key, build)
    s = cache.stats()
    print(json.dumps({"ok": len(value) == 100_000, "seconds": time.monotonic() - started,
                      "builds": s.builds, "stores": s.stores, "unshared": s.unshared_builds}))
    """
)


def one_round(url: str, procs: int, build: float, note: float, folder: Path) -> dict[str, Any]:
    """Start ``procs`` children on ``url`` at once; the wall time until the last returns."""
    started = time.monotonic()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, str(build), str(note)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,  # each says once that the store refused the value
            text=True,
            cwd=folder,
        )
        for _ in range(procs)
    ]
    results = [
        json.loads(child.communicate(timeout=600)[0].strip().splitlines()[-1]) for child in children
    ]
    wall = time.monotonic() - started
    if not all(r["ok"] for r in results) or any(r["stores"] for r in results):
        raise SystemExit(f"a child failed, or the store kept the value: {results}")
    return {
        "wall_seconds": wall,
        "builds": sum(r["builds"] for r in results),
        "unshared_builds": sum(r["unshared"] for r in results),
        "process_seconds": sorted(round(r["seconds"], 3) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--procs", type=int, default=6)
    parser.add_argument("--build", type=float, default=2.0, help="seconds each build sleeps")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="dir,redis")
    parser.add_argument("--json", default=str(RESULTS / "bench_unstored.json"))
    args = parser.parse_args()
    top = Path(tempfile.mkdtemp(prefix="bench-unstored-"))
    server = start_redis(top) if "redis" in args.backends.split(",") else None
    backends = [b for b in args.backends.split(",") if b == "dir" or server is not None]
    sides = [(backend, mode) for backend in backends for mode in ("on", "off")]
    runs: dict[str, list[dict[str, Any]]] = {f"{b} notes {m}": [] for b, m in sides}
    try:
        for n in range(args.rounds):
            for backend, mode in sides[n % len(sides) :] + sides[: n % len(sides)]:
                folder = Path(tempfile.mkdtemp(dir=top))
                if backend == "dir":
                    url = f"dir://{folder / 'cache'}?max_size=64KB"
                else:
                    assert server is not None
                    url = f"{server[1]}?prefix=r{n}-{folder.name}:&max_entry_size=50000"
                note = 60.0 if mode == "on" else 1e-9
                run = one_round(url, args.procs, args.build, note, folder)
                runs[f"{backend} notes {mode}"].append(run)
    finally:
        if server is not None:
            server[0].terminate()
            server[0].wait()
        shutil.rmtree(top, ignore_errors=True)
    summary = {}
    what = f"one {args.build:g} s build the store refuses"
    print(f"{args.procs} processes, {what}, {args.rounds} rounds")
    print(f"{'side':<20} {'last returned (s, median)':>26} {'builds':>7} {'unshared':>9}")
    for side, rows in runs.items():
        wall = median(r["wall_seconds"] for r in rows)
        summary[side] = {"wall_seconds_median": wall, "rounds": rows}
        print(f"{side:<20} {wall:>26.2f} {rows[0]['builds']:>7} {rows[0]['unshared_builds']:>9}")
    record = {
        "benchmark": "unstored",
        **machine_info(),
        "procs": args.procs,
        "build_seconds": args.build,
        "rounds": args.rounds,
        "sides": summary,
    }
    print(f"wrote {write_json(args.json, record)}")


if __name__ == "__main__":
    main()
