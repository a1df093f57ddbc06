"""Warm OpenCL loads against the floor, in rotating rounds of fresh processes.

The floor is plain pyopencl: for each program it reads the binary a source build stored
(one file per program), creates the program from it, builds it, and makes its kernel.
Ours does the same through runtime-cache, in two ways: ``lazy`` asks for one kernel at a
time (``OpenCLModule.kernel(name)``, which loads its program on first use), and ``all``
calls ``OpenCLModule.build_all()`` and then makes each kernel. Every side runs in a fresh
process; within a round the sides run in an order that rotates from round to round,
because a shared machine is noisy. Per side the result is the median over the rounds;
per pair, the median of the per-round ratios, with a bootstrap 95% interval.

What is timed, in the child, with ``time.perf_counter``: from just before the first call
into runtime-cache (``OpenCLModule(...)``, which opens the default cache, ``dir://`` from
``RUNTIME_CACHE``) or, for the floor, just before its first file read, to the last
kernel made. Imports and the OpenCL context are made before the clock starts. The
*first* time is the same clock stopped at the first kernel made (lazy and floor): the
start-up overhead is lazy's first minus the floor's first, paired per round, so it holds
the cache's fixed cost (backend open, device fingerprint, guard files) and not imports.

Driver caches (``--driver-cache``):

* ``off``: the driver's own cache off (``POCL_KERNEL_CACHE=0``, ``CUDA_CACHE_DISABLE=1``);
  PoCL's scratch folder is a fresh tmpfs folder per process.
* ``on``: the driver's cache on, in one folder the cold fill and a warm-up round left warm;
  ``source`` (plain source builds, the driver cache alone) runs in the same rounds.
* ``carry``: ``carry`` (ours, ``driver_cache=True``, ``build_all()``) in a process whose
  driver folder is new and empty, so runtime-cache restores the driver's files, against
  ``source`` (plain source builds with the driver's cache warm: the driver cache alone).

Examples::

    python benchmarks/bench_floor.py --platform 0 --rounds 15 --machine pocl-3.1
    PYOPENCL_CTX=0 python benchmarks/bench_floor.py --driver-cache on --n 100,12,1

``--known 20000`` starts from a crash guard whose list of known binaries is full, as on a
machine long in use: every process's first load looks its binary up in that list.

Writes ``benchmarks/results/floor-<machine>[-driver-cache-<mode>].json`` (or ``--json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _common, also when a child runs this file

from _common import (  # noqa: E402
    RESULTS,
    add_child_arguments,
    child_env,
    kernel_sources,
    machine_info,
    run_child,
    write_json,
)
from floor_stats import print_report, summarize  # noqa: E402

#: What each side's clock covers (written into the JSON).
TIMED = {
    "floor": "per program: read its binary file, pyopencl.Program(ctx, devices, [binary])"
    ".build(), pyopencl.Kernel(program, name)",
    "lazy": "OpenCLModule(ctx, sources) on the default cache (dir:// from RUNTIME_CACHE), "
    "then OpenCLModule.kernel(name) for each kernel in turn (its program loads on first use)",
    "all": "OpenCLModule(ctx, sources) on the default cache, build_all(), then "
    "OpenCLModule.kernel(name) for each kernel",
    "carry": "OpenCLModule(ctx, sources, driver_cache=True) in a process whose driver "
    "folder is new and empty, build_all() (restores the driver's files first), then each kernel",
    "source": "per program: pyopencl.Program(ctx, source).build(), pyopencl.Kernel(program, "
    "name), with the driver's own cache warm (the driver cache alone)",
    "first": "the same clock, stopped when the first kernel is made (floor and lazy); "
    "first_cpu: the CPU time to that point",
    "cpu": "time.process_time() over the same span: CPU time of all the process's threads, "
    "driver threads included; steadier than the clock on a shared machine",
    "excluded": "interpreter start, imports (pyopencl, runtime_cache.opencl, and the "
    "pyopencl.characterize and pyopencl.invoker modules pyopencl imports on its first build "
    "or kernel), platform and context creation; the process's exit",
    "gc": "gc.collect() just before the clock starts, on every side (from the eighth "
    "round on): no side pays for a collection of what the imports made",
}

#: The sides of each ``--driver-cache`` mode, and the pairs whose ratios are reported.
SIDES = {
    "off": ["floor", "lazy", "all"],
    "on": ["floor", "lazy", "all", "source"],
    "carry": ["carry", "source"],
}
#: With the driver's cache on, ``source`` is the driver cache alone: ``lazy/source`` and
#: ``all/source`` are "ours + driver cache / the driver cache alone", and ``floor/source``
#: is the least any binary cache can reach on that driver.
PAIRS = {
    "off": [("lazy", "floor"), ("all", "floor")],
    "on": [
        ("lazy", "floor"),
        ("all", "floor"),
        ("lazy", "source"),
        ("all", "source"),
        ("floor", "source"),
    ],
    "carry": [("carry", "source")],
}


# ----------------------------------------------------------------------------- child side
def _context() -> Any:
    import pyopencl as cl

    from runtime_cache.opencl import choose_device  # also makes Intel's PyPI runtime visible

    index = os.environ.get("BENCH_PLATFORM", "")
    # Without --platform, PYOPENCL_CTX chooses the driver.
    device = cl.get_platforms()[int(index)].get_devices()[0] if index else choose_device()
    return cl.Context([device])


def store_floor_binaries(module: Any, bins: Path, names: list[str]) -> None:
    """Write the binaries the floor loads into ``bins``: each program's, one file each."""
    import pyopencl as cl

    bins.mkdir(exist_ok=True)
    for name in names:
        binary = module.program(name).get_info(cl.program_info.BINARIES)[0]
        (bins / f"{name}.bin").write_bytes(bytes(binary))


