"""Benchmark the OpenCL consumer: cold, parallel, warm and raw-binary program loads.

N generated, distinct kernels (``--n``, default 100), one cl_program each. Every
measurement runs in a fresh child process (imports and context creation are
not timed), and each is repeated (``--reps``, default 5) to take medians:

(a) cold, sequential: ``OpenCLModule.program(name)`` for each kernel, empty cache
(b) cold, ``build_all()`` in parallel (worker processes), empty cache
(c) warm through runtime-cache: a fresh process, ``OpenCLModule(...).build_all()``
    (reads, checks and loads the cached programs on one thread per core)
(c2) warm, one program at a time: ``OpenCLModule.program(name)`` for each kernel,
    on one thread (not an acceptance figure; it shows the cost without overlap)
(d) floor: raw ``pyopencl.Program(ctx, devs, [binary]).build()`` on the same binaries
(e) pyopencl's own binary cache (``pyopencl.cache``), cold and warm; ``Program.build``
    uses it only on platforms without a driver cache (not on PoCL or NVIDIA)
(f) the driver's own cache (PoCL: POCL_KERNEL_CACHE=1; NVIDIA: the CUDA ComputeCache)
    for plain source builds, cold and warm
(g) the first launch of each kernel, after (a) and after (c), apart from the build
(h) warm, but as on another machine: the binaries are unknown to this guard folder
    and the cache is unsigned, so ``build_all()`` vets them in a child first
    (see runtime_cache.opencl.vetting); the once-per-machine cost of vetting
(i) warm as a fresh container: ``OpenCLModule(..., driver_cache=True)`` in a process
    whose driver folder is new and empty, so runtime-cache restores the driver's own
    JIT cache (runtime_cache.opencl.driver_cache) before the loads; against the same
    with the driver folder left warm by an earlier process (``i_ref``). The load and
    the first launches are timed apart (PoCL compiles at the first launch)

Cold runs use fresh sources (a salt) each time, so no driver cache can help them.
PoCL writes every program it creates into a scratch folder even with its cache
off (``~/.cache/pocl/uncached``); on a slow virtual disk that I/O swamps (c) and
(d) with noise. ``--pocl-scratch DIR`` moves it (``POCL_CACHE_DIR``) for every
phase, e.g. to a tmpfs, which leaves mostly the driver's own work in (d).
``--driver-cache on`` leaves the driver's cache on for every phase (the NVIDIA
second run); the default turns it off. ``PYOPENCL_CTX`` chooses the driver (an index
or part of a platform name, as pyopencl reads it). Prints a table and writes JSON to
``benchmarks/results/opencl-<label>.json``.

Usage::

    python benchmarks/bench_opencl.py --n 100 --reps 5
"""

from __future__ import annotations

import argparse
import datetime
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
    add_child_arguments,
    kernel_sources,
    machine_info,
    median,
    run_child,
    write_json,
)


# ----------------------------------------------------------------------------- child side
def _context() -> Any:
    import pyopencl as cl

    from runtime_cache.opencl import choose_device  # also makes Intel's PyPI runtime visible

    if "BENCH_PLATFORM" in os.environ:
        device = cl.get_platforms()[int(os.environ["BENCH_PLATFORM"])].get_devices()[0]
    else:
        device = choose_device()  # PYOPENCL_CTX chooses the driver
    return cl.Context([device])


def _first_launches(ctx: Any, programs: dict[str, Any]) -> list[float]:
    import numpy as np
    import pyopencl as cl

    queue = cl.CommandQueue(ctx)
    host = np.linspace(0, 1, 4096).astype(np.float32)
    mf = cl.mem_flags
    src = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
    dst = cl.Buffer(ctx, mf.READ_WRITE, host.nbytes)
    times = []
    for name, program in programs.items():
        kernel = cl.Kernel(program, name)
        started = time.perf_counter()
        kernel(queue, host.shape, None, dst, src)
        queue.finish()
        times.append(time.perf_counter() - started)
    return times


