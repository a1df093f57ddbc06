"""Where a lazy module's excess over the floor lies, program by program.

``bench_floor.py`` times whole processes. This one stamps the clock after every kernel, in
the same kind of fresh processes, so that each program's own time can be set against the
floor's program at the same position in the same round:

* ``floor``: plain pyopencl, as in ``bench_floor.py`` (read the binary file, create, build,
  make the kernel);
* ``lazy``: ``OpenCLModule(ctx, sources)`` on the default ``dir://`` cache, then
  ``kernel(name)`` for each kernel in turn;
* ``lazy-no-read-ahead``: the same with ``RUNTIME_CACHE_OPENCL_READ_AHEAD=0``;
* ``lazy-no-load-ahead``: the same with ``RUNTIME_CACHE_OPENCL_LOAD_AHEAD=0`` (the
  thread reads ahead and loads nothing);
* any side may end in ``@PATH``: its process imports runtime-cache from ``PATH`` (an A/B of
  two installed trees in one run: ``--sides floor,lazy@/tmp/A,lazy@/tmp/B``).

The sides run in an order that rotates from round to round. Per position: the median of
each side's program time, and the median over the rounds of its excess over the floor's
program at that position. The driver's cache is on, in one folder that the fill left warm.

Example::

    python benchmarks/bench_per_program.py --platform 0 --n 12 --rounds 25 --known 19900
"""

from __future__ import annotations

import argparse
import gc
import itertools
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
sys.path.insert(0, str(HERE))  # _common and bench_floor, also when a child runs this file

from _common import (  # noqa: E402
    RESULTS,
    add_child_arguments,
    child_env,
    kernel_sources,
    machine_info,
    median,
    run_child,
    write_json,
)

NO_READ_AHEAD = "lazy-no-read-ahead"
NO_LOAD_AHEAD = "lazy-no-load-ahead"


def child(side: str, n: int, salt: str, folder: str) -> list[float]:
    """Run one side in this (fresh) process: the clock after each kernel, in seconds."""
    import pyopencl as cl
    import pyopencl.characterize  # pyopencl imports these on its first build: untimed here
    import pyopencl.invoker
    from bench_floor import _context, store_floor_binaries

    from runtime_cache.opencl import OpenCLModule

    ctx = _context()
    sources = kernel_sources(n, salt)
    names = list(sources)
    bins = Path(folder) / f"floor-{n}"
    marks: list[float] = []
    kernels = []  # kept, as bench_floor keeps them: no release is timed
    gc.collect()  # as in bench_floor: no side pays for a collection the harness set up
    if side == "fill":
        module = OpenCLModule(ctx, sources)
        module.build_all()
        store_floor_binaries(module, bins, names)
    elif side == "floor":
        started = time.perf_counter()
        for name in names:
            binary = (bins / f"{name}.bin").read_bytes()
            kernels.append(cl.Kernel(cl.Program(ctx, ctx.devices, [binary]).build(), name))
            marks.append(time.perf_counter() - started)
    else:
        started = time.perf_counter()
        module = OpenCLModule(ctx, sources)
        for name in names:
            kernels.append(module.kernel(name))
            marks.append(time.perf_counter() - started)
    return marks


def run_side(side: str, n: int, salt: str, top: Path, env: dict[str, str]) -> list[float]:
    """One fresh process of ``side``; its marks."""
    base, _, tree = side.partition("@")
    env = dict(env)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tree, env.get("PYTHONPATH")) if p)
    if base == NO_READ_AHEAD:
        env["RUNTIME_CACHE_OPENCL_READ_AHEAD"] = "0"
    if base == NO_LOAD_AHEAD:
        env["RUNTIME_CACHE_OPENCL_LOAD_AHEAD"] = "0"
    kind = "floor" if base == "floor" else "fill" if base == "fill" else "lazy"
    marks: list[float] = run_child(__file__, kind, n, salt, top, env)
    return marks