def child(side: str, n: int, salt: str, folder: str) -> dict[str, Any]:
    """Run one side in this (fresh) process; return its numbers."""
    import pyopencl as cl

    from runtime_cache.opencl import (
        OpenCLModule,
        device_fingerprint,
        opencl_stats,
        prepare_driver_cache,
    )

    if side in ("carry", "fill-carry"):
        prepare_driver_cache()  # before the driver starts: it reads its folder variable then
    # pyopencl imports these on its first build() or Kernel: the floor's build() pays the
    # first, ours (which skips that wrapper) pays it in the first Kernel. Imported here, on
    # every side, they leave pyopencl's own import costs out of every clock alike.
    import pyopencl.characterize
    import pyopencl.invoker

    ctx = _context()
    devices = ctx.devices
    sources = kernel_sources(n, salt)
    names = list(sources)
    bins = Path(folder) / f"floor-{n}"
    first = first_cpu = None
    kernels = []
    # Every side's clock starts with the collector's counts at zero. Left where the imports
    # put them, one side's first allocations could set off a collection of everything those
    # imports made (1.0-1.5 ms on the H200's host) and the other's not: the harness's cost.
    gc.collect()
    cpu = time.process_time()
    if side.startswith("fill"):
        module = OpenCLModule(ctx, sources, driver_cache=side == "fill-carry")
        module.build_all()
        store_floor_binaries(module, bins, names)
        if side == "fill-carry":
            module.capture_driver_cache()
        seconds = 0.0
    elif side == "floor":
        started = time.perf_counter()
        for name in names:
            with open(bins / f"{name}.bin", "rb") as f:
                binary = f.read()
            kernels.append(cl.Kernel(cl.Program(ctx, devices, [binary]).build(), name))
            if first is None:
                first = time.perf_counter() - started
                first_cpu = time.process_time() - cpu
        seconds = time.perf_counter() - started
    elif side == "source":
        started = time.perf_counter()
        for name in names:
            kernels.append(cl.Kernel(cl.Program(ctx, sources[name]).build(), name))
        seconds = time.perf_counter() - started
    elif side == "lazy":
        started = time.perf_counter()
        module = OpenCLModule(ctx, sources)
        for name in names:
            kernels.append(module.kernel(name))
            if first is None:
                first = time.perf_counter() - started
                first_cpu = time.process_time() - cpu
        seconds = time.perf_counter() - started
    elif side in ("all", "carry"):
        started = time.perf_counter()
        module = OpenCLModule(ctx, sources, driver_cache=side == "carry")
        module.build_all()
        kernels = [module.kernel(name) for name in names]
        seconds = time.perf_counter() - started
    else:
        raise SystemExit(f"unknown side {side}")
    cpu = time.process_time() - cpu
    assert len(kernels) == n or side.startswith("fill")
    stats = opencl_stats()
    counts: dict[str, int] = {}
    if side in ("lazy", "all", "carry"):
        import runtime_cache as rc

        cache = rc.get_cache().stats()
        counts = {"cache_misses": cache.misses, "cache_errors": cache.errors}
    return {
        **counts,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "first": first,
        "first_cpu": first_cpu,
        "source_builds": stats.source_builds,
        "binary_loads": stats.binary_loads,
        "rejected_binaries": stats.rejected_binaries,
        "vetted": stats.vetted,
        "device": device_fingerprint(devices[0]),
    }


