"""Median get/put latency of the built-in backends against diskcache, in one run.

Usage::

    python benchmarks/bench_backends.py [--rounds 5] [--json benchmarks/results/bench_backends.json]

Rows: the memory and directory backends raw, the directory backend through the
full ``Cache`` front (encode, checksum, key check), the directory backend with
access tracking off (to show its cost), and ``diskcache.Cache`` as the peer.
Each figure is the median over ``rounds`` passes of the per-operation median.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS, machine_info, median

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
COUNTS = {"1KiB": 400, "64KiB": 200, "1MiB": 40}

Op = Callable[[str, bytes], Any]
Get = Callable[[str], Any]


def _time_each(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(put: Op, get: Get, keys: list[str], value: bytes) -> tuple[float, float]:
    """Median seconds per put and per get over ``keys``."""
    puts = [_time_each(lambda k=k: put(k, value)) for k in keys]
    gets = [_time_each(lambda k=k: get(k)) for k in keys]
    return median(puts), median(gets)


def subjects(root: Path) -> dict[str, tuple[Op, Get, Callable[[], None]]]:
    import diskcache

    memory = MemoryBackend(max_size="2GB")
    directory = DirectoryBackend(root / "dir", max_size=None)
    quiet = DirectoryBackend(root / "dir-notrack", max_size=None, track_access=False)
    front = rc.Cache(DirectoryBackend(root / "front", max_size=None))
    keys: dict[str, rc.CacheKey] = {}

    def front_put(k: str, v: bytes) -> None:
        keys[k] = key = rc.make_key(module_id="bench", runtime="bench", purpose="front", i=k)
        front.put(key, v)

    def front_get(k: str) -> bytes | None:
        return front.get(keys[k])

    peer = diskcache.Cache(str(root / "diskcache"), size_limit=1 << 40)
    return {
        "memory": (memory.set, memory.get, memory.close),
        "dir": (directory.set, directory.get, directory.close),
        "dir (no access tracking)": (quiet.set, quiet.get, quiet.close),
        "dir via Cache front": (front_put, front_get, front.close),
        "diskcache": (peer.set, peer.get, peer.close),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=str(RESULTS / "bench_backends.json"))
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for size_name, size in SIZES.items():
        value = os.urandom(size)
        runs: dict[str, list[tuple[float, float]]] = {}
        for round_no in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="rc-bench-") as tmp:
                for name, (put, get, close) in subjects(Path(tmp)).items():
                    keys = [f"bench/b/{round_no:02d}{i:030d}" for i in range(COUNTS[size_name])]
                    runs.setdefault(name, []).append(measure(put, get, keys, value))
                    close()
        results[size_name] = {
            name: {
                "put_us": median(p for p, _ in pairs) * 1e6,
                "get_us": median(g for _, g in pairs) * 1e6,
            }
            for name, pairs in runs.items()
        }
    print(f"{'size':<7} {'backend':<26} {'put µs':>10} {'get µs':>10} {'get / diskcache':>16}")
    for size_name, rows in results.items():
        peer = rows["diskcache"]["get_us"]
        for name, row in rows.items():
            row["get_ratio_vs_diskcache"] = row["get_us"] / peer
            print(
                f"{size_name:<7} {name:<26} {row['put_us']:>10.1f} {row['get_us']:>10.1f} "
                f"{row['get_ratio_vs_diskcache']:>16.2f}"
            )
    meta = {**machine_info(), "rounds": args.rounds}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
