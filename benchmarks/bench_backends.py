"""Median get/put latency of the built-in backends against diskcache, and the front's cost.

Usage::

    python benchmarks/bench_backends.py [--rounds 15] [--sizes 64KiB] [--json PATH]

Rows: the memory and directory backends raw, the directory backend through the
full ``Cache`` front (encode, checksum, key check), the directory backend with
access tracking off (to show its cost), and ``diskcache.Cache`` as the peer.
Each figure is the median over ``rounds`` passes of the per-operation median.

Every row stores under the same storage keys (``str(key)`` of real cache keys,
made before the clock starts), so each fans out over the same folders. The raw
``dir`` row stores the very bytes the front stores (the encoded entry: a
header, the metadata and the value), and it is timed interleaved with the front,
operation by operation, in alternating order, with the same options (no fsync,
no size cap, access tracking on). ``front_over_raw`` is then the median over the
rounds of each round's front / raw ratio of medians: what the front adds.
Its ``front_steps`` say where that goes: the read in pieces, the read and the
value's checksum, and the whole front, each over the raw get of the same entries.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash
from _common import RESULTS, machine_info, median, write_json

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.codec import encode_entry
from runtime_cache.entry_frame import entry_span

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10, "1MiB": 1 << 20}
COUNTS = {"1KiB": 400, "64KiB": 200, "1MiB": 40}
RAW = "dir"
FRONT = "dir via Cache front"

Op = Callable[[str, bytes], Any]
Get = Callable[[str], Any]
Times = tuple[list[float], list[float]]


def _clock(fn: Callable[..., Any], *args: Any) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def measure(put: Op, get: Get, keys: list[str], value: bytes) -> tuple[float, float]:
    """Median seconds per put and per get over ``keys``."""
    puts = [_clock(put, k, value) for k in keys]
    gets = [_clock(get, k) for k in keys]
    return median(puts), median(gets)


def paired(root: Path, keys: list[rc.CacheKey], value: bytes) -> tuple[Times, Times, Times]:
    """(puts, gets) seconds of the raw directory backend, and of the front over another one;
    then (gets, gets) of both again, the front through a second ``Cache`` over its folder.

    Both run on one thread, one operation each in turn, the first of each pair
    alternating, so that a slow spell of the machine falls on both. The raw
    backend stores the blob the front stores for the same key. The second
    ``Cache`` (and a second raw backend) have read nothing yet: each of their
    gets is their first of that entry, as in a process that did not write it.
    """
    raw = DirectoryBackend(root / "raw", max_size=None)
    front = rc.Cache(DirectoryBackend(root / "front", max_size=None))
    skeys = [str(k) for k in keys]
    blobs = [
        encode_entry(s, k.parts, value, created_at=time.time(), producer=front.producer)
        for s, k in zip(skeys, keys, strict=True)
    ]
    raw_times: Times = ([], [])
    front_times: Times = ([], [])
    cold_times: Times = ([], [])
    other: rc.Cache | None = None
    for op in (0, 1, 2):
        if op == 2:  # both open afresh: neither has seen these keys
            raw.close()
            raw = DirectoryBackend(root / "raw", max_size=None)
            other = rc.Cache(DirectoryBackend(root / "front", max_size=None))
        for i, (key, skey, blob) in enumerate(zip(keys, skeys, blobs, strict=True)):
            raw_call: tuple[Any, ...] = (raw.set, skey, blob) if op == 0 else (raw.get, skey)
            front_call: tuple[Any, ...] = (
                (front.put, key, value) if op == 0 else ((other or front).get, key)
            )
            if i % 2:
                f = _clock(*front_call)
                r = _clock(*raw_call)
            else:
                r = _clock(*raw_call)
                f = _clock(*front_call)
            if op < 2:
                raw_times[op].append(r)
                front_times[op].append(f)
            else:
                cold_times[0].append(r)
                cold_times[1].append(f)
    for closing in (raw, front, other):
        if closing is not None:
            closing.close()
    return raw_times, front_times, cold_times


#: The steps of a get through the front, each timed alone over the same entries.
STEPS = ("raw get", "pieces", "pieces + checksum", "Cache.get")


def _checksummed(raw: DirectoryBackend, skey: str) -> int:
    # What the front's check must hash at least: the value, where the read left it.
    pieces = raw.get_parts(skey, entry_span)
    assert pieces is not None
    if len(pieces) == 3:
        return xxhash.xxh3_64_intdigest(pieces[1])
    span = entry_span(pieces[0])
    assert span is not None
    return xxhash.xxh3_64_intdigest(memoryview(pieces[0])[span[0] : span[1]])


def steps(root: Path, keys: list[rc.CacheKey], value: bytes) -> dict[str, float]:
    """Median seconds of each of :data:`STEPS` over the entries ``keys``, written by the
    front: the raw get of the whole blob, the read in pieces (the value as a ``bytes`` of
    its own), that read and the value's checksum, and the front's whole get. Key by key,
    each step in turn, the order rotating, so that each step comes first as often."""
    front = rc.Cache(DirectoryBackend(root / "steps", max_size=None))
    raw = DirectoryBackend(root / "steps", max_size=None)
    calls: list[tuple[Any, ...]] = []
    for key in keys:
        front.put(key, value)
        skey = str(key)
        calls.append(
            (
                (raw.get, skey),
                (raw.get_parts, skey, entry_span),
                (_checksummed, raw, skey),
                (front.get, key),
            )
        )
    times: list[list[float]] = [[] for _ in STEPS]
    for i, row in enumerate(calls):
        order = itertools.islice(itertools.cycle(range(len(STEPS))), i, i + len(STEPS))
        for step in order:
            times[step].append(_clock(*row[step]))
    front.close()
    raw.close()
    return {name: median(seconds) for name, seconds in zip(STEPS, times, strict=True)}


def others(root: Path) -> dict[str, tuple[Op, Get, Callable[[], None]]]:
    """The rows timed one after another: memory, dir without tracking, diskcache."""
    import diskcache

    memory = MemoryBackend(max_size="2GB")
    quiet = DirectoryBackend(root / "dir-notrack", max_size=None, track_access=False)
    peer = diskcache.Cache(str(root / "diskcache"), size_limit=1 << 40)
    return {
        "memory": (memory.set, memory.get, memory.close),
        "dir (no access tracking)": (quiet.set, quiet.get, quiet.close),
        "diskcache": (peer.set, peer.get, peer.close),
    }


ORDER = ("memory", RAW, "dir (no access tracking)", FRONT, "diskcache")


def run_size(
    size_name: str, rounds: int, processes: int
) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """The rows of one value size, and the front's paired ratios to the raw backend."""
    value = os.urandom(SIZES[size_name])
    runs: dict[str, list[tuple[float, float]]] = {}
    ratios: dict[str, list[float]] = {"get": [], "put": [], "get_cold": []}
    step_ratios: dict[str, list[float]] = {name: [] for name in STEPS[1:]}
    step_raw_us: list[float] = []
    for round_no in range(rounds):
        keys = [
            rc.make_key(module_id="bench", runtime="bench", purpose="b", i=f"{round_no}-{i}")
            for i in range(COUNTS[size_name])
        ]
        skeys = [str(k) for k in keys]
        with tempfile.TemporaryDirectory(prefix="rc-bench-") as tmp:
            gc.collect()
            gc.disable()
            try:
                (raw_put, raw_get), (front_put, front_get), cold = paired(Path(tmp), keys, value)
                by_step = steps(Path(tmp), keys, value)
                for name, (put, get, close) in others(Path(tmp)).items():
                    runs.setdefault(name, []).append(measure(put, get, skeys, value))
                    close()
            finally:
                gc.enable()
        pairs = {
            RAW: (median(raw_put), median(raw_get)),
            FRONT: (median(front_put), median(front_get)),
        }
        for name, pair in pairs.items():
            runs.setdefault(name, []).append(pair)
        ratios["put"].append(pairs[FRONT][0] / pairs[RAW][0])
        ratios["get"].append(pairs[FRONT][1] / pairs[RAW][1])
        ratios["get_cold"].append(median(cold[1]) / median(cold[0]))
        step_raw_us.append(by_step[STEPS[0]] * 1e6)
        for name in STEPS[1:]:
            step_ratios[name].append(by_step[name] / by_step[STEPS[0]])
    rows = {
        name: {
            "put_us": median(p for p, _ in runs[name]) * 1e6,
            "get_us": median(g for _, g in runs[name]) * 1e6,
        }
        for name in ORDER
    }
    blob = encode_entry("bench/b/" + "0" * 32, {}, value, created_at=0.0)
    front = {
        "get": median(ratios["get"]),
        "put": median(ratios["put"]),
        "get_cold": median(ratios["get_cold"]),
        "get_rounds": [round(r, 4) for r in ratios["get"]],
        "put_rounds": [round(r, 4) for r in ratios["put"]],
        "get_cold_rounds": [round(r, 4) for r in ratios["get_cold"]],
        "stored_bytes": len(blob),
        "front_steps": {
            "raw_get_us": median(step_raw_us),
            **{name: median(step_ratios[name]) for name in STEPS[1:]},
        },
        **first_reads(value, processes),
    }
    return rows, front