def steps(marks: list[float]) -> list[float]:
    """Each program's own time, from the clock after each kernel."""
    return [marks[0]] + [b - a for a, b in itertools.pairwise(marks)]


def summarize(marks: dict[str, list[list[float]]], n: int) -> dict[str, Any]:
    """Per position: each side's median program time (ms) and its paired excess over the
    floor (ms); per side: the median of the per-round total over the floor's."""
    floor = [steps(m) for m in marks["floor"]]
    out: dict[str, Any] = {"program_ms": {}, "excess_ms": {}, "total_over_floor": {}}
    for side, runs in marks.items():
        per = [steps(m) for m in runs]
        out["program_ms"][side] = [median(p[i] for p in per) * 1e3 for i in range(n)]
        if side != "floor":
            out["excess_ms"][side] = [
                median(p[i] - f[i] for p, f in zip(per, floor, strict=True)) * 1e3 for i in range(n)
            ]
            out["total_over_floor"][side] = median(
                m[-1] / f[-1] for m, f in zip(runs, marks["floor"], strict=True)
            )
    return out


def report(summary: dict[str, Any], sides: list[str], n: int) -> None:
    """Print the per-position table."""
    others = sides[1:]
    print("per-program ms (median) and excess over the floor's program (paired median, ms)")
    head = " ".join(f"{s[:14]:>14}" for s in sides)
    print(f"pos {head} " + " ".join(f"{'+' + s[:13]:>14}" for s in others))
    for i in range(n):
        row = " ".join(f"{summary['program_ms'][s][i]:14.3f}" for s in sides)
        extra = " ".join(f"{summary['excess_ms'][s][i]:14.3f}" for s in others)
        print(f"{i:>3} {row} {extra}")
    ratios = ", ".join(f"{s} {summary['total_over_floor'][s]:.3f}" for s in others)
    print(f"whole process over the floor (median of the rounds): {ratios}")


def main() -> int:
    """Fill, run the rounds, print the table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=12, help="programs per process")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--sides", default=f"floor,lazy,{NO_LOAD_AHEAD},{NO_READ_AHEAD}")
    parser.add_argument("--platform", default=None, help="platform index (default: PYOPENCL_CTX)")
    parser.add_argument("--known", type=int, default=0, help="marks on the known list first")
    parser.add_argument("--machine", default="this-machine", help="a label for the JSON")
    parser.add_argument("--json", default=None, help="results path")
    add_child_arguments(parser)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.salt, args.dir)))
        return 0
    from bench_floor import fill_known_list

    sides = args.sides.split(",")
    if sides[0] != "floor":
        raise SystemExit("--sides must begin with floor")
    top = Path(tempfile.mkdtemp(prefix="bench-per-program-"))
    env = child_env(top, args.platform)
    driver = top / "driver"
    env.update(POCL_KERNEL_CACHE="1", POCL_CACHE_DIR=str(driver), CUDA_CACHE_PATH=str(driver))
    env.pop("CUDA_CACHE_DISABLE", None)
    salt = uuid.uuid4().hex[:8]
    marks: dict[str, list[list[float]]] = {side: [] for side in sides}
    started = time.time()
    try:
        fill_known_list(top / "guard", args.known)
        run_side("fill", args.n, salt, top, env)
        for side in sides:  # one untimed warm-up each
            run_side(side, args.n, salt, top, env)
        for r in range(args.rounds):
            for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
                marks[side].append(run_side(side, args.n, salt, top, env))
    finally:
        shutil.rmtree(top, ignore_errors=True)
    summary = summarize(marks, args.n)
    report(summary, sides, args.n)
    record = {
        "benchmark": "per-program",
        "host": machine_info(),
        "machine_label": args.machine,
        "n": args.n,
        "rounds": args.rounds,
        "known_marks": args.known,
        "sides": sides,
        "wall_seconds": time.time() - started,
        **summary,
        "marks": marks,
    }
    out = Path(args.json) if args.json else RESULTS / "history" / f"per-program-{args.machine}.json"
    print(f"wrote {write_json(out, record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
