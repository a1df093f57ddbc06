"""Multi-process, multi-thread stress on one cache: a directory or one Redis server.

``--processes`` worker processes with ``--threads`` threads each share one cache
for ``--seconds``. Every thread mixes ``get`` (45%), ``put`` (30%), ``delete``
(5%) and ``get_or_build`` (20%) on a shared key space, with self-checking values
(1 B to 128 KB: a header naming the key plus an xxh3 of the body), and every 5
operations it reads back its own five small "sentinel" entries, written once at
the start and never deleted.

Checked, and printed as a table (JSON in benchmarks/results/stress-<backend>.json):

* torn reads: values served that fail their self-check or belong to another key;
* lost entries: sentinel reads that miss or differ. Without a cap (Redis, or
  ``--cap-mb 0``) this must be 0. Under a cap it counts LRU evictions of
  sentinels, which are by design when a starved thread leaves its sentinels
  colder than the churn (a loss event puts the sentinel back);
* the size cap (directory): the parent samples the stored bytes four times a
  second and reports the peak; after the workers stop, the total must be under
  ``max_size`` (after one ``enforce_size``). Redis is not capped by us;
  ``used_memory`` is reported;
* the stats: each process's ``cache.stats()`` must match what its threads saw
  (hits, misses, stores; no ``corrupt``).

Usage::

    python benchmarks/stress.py --backend dir --processes 8 --threads 4 --seconds 60
    python benchmarks/stress.py --backend redis --processes 8 --threads 4 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import xxhash
from _common import machine_info, write_json

import runtime_cache as rc

_HEAD = struct.Struct("<4sQQ")  # magic, xxh3 of the key text, xxh3 of the body
_MAGIC = b"RCST"
SHARED_KEYS = 1500
SENTINELS = 5
DIR_CAP = 64 << 20
REDIS_CAP = 0


def key(name: str) -> rc.CacheKey:
    """The cache key for ``name``."""
    return rc.make_key(module_id=name, runtime="stress", purpose="test", device={"d": 1})


def make_value(name: str, size: int, rng: random.Random) -> bytes:
    """A value that names its key and carries a checksum of its body."""
    body = rng.randbytes(size)
    sums = (xxhash.xxh3_64_intdigest(name.encode()), xxhash.xxh3_64_intdigest(body))
    return _HEAD.pack(_MAGIC, *sums) + body


def value_ok(value: bytes, name: str) -> bool:
    """Whether ``value`` is whole and was made for ``name``."""
    if len(value) < _HEAD.size:
        return False
    magic, key_sum, body_sum = _HEAD.unpack_from(value)
    return (
        magic == _MAGIC
        and key_sum == xxhash.xxh3_64_intdigest(name.encode())
        and body_sum == xxhash.xxh3_64_intdigest(value[_HEAD.size :])
    )


# --------------------------------------------------------------------- worker
def _thread(cache: rc.Cache, tag: str, seed: int, deadline: float, out: dict[str, int]) -> None:
    try:
        _mix(cache, tag, seed, deadline, out)
    except Exception:  # an exception reaching the caller is a failure: count it
        logging.getLogger(__name__).exception("thread %s failed", tag)
        out["thread_errors"] += 1


def _mix(cache: rc.Cache, tag: str, seed: int, deadline: float, out: dict[str, int]) -> None:
    rng = random.Random(seed)
    sentinels = [f"sentinel/{tag}/{i}" for i in range(SENTINELS)]
    expected = {name: make_value(name, 1000, rng) for name in sentinels}
    for name in sentinels:
        if cache.put(key(name), expected[name]):
            out["puts_ok"] += 1
        else:
            out["puts_failed"] += 1
    ops = 0
    while time.monotonic() < deadline:
        ops += 1
        if ops % 5 == 0:
            for name in sentinels:
                got = cache.get(key(name))
                out["hits" if got is not None else "misses"] += 1
                if got != expected[name]:
                    out["lost"] += 1  # one loss event; put it back so later checks mean something
                    stored = cache.put(key(name), expected[name])
                    out["puts_ok" if stored else "puts_failed"] += 1
        name = f"shared/{rng.randrange(SHARED_KEYS)}"
        op = rng.random()
        if op < 0.45:
            got = cache.get(key(name))
            out["hits" if got is not None else "misses"] += 1
            if got is not None and not value_ok(got, name):
                out["torn"] += 1
        elif op < 0.75:
            stored = cache.put(key(name), make_value(name, rng.randint(1, 128 << 10), rng))
            out["puts_ok" if stored else "puts_failed"] += 1
        elif op < 0.80:
            cache.delete(key(name))
            out["deletes"] += 1
        else:
            built = []

            def build(name: str = name, built: list[int] = built) -> bytes:
                built.append(1)
                return make_value(name, rng.randint(1, 32 << 10), rng)

            got = cache.get_or_build(key(name), build)
            if built:
                out["misses"] += 1
                out["builds"] += 1
            else:
                out["hits"] += 1
            if not value_ok(got, name):
                out["torn"] += 1
    out["ops"] += ops


def run_worker(url: str, index: int, threads: int, seconds: float) -> dict[str, Any]:
    """One worker process: ``threads`` threads on one Cache; returns its counts and stats."""
    cache = rc.Cache(rc.open_backend(url), secret="stress secret")  # shared stores are signed
    names = ["ops", "hits", "misses", "puts_ok", "puts_failed", "deletes", "builds"]
    counts = [dict.fromkeys([*names, "torn", "lost", "thread_errors"], 0) for _ in range(threads)]
    deadline = time.monotonic() + seconds
    seed = index * 100
    workers = [
        threading.Thread(target=_thread, args=(cache, f"p{index}t{t}", seed + t, deadline, c))
        for t, c in enumerate(counts)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seen = {name: sum(c[name] for c in counts) for name in counts[0]}
    stats = cache.stats()
    cache.close()
    # The front's counters must agree with what the threads saw. A store that
    # failed inside get_or_build is an error, so stores may fall short by those.
    consistent = (
        stats.hits == seen["hits"]
        and stats.misses == seen["misses"]
        and stats.corrupt == 0
        and stats.stores + stats.errors >= seen["puts_ok"] + seen["builds"]
        and stats.stores <= seen["puts_ok"] + seen["builds"]
    )
    return {**seen, "stats": stats.as_dict(), "stats_consistent": consistent}


# --------------------------------------------------------------------- parent
@contextmanager
def _directory(cap: int) -> Any:
    folder = Path(tempfile.mkdtemp(prefix="rc-stress-"))
    try:
        yield f"dir://{folder}?max_size={cap or 'none'}", cap, lambda: _dir_bytes(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _dir_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*.rce"):
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


@contextmanager
def _redis(cap: int) -> Any:  # Redis is not capped by us: cap is 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import redis
    from redis_servers import running_server

    with running_server() as server:
        client = redis.Redis(port=server.port)
        # No maxmemory: the server's own eviction (LRU at 1 s resolution) would
        # drop hot entries too, and that is Redis' policy, not a loss of ours.

        def used() -> int:
            return int(client.info("memory")["used_memory"])

        yield server.url, cap, used
        client.close()


def run(
    backend: str, processes: int, threads: int, seconds: float, cap: int | None = None
) -> dict[str, Any]:
    """Run the stress test; return the summary."""
    if cap is None:
        cap = DIR_CAP if backend == "dir" else REDIS_CAP
    store: AbstractContextManager[Any] = _directory(cap) if backend == "dir" else _redis(cap)
    with store as (url, cap, measure):
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", url, str(i), str(threads), str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(processes)
        ]
        peak = 0
        started = time.monotonic()
        while any(p.poll() is None for p in procs):
            peak = max(peak, measure())
            time.sleep(0.25)
        results = [json.loads(p.communicate()[0]) for p in procs]
        wall = time.monotonic() - started
        at_end = measure()
        if backend == "dir" and cap:
            from runtime_cache.backends.directory import DirectoryBackend

            DirectoryBackend(url[len("dir://") :].split("?")[0], max_size=cap).enforce_size()
        after = measure()
    capped = backend == "dir" and cap > 0
    counted = ["ops", "hits", "misses", "puts_ok", "puts_failed", "deletes", "builds"]
    counted += ["torn", "lost", "thread_errors"]
    total = {name: sum(r[name] for r in results) for name in counted}
    return {
        "benchmark": f"stress-{backend}",
        **machine_info(),
        "backend": backend,
        "processes": processes,
        "threads": threads,
        "seconds": seconds,
        "wall_seconds": round(wall, 1),
        **total,
        "ops_per_second": round(total["ops"] / seconds),
        "errors": sum(r["stats"]["errors"] for r in results),
        "corrupt": sum(r["stats"]["corrupt"] for r in results),
        "stats_consistent": all(r["stats_consistent"] for r in results),
        "capped": capped,
        "cap_bytes": cap,
        "peak_bytes": peak,
        "peak_over_cap": round(peak / cap, 3) if cap else None,
        "bytes_at_end": at_end,
        "bytes_after_enforce": after,
        "cap_holds_at_rest": after <= cap if capped else None,
        "per_process": results,
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print a table and write JSON; exit 1 when a check fails."""
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--worker":
        logging.basicConfig(level=logging.ERROR)
        logging.getLogger("runtime_cache").setLevel(logging.CRITICAL)
        result = run_worker(args[1], int(args[2]), int(args[3]), float(args[4]))
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["dir", "redis"], default="dir")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--cap-mb", type=int, help="directory size cap, 0 for none (default 64)")
    parser.add_argument("--out", type=Path)
    opts = parser.parse_args(args)
    cap = None if opts.cap_mb is None else opts.cap_mb << 20
    result = run(opts.backend, opts.processes, opts.threads, opts.seconds, cap)
    out = opts.out or Path(__file__).parent / "results" / f"stress-{opts.backend}.json"
    write_json(out, result)
    for name, value in result.items():
        if name != "per_process":
            print(f"{name:<22} {value}")
    ok = (
        result["torn"] == 0
        and (result["capped"] or result["lost"] == 0)  # under a cap, LRU may evict them
        and result["thread_errors"] == 0
        and result["ops"] > 0
        and result["corrupt"] == 0
        and result["stats_consistent"]
        and result["cap_holds_at_rest"] is not False
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