def child(phase: str, n: int, salt: str, folder: str) -> dict[str, Any]:
    """Run one measurement in this (fresh) process; return its numbers."""
    import msgpack
    import pyopencl as cl

    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import OpenCLModule, device_fingerprint, opencl_stats

    if phase == "driver":
        from runtime_cache.opencl import prepare_driver_cache

        prepare_driver_cache()  # before the driver starts: it reads its folder variable then
    ctx = _context()
    sources = kernel_sources(n, salt)
    result: dict[str, Any] = {"device": device_fingerprint(ctx.devices[0])}
    root = Path(folder)
    if phase in ("cold_seq", "cold_par", "warm", "warm_seq"):
        cache = rc.Cache(DirectoryBackend(root / "cache"))
        started = time.perf_counter()
        module = OpenCLModule(ctx, sources, cache=cache)
        if phase in ("cold_seq", "warm_seq"):
            for name in sources:
                module.program(name)
        else:
            module.build_all()
        result["seconds"] = time.perf_counter() - started
        stats = opencl_stats()
        result["source_builds"], result["binary_loads"] = stats.source_builds, stats.binary_loads
        result["vetted"] = stats.vetted
        programs = {name: module.program(name) for name in sources}
        if phase in ("cold_seq", "warm"):
            result["first_launch"] = _first_launches(ctx, programs)
        if phase == "cold_seq":
            binaries = [bytes(p.get_info(cl.program_info.BINARIES)[0]) for p in programs.values()]
            (root / "binaries.msgpack").write_bytes(msgpack.packb(binaries))
    elif phase == "driver":
        cache = rc.Cache(DirectoryBackend(root / "cache"))
        started = time.perf_counter()
        module = OpenCLModule(ctx, sources, cache=cache, driver_cache=True)
        module.build_all()
        result["seconds"] = time.perf_counter() - started
        stats = opencl_stats()
        result["source_builds"], result["binary_loads"] = stats.source_builds, stats.binary_loads
        programs = {name: module.program(name) for name in sources}
        result["first_launch"] = _first_launches(ctx, programs)
        assert module._driver is not None and module._driver.sessions
        result["restored_files"] = sum(s.restored for s in module._driver.sessions)
        result["restore_seconds"] = sum(s.restore_seconds for s in module._driver.sessions)
        module.capture_driver_cache()
        result["stored"] = len(list(cache.entries(purpose="driver-cache")))
    elif phase == "floor":
        binaries = msgpack.unpackb((root / "binaries.msgpack").read_bytes())
        devices = ctx.devices
        started = time.perf_counter()
        programs = [cl.Program(ctx, devices, [b]).build() for b in binaries]
        result["seconds"] = time.perf_counter() - started
        assert len(programs) == n
    elif phase == "pyopencl_cache":
        from pyopencl.cache import create_built_program_from_source_cached

        options_bytes = cl.Program._process_build_options(ctx, None)[0]
        started = time.perf_counter()
        for source in sources.values():
            create_built_program_from_source_cached(
                ctx, source, options_bytes, cache_dir=str(root / "pyopencl-cache")
            )
        result["seconds"] = time.perf_counter() - started
    elif phase == "driver_cache":
        started = time.perf_counter()
        for source in sources.values():
            cl.Program(ctx, source).build()
        result["seconds"] = time.perf_counter() - started
    else:
        raise SystemExit(f"unknown phase {phase}")
    return result