# ---------------------------------------------------------------------------- parent side
class Runner:
    """Starts the child processes of one run, each with the environment its side needs."""

    def __init__(self, top: Path, mode: str, scratch: Path, platform: str | None) -> None:
        self.top, self.mode, self.scratch = top, mode, scratch
        self.env = child_env(top, platform)
        self.warm_driver = scratch / "driver-warm"

    def _driver_env(self, side: str) -> tuple[dict[str, str], Path | None]:
        """The driver-cache variables of ``side``, and a folder to remove afterwards."""
        env = dict(self.env)
        for name in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH", "POCL_KERNEL_CACHE"):
            env.pop(name, None)
        env.pop("CUDA_CACHE_DISABLE", None)
        fresh = Path(tempfile.mkdtemp(prefix="proc-", dir=self.scratch))
        warm = self.mode == "on" or side == "source" or side == "fill-source"
        if side in ("carry", "fill-carry"):
            # Our driver folder: prepare_driver_cache() points the drivers into it.
            where = self.top / "driver-carried" if side == "fill-carry" else fresh
            env.update(RUNTIME_CACHE_DRIVER_DIR=str(where), POCL_KERNEL_CACHE="1")
            env["CUDA_CACHE_MAXSIZE"] = str(4 << 30)
        elif warm:
            env.update(
                POCL_KERNEL_CACHE="1",
                POCL_CACHE_DIR=str(self.warm_driver),
                CUDA_CACHE_PATH=str(self.warm_driver),
                CUDA_CACHE_MAXSIZE=str(4 << 30),
            )
        else:
            env.update(POCL_KERNEL_CACHE="0", POCL_CACHE_DIR=str(fresh), CUDA_CACHE_DISABLE="1")
        return env, fresh

    def run(self, side: str, n: int, salt: str) -> dict[str, Any]:
        env, fresh = self._driver_env(side)
        try:
            result: dict[str, Any] = run_child(__file__, side, n, salt, self.top, env)
        finally:
            if fresh is not None:
                shutil.rmtree(fresh, ignore_errors=True)
        if side in ("lazy", "all", "carry"):
            assert result["source_builds"] == 0 and result["binary_loads"] == n, result
        return result


def fill_known_list(folder: Path, count: int) -> None:
    """Put ``count`` marks of other binaries on the crash guard's known list in ``folder``
    (appended to its log, as earlier processes leave them)."""
    if count <= 0:
        return
    import xxhash

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    marks = (xxhash.xxh3_128_hexdigest(f"other binary {i}".encode()) for i in range(count))
    with open(folder / "vetted", "a", encoding="ascii") as log:
        log.write("".join(f"{m}\n" for m in marks))


