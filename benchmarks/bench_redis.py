"""Latency of the Redis backend on loopback, and what pipelining buys, in one run.

Usage::

    python benchmarks/bench_redis.py [--transport tcp|unix] [--json FILE]

(``FILE``: ``benchmarks/results/bench_redis.json`` by default.)

It starts its own ``redis-server`` (from PATH) with no persistence, on a free loopback
port (``tcp``, ``redis://``) or on a Unix socket alone (``unix``, ``redis+unix://``), and
stops it at the end. Rows:

* p50/p99 of ``get`` and ``set`` for 1 KiB and 64 KiB values, on the raw
  backend and through the ``Cache`` front (encode, checksum, HMAC signature);
* ``get_many`` of 100 entries (one MGET) against 100 single gets: the median
  of each over many rounds, and their ratio;
* the cost of a call while the server is down and the circuit breaker is open.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import machine_info, median, write_json
from redis_servers import running_server

import runtime_cache as rc
from runtime_cache.backends.redis import RedisBackend

SIZES = {"1KiB": 1 << 10, "64KiB": 64 << 10}
OPS = {"1KiB": 2000, "64KiB": 500}
BATCH = 100
ROUNDS = 60


def _timings(fn: Callable[[int], Any], count: int) -> list[float]:
    out = []
    for i in range(count):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


def latency(backend: RedisBackend, size: int, count: int) -> dict[str, float]:
    """p50/p99 in microseconds of set and get on the raw backend and via a signed Cache."""
    value = os.urandom(size)
    keys = [f"bench/lat/{size}/{i:06d}" for i in range(count)]
    sets = _timings(lambda i: backend.set(keys[i], value), count)
    gets = _timings(lambda i: backend.get(keys[i]), count)
    cache = rc.Cache(backend, secret="bench secret")
    ckeys = [
        rc.make_key(module_id="bench", runtime="bench", purpose="lat", i=i) for i in range(count)
    ]
    puts = _timings(lambda i: cache.put(ckeys[i], value), count)
    cgets = _timings(lambda i: cache.get(ckeys[i]), count)
    assert cache.stats().hits == count, "every front get must hit"
    return {
        "set_p50_us": _pct(sets, 0.5),
        "set_p99_us": _pct(sets, 0.99),
        "get_p50_us": _pct(gets, 0.5),
        "get_p99_us": _pct(gets, 0.99),
        "front_put_p50_us": _pct(puts, 0.5),
        "front_put_p99_us": _pct(puts, 0.99),
        "front_get_p50_us": _pct(cgets, 0.5),
        "front_get_p99_us": _pct(cgets, 0.99),
    }


def batching(backend: RedisBackend, size: int) -> dict[str, float]:
    """Median seconds of one get_many(100) and of 100 single gets, interleaved rounds."""
    keys = [f"bench/batch/{size}/{i:03d}" for i in range(BATCH)]
    backend.set_many({k: os.urandom(size) for k in keys})
    many, single = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        got = backend.get_many(keys)
        many.append(time.perf_counter() - start)
        assert len(got) == BATCH
        start = time.perf_counter()
        for key in keys:
            backend.get(key)
        single.append(time.perf_counter() - start)
    m, s = median(many), median(single)
    return {"get_many_100_us": m * 1e6, "single_gets_100_us": s * 1e6, "speedup": s / m}


def outage(url: str, stop: Callable[[], None]) -> dict[str, float]:
    """p50/p99 of a get while the server is down and the breaker is open."""
    backend = RedisBackend.from_url(f"{url}?backoff=30s&max_backoff=30s")
    backend.set("bench/outage", b"x")
    stop()
    try:
        backend.get("bench/outage")  # opens the breaker
    except rc.errors.BackendUnavailableError:
        pass

    def call(_: int) -> None:
        try:
            backend.get("bench/outage")
        except rc.errors.BackendUnavailableError:
            pass

    samples = _timings(call, 2000)
    return {"open_get_p50_us": _pct(samples, 0.5), "open_get_p99_us": _pct(samples, 0.99)}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--json", default="benchmarks/results/bench_redis.json")
    parser.add_argument("--transport", choices=("tcp", "unix"), default="tcp")
    args = parser.parse_args()
    import redis

    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    results: dict[str, Any] = {"latency": {}, "get_many": {}}
    with running_server(unix=args.transport == "unix") as server:
        backend = RedisBackend.from_url(f"{server.url}?prefix=bench:")
        for name, size in SIZES.items():
            results["latency"][name] = latency(backend, size, OPS[name])
            results["get_many"][name] = batching(backend, size)
        backend.close()
        results["outage"] = outage(server.url, server.kill)

    print(f"{'value':<7} {'op':<12} {'p50 us':>9} {'p99 us':>9}")
    for name, row in results["latency"].items():
        for op in ("set", "get", "front_put", "front_get"):
            print(f"{name:<7} {op:<12} {row[op + '_p50_us']:>9.1f} {row[op + '_p99_us']:>9.1f}")
    print(f"\n{'value':<7} {'get_many(100) us':>17} {'100 gets us':>12} {'speedup':>8}")
    for name, row in results["get_many"].items():
        print(
            f"{name:<7} {row['get_many_100_us']:>17.0f} {row['single_gets_100_us']:>12.0f} "
            f"{row['speedup']:>7.1f}x"
        )
    out = results["outage"]
    print(
        f"\nget while down, breaker open: p50 {out['open_get_p50_us']:.1f} us, "
        f"p99 {out['open_get_p99_us']:.1f} us"
    )
    meta = {
        **machine_info(),  # its load average: other work on the box adds noise
        "redis_server": version.stdout.split()[2] if version.stdout else "unknown",
        "redis_py": redis.__version__,
        "transport": "loopback TCP" if args.transport == "tcp" else "Unix socket",
    }
    print(f"\nwrote {write_json(args.json, {'meta': meta, 'results': results})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