# ---------------------------------------------------------------------------- parent side
def _driver_phases(
    args: argparse.Namespace,
    env: dict[str, str],
    top: Path,
    warm_dirs: list[tuple[str, Path]],
    raw: dict[str, list[float]],
    launches: dict[str, list[float]],
) -> dict[str, list[int]]:
    """(i): two processes capture the driver's cache; then fresh-folder and warm-folder runs."""
    salt, folder = warm_dirs[0]
    base = Path(args.pocl_scratch) if args.pocl_scratch else top
    denv = {k: v for k, v in env.items() if k not in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")}
    restored: dict[str, list[int]] = {"i": [], "i_ref": []}
    restore_seconds: dict[str, list[float]] = {"i": [], "i_ref": []}
    raw["i_restore"], raw["i_ref_restore"] = restore_seconds["i"], restore_seconds["i_ref"]
    warm_driver = base / f"driver-warm-{top.name}"
    # Two runs: the second also stores anything the driver wrote after the first's last capture.
    denv_warm = {**denv, "RUNTIME_CACHE_DRIVER_DIR": str(warm_driver)}
    stored = [_run("driver", args.n, salt, folder, denv_warm)["stored"] for _ in range(2)]
    print(f"(i) driver-cache entries after each capture run: {stored}", flush=True)
    for r in range(args.warm_reps or args.reps):
        fresh = base / f"driver-fresh-{top.name}-{r}"
        order = [("i", fresh), ("i_ref", warm_driver)]
        for key, where in order if r % 2 == 0 else order[::-1]:
            got = _run(
                "driver", args.n, salt, folder, {**denv, "RUNTIME_CACHE_DRIVER_DIR": str(where)}
            )
            assert got["source_builds"] == 0, got
            restored[key].append(got["restored_files"])
            restore_seconds[key].append(got["restore_seconds"])
            raw[key].append(got["seconds"])
            launches[key].append(sum(got["first_launch"]))
        shutil.rmtree(fresh, ignore_errors=True)
        print(f"rep {r}: (i) {raw['i'][-1]:.4f} s  (i_ref) {raw['i_ref'][-1]:.4f} s", flush=True)
    shutil.rmtree(warm_driver, ignore_errors=True)
    return restored


def _driver_env(on: bool, folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    if on:
        env.update(
            POCL_KERNEL_CACHE="1",
            POCL_CACHE_DIR=str(folder),
            CUDA_CACHE_DISABLE="0",
            CUDA_CACHE_PATH=str(folder),
            CUDA_CACHE_MAXSIZE=str(4 << 30),
        )
    else:
        env.update(POCL_KERNEL_CACHE="0", CUDA_CACHE_DISABLE="1")
    env.pop("RUNTIME_CACHE", None)
    return env


def _run(phase: str, n: int, salt: str, folder: Path, env: dict[str, str]) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = run_child(__file__, phase, n, salt, folder, env)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=100, help="kernels (programs)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions for medians")
    parser.add_argument("--cold-reps", type=int, default=None, help="repetitions of (a), (b)")
    parser.add_argument("--warm-reps", type=int, default=None, help="repetitions of (c), (d)")
    parser.add_argument("--extra-reps", type=int, default=1, help="cold repetitions of (e), (f)")
    parser.add_argument("--driver-cache", choices=("off", "on"), default="off")
    parser.add_argument("--label", default=None, help="results/opencl-<label>.json")
    parser.add_argument("--out", default=None, help="JSON path (overrides --label)")
    parser.add_argument(
        "--skip", default="", help="comma-separated phases to skip: c (with c2, d), e, f, h, i"
    )
    parser.add_argument(
        "--pocl-scratch", default=None, help="POCL_CACHE_DIR for every phase (e.g. on a tmpfs)"
    )
    add_child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.salt, args.dir)))
        return 0

    reps, cold_reps = args.reps, args.cold_reps or args.reps
    warm_reps = args.warm_reps or args.reps
    run_id = uuid.uuid4().hex[:8]
    top = Path(tempfile.mkdtemp(prefix="bench-opencl-"))
    env = _driver_env(args.driver_cache == "on", top / "driver-cache")
    if args.pocl_scratch:
        os.makedirs(args.pocl_scratch, exist_ok=True)
        env["POCL_CACHE_DIR"] = args.pocl_scratch
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    raw: dict[str, list[float]] = {
        k: []
        for k in [
            "a",
            "b",
            "c",
            "c2",
            "d",
            "e_cold",
            "e_warm",
            "f_cold",
            "f_warm",
            "h",
            "i",
            "i_ref",
        ]
    }
    driver_launches: dict[str, list[float]] = {"i": [], "i_ref": []}
    restored: dict[str, list[int]] = {}
    launches: dict[str, list[float]] = {"after_cold": [], "after_warm": []}
    device: dict[str, Any] = {}
    started = time.time()
    load_start = os.getloadavg()
    try:
        warm_dirs = []
        for r in range(cold_reps):
            salt = f"{run_id}-{r}"
            folder = top / f"rep{r}"
            a = _run("cold_seq", args.n, salt, folder, env)
            assert a["source_builds"] == args.n, a
            raw["a"].append(a["seconds"])
            launches["after_cold"] = a["first_launch"]
            device = a["device"]
            b = _run("cold_par", args.n, salt + "p", top / f"par{r}", env)
            assert b["source_builds"] == args.n, b
            raw["b"].append(b["seconds"])
            warm_dirs.append((salt, folder))
            print(f"rep {r}: (a) {a['seconds']:.2f} s  (b) {b['seconds']:.2f} s", flush=True)
        for r in range(warm_reps if "c" not in skip else 0):
            salt, folder = warm_dirs[r % len(warm_dirs)]
            # Rotate the order, so a neighbour's load does not always hit the same one.
            phases = ["warm", "floor", "warm_seq"]
            for phase in phases[r % 3 :] + phases[: r % 3]:
                if phase == "floor":
                    raw["d"].append(_run("floor", args.n, salt, folder, env)["seconds"])
                    continue
                if phase == "warm_seq":
                    c2 = _run("warm_seq", args.n, salt, folder, env)
                    assert c2["source_builds"] == 0 and c2["binary_loads"] == args.n, c2
                    raw["c2"].append(c2["seconds"])
                    continue
                c = _run("warm", args.n, salt, folder, env)
                assert c["source_builds"] == 0 and c["binary_loads"] == args.n, c
                raw["c"].append(c["seconds"])
                launches["after_warm"] = c["first_launch"]
            line = f"(c) {raw['c'][-1]:.4f} s  (c2) {raw['c2'][-1]:.4f} s  (d) {raw['d'][-1]:.4f} s"
            print(f"rep {r}: {line}", flush=True)
        if "h" not in skip:
            for r in range(args.extra_reps):
                salt, folder = warm_dirs[r % len(warm_dirs)]
                henv = {**env, "RUNTIME_CACHE_GUARD_DIR": str(top / f"guard-elsewhere{r}")}
                h = _run("warm", args.n, salt, folder, henv)
                assert h["source_builds"] == 0 and h["vetted"] == args.n, h
                raw["h"].append(h["seconds"])
        if "i" not in skip:
            restored = _driver_phases(args, env, top, warm_dirs, raw, driver_launches)
        if "e" not in skip:
            for r in range(args.extra_reps):
                folder, salt = top / f"pyopencl{r}", f"{run_id}-e{r}"
                raw["e_cold"].append(_run("pyopencl_cache", args.n, salt, folder, env)["seconds"])
                for _ in range(reps if r == 0 else 0):
                    warm = _run("pyopencl_cache", args.n, salt, folder, env)
                    raw["e_warm"].append(warm["seconds"])
        if "f" not in skip:
            for r in range(args.extra_reps):
                folder, salt = top / f"driver{r}", f"{run_id}-f{r}"
                fenv = _driver_env(True, folder / "driver-cache")
                raw["f_cold"].append(_run("driver_cache", args.n, salt, folder, fenv)["seconds"])
                for _ in range(reps if r == 0 else 0):
                    warm = _run("driver_cache", args.n, salt, folder, fenv)
                    raw["f_warm"].append(warm["seconds"])
    finally:
        shutil.rmtree(top, ignore_errors=True)

    med = {k: median(v) for k, v in raw.items()}
    ratios = {
        "warm_over_floor": med["c"] / med["d"],
        "cold_over_warm": med["a"] / med["c"],
        "parallel_over_sequential": med["b"] / med["a"],
        "warm_one_at_a_time_over_floor": med["c2"] / med["d"],
    }
    if raw["i"] and raw["i_ref"]:
        ratios["fresh_driver_over_warm_driver"] = med["i"] / med["i_ref"]
        with_launch = {
            k: median([s + f for s, f in zip(raw[k], driver_launches[k], strict=True)])
            for k in ("i", "i_ref")
        }
        ratios["fresh_driver_over_warm_driver_with_launches"] = (
            with_launch["i"] / with_launch["i_ref"]
        )
    first = {k: {"total": sum(v), "median": median(v)} for k, v in launches.items()}
    is_pocl = "Portable Computing Language" in str(device.get("platform_name", ""))
    labels = {
        "a": "(a) cold source builds, sequential",
        "b": "(b) cold, build_all() parallel",
        "c": "(c) warm via runtime-cache, fresh process",
        "c2": "(c2) warm, program() one at a time",
        "d": "(d) floor: raw Program(binaries).build()",
        "e_cold": "(e) pyopencl cache, cold",
        "e_warm": "(e) pyopencl cache, warm",
        "f_cold": "(f) driver cache, cold",
        "f_warm": "(f) driver cache, warm",
        "h": "(h) warm, unknown here: vetted in a child",
        "i": "(i) warm, empty driver folder, restored",
        "i_ref": "(i) warm, driver folder warm (reference)",
    }
    print()
    print(f"device: {device.get('name')} | {device.get('platform_version')}")
    print(f"driver: {device.get('driver_version')} | n={args.n} | driver cache {args.driver_cache}")
    print(f"{'measurement':46} {'median s':>10} {'per kernel ms':>14} {'runs':>5}")
    for key, label in labels.items():
        if raw[key]:
            per = med[key] / args.n * 1000
            print(f"{label:46} {med[key]:10.4f} {per:14.3f} {len(raw[key]):5d}")
    for key, value in first.items():
        label = f"(g) first launches {key.replace('_', ' ')}"
        print(f"{label:46} {value['total']:10.4f} {value['median'] * 1000:14.3f} {1:5d}")
    for key, values in driver_launches.items():
        if values:
            label = f"(i) first launches, {'restored' if key == 'i' else 'reference'}"
            total = median(values)
            print(f"{label:46} {total:10.4f} {total / args.n * 1000:14.3f} {len(values):5d}")
    print()
    for key, value in ratios.items():
        print(f"{key:28} {value:8.3f}")
    result = {
        "benchmark": "opencl",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": machine_info(),
        "device": device,
        "n": args.n,
        "reps": reps,
        "cold_reps": cold_reps,
        "warm_reps": warm_reps,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg(),
        "driver_cache": args.driver_cache,
        "pocl_scratch": args.pocl_scratch or "default (~/.cache/pocl)",
        "pyopencl_cache_used_by_program_build": not is_pocl
        and "NVIDIA" not in str(device.get("platform_name", "")),
        "seconds": raw,
        "median_seconds": med,
        "first_launch_seconds": first,
        "driver_cache_first_launch_totals": driver_launches,
        "driver_cache_restored_files": restored,
        "ratios": ratios,
        "acceptance": {
            "warm_over_floor<=1.10": ratios["warm_over_floor"] <= 1.10,
            "cold_over_warm>=50": ratios["cold_over_warm"] >= 50,
            "parallel_over_sequential<=0.60": ratios["parallel_over_sequential"] <= 0.60,
        },
        "wall_seconds": time.time() - started,
    }
    label = args.label or ("pocl" if is_pocl else str(device.get("vendor", "device")).split()[0])
    out = Path(args.out) if args.out else HERE / "results" / f"opencl-{label.lower()}.json"
    print(f"\nwrote {write_json(out, result)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