def main() -> int:
    """Fill the cache, run the rounds, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", default="100,12,1", help="programs per process, comma-separated")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--driver-cache", choices=("off", "on", "carry"), default="off")
    parser.add_argument(
        "--platform", default=None, help="platform index (default: PYOPENCL_CTX, or the first)"
    )
    parser.add_argument("--machine", default=None, help="a label for the file name and tables")
    parser.add_argument("--json", default=None, help="results path (default from --machine)")
    parser.add_argument(
        "--scratch", default=None, help="driver folders (default: a folder in /dev/shm)"
    )
    parser.add_argument(
        "--known",
        type=int,
        default=0,
        help="marks already on the crash guard's known list, as on a machine long in use "
        "(its cap is 20000; default 0: a new guard folder)",
    )
    add_child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, int(args.n), args.salt, args.dir)))
        return 0

    ns = [int(v) for v in args.n.split(",") if v.strip()]
    mode = args.driver_cache
    top = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    shm = Path("/dev/shm")
    base = Path(args.scratch) if args.scratch else (shm if shm.is_dir() else top)
    base.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-floor-", dir=base))
    runner = Runner(top, mode, scratch, args.platform)
    fill_known_list(top / "guard", args.known)
    run_id = uuid.uuid4().hex[:8]
    sides = SIDES[mode]
    started, load_start = time.time(), os.getloadavg()
    device: dict[str, Any] = {}
    times = {n: {s: [] for s in sides} for n in ns}
    cpu = {n: {s: [] for s in sides} for n in ns}
    firsts: dict[int, dict[str, list[float]]] = {n: {"lazy": [], "floor": []} for n in ns}
    first_cpu: dict[int, dict[str, list[float]]] = {n: {"lazy": [], "floor": []} for n in ns}
    try:
        for n in ns:  # one cold fill per n; then one untimed warm-up of every side
            salt = f"{run_id}-{n}"
            if mode == "carry":
                for _ in range(2):  # the second stores what the driver wrote after the first
                    runner.run("fill-carry", n, salt)
                runner.run("source", n, salt)  # warms the driver cache of the source side
            else:
                device = runner.run("fill", n, salt)["device"]
            for side in sides:
                device = runner.run(side, n, salt)["device"]
        for r in range(args.rounds):
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            line = []
            for n in ns:
                for side in order:
                    got = runner.run(side, n, f"{run_id}-{n}")
                    times[n][side].append(got["seconds"])
                    cpu[n][side].append(got["cpu_seconds"])
                    if side in firsts[n]:
                        firsts[n][side].append(got["first"])
                        first_cpu[n][side].append(got["first_cpu"])
                line.append(
                    f"n={n}: " + " ".join(f"{s} {times[n][s][-1] * 1000:.1f}" for s in sides)
                )
            print(f"round {r}: " + " | ".join(line) + " (ms)", flush=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)

    results = {
        str(n): summarize(
            times[n],
            cpu[n],
            firsts[n] if mode != "carry" else {},
            first_cpu[n],
            PAIRS[mode],
        )
        for n in ns
    }
    print_report(results, device, mode, ns, sides)
    label = args.machine or str(device.get("name", "device")).split()[0].lower()
    suffix = "" if mode == "off" else f"-driver-cache-{mode}"
    out = Path(args.json) if args.json else RESULTS / f"floor-{label}{suffix}.json"
    record = {
        "benchmark": "floor",
        "date": machine_info()["date"],
        "host": machine_info(),
        "machine_label": label,
        "device": device,
        "driver_cache": mode,
        "rounds": args.rounds,
        "known_marks": args.known,
        "n": ns,
        "sides": sides,
        "timed": TIMED,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "wall_seconds": time.time() - started,
        "results": results,
    }
    print(f"wrote {write_json(out, record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
