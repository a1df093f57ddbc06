"""Benchmark a fleet's cold start: N processes build one module on one shared cache.

Every figure comes from one run of this script. Each scenario uses fresh kernel
sources (a salt) and an empty cache. With ``--driver-cache on`` (the default)
each process, the lone ones included, carries the driver's own cache
(``RUNTIME_CACHE_DRIVER_CACHE=1``) in a fresh, empty folder of its own
(``RUNTIME_CACHE_DRIVER_DIR``), as separate machines would; ``off`` turns the
drivers' caches off. Every process calls ``build_all()`` with its default
pool, sized to its CPU affinity:

* ``lone_pinned``: one process pinned to ``--cores-per`` cores (``taskset``):
  one small machine alone.
* ``fleet_pinned_<backend>``: ``--procs`` processes, each pinned to its own
  ``--cores-per`` cores, as that many small machines on one shared cache.
* ``lone``: one unpinned process, ``build_all()`` on every core.
* ``fleet_<backend>``: ``--procs`` unpinned processes at once.

Every child imports, opens its context and plans its module first, then waits
for a "go" line; the wall time runs from "go" until the last child is ready
(its ``build_all()`` returned). ``compile_seconds`` sums the CPU seconds of
every source build, over all processes, measured where the build runs (the
build worker's ``time.process_time()`` around its build, or the building
thread's ``time.thread_time()``; ``OpenCLStats.compile_cpu_seconds``): CPU
time does not stretch when more compiles run at once than there are cores.
``compile_wall_seconds`` sums each build's wall time instead, and
``cpu_seconds`` is the user + system time of each process and its build
workers during ``build_all()`` (start-ups and loads included). Backends:
``dir`` (a folder on local disk) and ``redis`` (a ``redis-server`` from PATH on
loopback, when one runs), both with a secret. Pinned scenarios need
``procs * cores_per`` cores and are skipped with a note otherwise. Prints a table and writes JSON.

Usage::

    python benchmarks/bench_fleet.py --n 100 --procs 8 --cores-per 2 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host_platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from _common import kernel_sources, write_json

HERE = Path(__file__).resolve().parent
SECRET = "bench-secret"


# ----------------------------------------------------------------------------- child side
def _cpu() -> float:
    """User + system seconds of this process and its reaped children (the build workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(url: str, n: int, salt: str, workers: int | None, carry: bool) -> dict[str, Any]:
    """Plan the module, wait for "go" on stdin, build it all; return the figures."""
    import runtime_cache as rc
    from runtime_cache.opencl import (
        OpenCLModule,
        device_fingerprint,
        opencl_stats,
        prepare_driver_cache,
    )

    if carry:
        prepare_driver_cache()  # before the driver starts
    import pyopencl as cl

    index = int(os.environ.get("BENCH_PLATFORM", "0"))
    ctx = cl.Context([cl.get_platforms()[index].get_devices()[0]])
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    module = OpenCLModule(ctx, kernel_sources(n, salt), cache=cache, driver_cache=carry)
    for name in module.sources:
        module._plan(name)  # planning (options, fingerprints) is not the build: done before "go"
    phases = _time_phases(module)
    print("set", flush=True)
    sys.stdin.readline()
    before = _cpu()
    started = time.time()
    built_here = module.build_all(workers=workers)
    ready = time.time()
    cpu = _cpu() - before
    stats, cstats = opencl_stats(), cache.stats()
    return {
        "device": device_fingerprint(ctx.devices[0]),
        "started": started,
        "ready": ready,
        "built_here": built_here,
        "source_builds": stats.source_builds,
        "binary_loads": stats.binary_loads,
        "compile_seconds": stats.compile_cpu_seconds,
        # Wall seconds of the programs built here (0.0 marks a loaded one).
        "compile_wall_seconds": sum(module._seconds.values()),
        "cpu_seconds": cpu,
        "driver_files_published": stats.driver_files_published,
        "driver_files_restored": stats.driver_files_restored,
        "leases_won": cstats.leases_won,
        "lease_waits": cstats.lease_waits,
        "wait_seconds": cstats.wait_seconds,
        "takeovers": cstats.takeovers,
        "cpus": len(os.sched_getaffinity(0)),
        # Seconds (summed over threads) spent starting workers, restoring driver files, loading.
        "phases": dict(phases),
    }


def _time_phases(module: Any) -> dict[str, float]:
    """Sum the wall time of a few inner steps (a diagnostic; the library is unchanged)."""
    import threading

    from runtime_cache.opencl import parallel, program_files

    sums = {"worker_start": 0.0, "worker_starts": 0.0, "restore": 0.0, "load": 0.0}
    lock = threading.Lock()

    def timed(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                with lock:
                    sums[name] += time.perf_counter() - started
                    if name == "worker_start":
                        sums["worker_starts"] += 1

        return wrapper

    parallel.start_worker = timed("worker_start", parallel.start_worker)  # type: ignore[assignment]
    files = program_files.ProgramFiles
    files.restore = timed("restore", files.restore)  # type: ignore[method-assign]
    module._load_cached = timed("load", module._load_cached)
    return sums


# ---------------------------------------------------------------------------- parent side
def _env(scratch: Path, carry: bool) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("RUNTIME_CACHE", "POCL_CACHE_DIR", "CUDA_CACHE_PATH"):
        env.pop(name, None)
    if carry:  # a fresh, empty driver folder of its own, as on a machine of its own
        env.update(RUNTIME_CACHE_DRIVER_CACHE="1", RUNTIME_CACHE_DRIVER_DIR=str(scratch))
        return env
    env.update(POCL_KERNEL_CACHE="0", CUDA_CACHE_DISABLE="1", RUNTIME_CACHE_DRIVER_CACHE="0")
    env["POCL_CACHE_DIR"] = str(scratch)  # PoCL's uncached scratch is not safe across processes
    return env


def scenario(
    url: str,
    n: int,
    procs: int,
    workers: int | None,
    cores: list[list[int]] | None,
    tmp: Path,
    carry: bool = True,
) -> dict[str, Any]:
    """Run ``procs`` children cold on one cache; return the wall time and the sums."""
    salt = uuid.uuid4().hex
    children = []
    for i in range(procs):
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "--url", url]
        command += ["--n", str(n), "--salt", salt, "--workers", str(workers or 0)]
        command += ["--driver-cache", "on" if carry else "off"]
        if cores is not None:
            command = ["taskset", "-c", ",".join(map(str, cores[i])), *command]
        scratch = tmp / f"driver-{salt[:8]}-{i}"
        children.append(
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(scratch, carry),
            )
        )
    for proc in children:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "set":
            raise RuntimeError(f"child failed to start: {line!r} {proc.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    go = time.time()
    for proc in children:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in children:
        out, err = proc.communicate(timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"child failed:\n{err[-4000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    sums = {
        key: sum(r[key] for r in results)
        for key in (
            "source_builds",
            "binary_loads",
            "compile_seconds",
            "compile_wall_seconds",
            "cpu_seconds",
            "leases_won",
            "driver_files_published",
            "driver_files_restored",
        )
    }
    sums.update(
        lease_waits=sum(r["lease_waits"] for r in results),
        wait_seconds=sum(r["wait_seconds"] for r in results),
        takeovers=sum(r["takeovers"] for r in results),
    )
    return {
        "procs": procs,
        "workers": workers or max(r["cpus"] for r in results),
        "pinned": cores,
        "wall_seconds": max(r["ready"] for r in results) - go,
        "first_ready_seconds": min(r["ready"] for r in results) - go,
        **sums,
        "per_process": [{k: v for k, v in r.items() if k != "device"} for r in results],
        "device": results[0]["device"],
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str] | None:
    """A ``redis-server`` on loopback, or ``None`` when none runs here."""
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    if binary is None:
        return None
    port = _free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(folder)]
    try:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
        if proc.poll() is not None:
            return None
    proc.kill()
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=100, help="kernels (programs)")
    parser.add_argument("--procs", type=int, default=8, help="processes in the fleet")
    parser.add_argument("--cores-per", type=int, default=2, help="cores of each pinned process")
    parser.add_argument("--backends", default="dir,redis")
    parser.add_argument("--machine", default=host_platform.node(), help="named in the results")
    parser.add_argument("--json", default="benchmarks/results/fleet.json")
    parser.add_argument(
        "--driver-cache",
        choices=("on", "off"),
        default="on",
        help="carry the driver's own cache, each process in a fresh folder (default on)",
    )
    parser.add_argument("--note", action="append", default=[], help="a note for the results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--salt", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        carry = args.driver_cache == "on"
        print(json.dumps(child(args.url, args.n, args.salt, args.workers or None, carry)))
        return 0

    cpus = sorted(os.sched_getaffinity(0))
    tmp = Path(tempfile.mkdtemp(prefix="rc-fleet-"))
    notes: list[str] = list(args.note)
    carry = args.driver_cache == "on"
    redis = start_redis(tmp) if "redis" in args.backends.split(",") else None
    backends = {"dir": lambda name: f"dir://{tmp / name}"} if "dir" in args.backends else {}
    if redis is not None:
        backends["redis"] = lambda name: f"{redis[1]}?prefix={name}:"
    elif "redis" in args.backends:
        notes.append("redis: no redis-server runs here; dir only")
    pinnable = len(cpus) >= args.procs * args.cores_per and shutil.which("taskset") is not None
    groups = [cpus[i * args.cores_per : (i + 1) * args.cores_per] for i in range(args.procs)]
    if not pinnable:
        notes.append(f"pinned scenarios skipped: {len(cpus)} cores < procs x cores-per")
    first = next(iter(backends.values()))
    load_start = os.getloadavg()
    runs: dict[str, Any] = {}
    try:
        if pinnable:
            runs["lone_pinned"] = scenario(
                first("lone-pinned"), args.n, 1, None, groups[:1], tmp, carry
            )
            for name, url in backends.items():
                runs[f"fleet_pinned_{name}"] = scenario(
                    url(f"pinned-{name}"), args.n, args.procs, None, groups, tmp, carry
                )
        runs["lone"] = scenario(first("lone"), args.n, 1, None, None, tmp, carry)
        for name, url in backends.items():
            runs[f"fleet_{name}"] = scenario(
                url(f"fleet-{name}"), args.n, args.procs, None, None, tmp, carry
            )
    finally:
        if redis is not None:
            redis[0].kill()
            redis[0].wait()
        shutil.rmtree(tmp, ignore_errors=True)

    ratios: dict[str, float] = {}
    acceptance: dict[str, bool] = {}
    if "lone_pinned" in runs:
        lone = runs["lone_pinned"]
        for name in backends:
            fleet = runs[f"fleet_pinned_{name}"]
            wall = fleet["wall_seconds"] / lone["wall_seconds"]
            compile_ratio = fleet["compile_seconds"] / lone["compile_seconds"]
            ratios[f"pinned_{name}_wall_over_lone"] = wall
            ratios[f"pinned_{name}_compile_over_lone"] = compile_ratio
            ratios[f"pinned_{name}_compile_wall_over_lone"] = (
                fleet["compile_wall_seconds"] / lone["compile_wall_seconds"]
            )
            ratios[f"pinned_{name}_cpu_over_lone"] = fleet["cpu_seconds"] / lone["cpu_seconds"]
            acceptance[f"pinned_{name}_wall<=0.25"] = wall <= 0.25
            acceptance[f"pinned_{name}_compile<=1.3"] = compile_ratio <= 1.3
    for name in backends:
        fleet, lone = runs[f"fleet_{name}"], runs["lone"]
        wall = fleet["wall_seconds"] / lone["wall_seconds"]
        compile_ratio = fleet["compile_seconds"] / lone["compile_seconds"]
        ratios[f"unpinned_{name}_wall_over_lone"] = wall
        ratios[f"unpinned_{name}_compile_over_lone"] = compile_ratio
        ratios[f"unpinned_{name}_compile_wall_over_lone"] = (
            fleet["compile_wall_seconds"] / lone["compile_wall_seconds"]
        )
        ratios[f"unpinned_{name}_cpu_over_lone"] = fleet["cpu_seconds"] / lone["cpu_seconds"]
        acceptance[f"unpinned_{name}_wall<=1.3"] = wall <= 1.3
        acceptance[f"unpinned_{name}_compile<=1.3"] = compile_ratio <= 1.3

    device = runs["lone"]["device"]
    print(f"device: {device.get('name')} | {device.get('platform_version')} | n={args.n}")
    print(f"machine: {args.machine} | {len(cpus)} cores | notes: {'; '.join(notes) or '-'}")
    print(
        f"{'scenario':24} {'procs':>5} {'wall s':>8} {'compile s':>10} {'cpu s':>8} "
        f"{'builds':>7} {'loads':>6} {'waits':>6} {'takeovers':>9}"
    )
    for name, run in runs.items():
        wall, work = run["wall_seconds"], run["compile_seconds"]
        print(
            f"{name:24} {run['procs']:5d} {wall:8.2f} {work:10.2f} {run['cpu_seconds']:8.2f} "
            f"{run['source_builds']:7d} {run['binary_loads']:6d} {run['lease_waits']:6d} "
            f"{run['takeovers']:9d}"
        )
    print()
    for key, value in ratios.items():
        print(f"{key:36} {value:7.3f}")
    for key, passed in acceptance.items():
        print(f"{key:36} {'pass' if passed else 'FAIL'}")
    result = {
        "benchmark": "fleet",
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": args.machine,
            "host": {"machine": host_platform.machine(), "cpus": len(cpus)},
            "device": device.get("name"),
            "platform": device.get("platform_version"),
            "n": args.n,
            "procs": args.procs,
            "cores_per": args.cores_per,
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "driver_cache": carry,
            "compile_seconds": "CPU seconds of the source builds, measured where each runs",
            "notes": notes,
        },
        "results": {
            name: {k: v for k, v in run.items() if k not in ("per_process", "device", "pinned")}
            for name, run in runs.items()
        },
        "per_process": {name: run["per_process"] for name, run in runs.items()},
        "ratios": ratios,
        "acceptance": acceptance,
    }
    print(f"wrote {write_json(args.json, result, indent=1)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