#: A fresh process's first get of an entry, raw and through the front, in the order argv[3]
#: names (after the imports and the opening of both, which are not timed).
_FIRST_READ = """
import json, sys, time
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
root, order = sys.argv[1], sys.argv[2]
raw = DirectoryBackend(root + "/raw", max_size=None)
front = rc.Cache(DirectoryBackend(root + "/front", max_size=None))
key = rc.make_key(module_id="bench", runtime="bench", purpose="b", i="first")
calls = {"raw": (raw.get, str(key)), "front": (front.get, key)}
seconds = {}
for name in order.split(","):
    fn, arg = calls[name]
    start = time.perf_counter()
    found = fn(arg)
    seconds[name] = time.perf_counter() - start
    assert found is not None
print(json.dumps(seconds))
"""


def first_reads(value: bytes, processes: int) -> dict[str, Any]:
    """A fresh process's first get, raw and through the front, each in ``processes``
    processes (the order alternating): medians in microseconds, and of the ratios."""
    if processes <= 0:
        return {}
    key = rc.make_key(module_id="bench", runtime="bench", purpose="b", i="first")
    raw_us: list[float] = []
    front_us: list[float] = []
    with tempfile.TemporaryDirectory(prefix="rc-bench-first-") as tmp:
        front = rc.Cache(DirectoryBackend(Path(tmp) / "front", max_size=None))
        front.put(key, value)
        blob = front.backend.get(str(key))
        front.close()
        raw = DirectoryBackend(Path(tmp) / "raw", max_size=None)
        raw.set(str(key), blob or b"")
        raw.close()
        for i in range(processes):
            order = "raw,front" if i % 2 == 0 else "front,raw"
            command = [sys.executable, "-I", "-c", _FIRST_READ, tmp, order]
            done = subprocess.run(command, cwd=tmp, capture_output=True, text=True, check=True)
            seconds = json.loads(done.stdout)
            raw_us.append(seconds["raw"] * 1e6)
            front_us.append(seconds["front"] * 1e6)
    return {
        "first_read_raw_us": median(raw_us),
        "first_read_front_us": median(front_us),
        "first_read": median(f / r for f, r in zip(front_us, raw_us, strict=True)),
        "first_read_processes": processes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, e.g. 64KiB")
    parser.add_argument("--json", default=str(RESULTS / "bench_backends.json"))
    parser.add_argument(
        "--processes", type=int, default=9, help="fresh processes timing a first read (0: none)"
    )
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    front_over_raw: dict[str, dict[str, Any]] = {}
    for size_name in args.sizes.split(","):
        results[size_name], front_over_raw[size_name] = run_size(
            size_name, args.rounds, args.processes
        )
    print(f"{'size':<7} {'backend':<26} {'put µs':>10} {'get µs':>10} {'get / diskcache':>16}")
    for size_name, rows in results.items():
        peer = rows["diskcache"]["get_us"]
        for name, row in rows.items():
            row["get_ratio_vs_diskcache"] = row["get_us"] / peer
            print(
                f"{size_name:<7} {name:<26} {row['put_us']:>10.1f} {row['get_us']:>10.1f} "
                f"{row['get_ratio_vs_diskcache']:>16.2f}"
            )
    print("front / raw dir, paired in each round (median of the rounds):")
    for size_name, ratio in front_over_raw.items():
        print(
            f"{size_name:<7} get {ratio['get']:.3f}x  put {ratio['put']:.3f}x  "
            f"get by another Cache {ratio['get_cold']:.3f}x  "
            f"a fresh process's first get {ratio.get('first_read', math.nan):.3f}x"
        )
    print("a get's steps over the raw get, each timed alone (median of the rounds):")
    for size_name, ratio in front_over_raw.items():
        by_step = ratio["front_steps"]
        shares = "  ".join(f"{name} {by_step[name]:.3f}x" for name in STEPS[1:])
        print(f"{size_name:<7} raw get {by_step['raw_get_us']:.1f} µs  {shares}")
    meta = {**machine_info(), "rounds": args.rounds}
    output = {"meta": meta, "results": results, "front_over_raw": front_over_raw}
    print(f"wrote {write_json(args.json, output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
