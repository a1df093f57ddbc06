"""Where a process's start-up goes: the steps of its first cached program, timed one by one.

Fresh processes, a warm ``dir://`` cache and 19,900 known marks (as ``bench_floor.py
--known 19900``): each child makes ``OpenCLModule(ctx, sources).kernel(first)`` with
wrappers around its main steps, or, as the floor, reads the first binary and makes its
kernel with plain pyopencl. Prints each step's median and the start-up (ours' first
program minus the floor's, paired per round).

    python benchmarks/results/history/probe-startup-steps-2026-12-05.py [--platform N] [--rounds 11]

Run from outside a checkout's root (the installed package is the one timed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(BENCH))


def timed(times: dict[str, float], owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` so that its calls add their wall time to ``times[label]``."""
    inner = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            times[label] = times.get(label, 0.0) + time.perf_counter() - started

    setattr(owner, name, wrapper)


def child(salt: str, bins: str | None) -> dict[str, float]:
    """One fresh process: the first program, ours (``bins`` None) or the floor's."""
    import gc

    import pyopencl as cl
    import pyopencl.characterize  # (imported by pyopencl's first build: untimed here)
    import pyopencl.invoker
    from _common import kernel_sources
    from bench_floor import _context

    import runtime_cache.opencl.guard as guard
    import runtime_cache.opencl.module as module
    import runtime_cache.opencl.module_plans as plans
    import runtime_cache.opencl.pocl_flags as pocl
    import runtime_cache.opencl.program as program
    from runtime_cache.opencl import OpenCLModule

    times: dict[str, float] = {}
    timed(times, guard.LoadGuard, "_start", "guard start")
    timed(times, guard.LoadGuard, "standing", "guard standing (its start included)")
    timed(times, module.OpenCLModule, "_plan", "plan")
    timed(times, plans, "key_templates", "plan: key templates")
    timed(times, plans, "options_text", "plan: option string")
    timed(times, program, "device_fingerprint", "plan: device fingerprint")
    timed(times, pocl, "_start", "plan: PoCL's start values")
    timed(times, module.OpenCLModule, "_read_ahead", "read-ahead set up")
    timed(times, program, "create_and_build", "driver: create and build")
    timed(times, cl, "Kernel", "pyopencl Kernel")
    ctx = _context()
    sources = kernel_sources(12, salt)
    first = next(iter(sources))
    gc.collect()
    started = time.perf_counter()
    if bins is not None:
        binary = (Path(bins) / f"{first}.bin").read_bytes()
        kernel = cl.Kernel(cl.Program(ctx, ctx.devices, [binary]).build(), first)
    else:
        kernel = OpenCLModule(ctx, sources).kernel(first)
    times["first program"] = time.perf_counter() - started
    del kernel
    return times


def main() -> int:
    """Fill, run the rounds, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", default=None, help="platform index (BENCH_PLATFORM)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--child", default=None)
    parser.add_argument("--bins", default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.bins)))
        return 0
    from _common import child_env
    from bench_floor import fill_known_list

    top = Path(tempfile.mkdtemp(prefix="probe-startup-"))
    env = child_env(top, args.platform)
    env.update(POCL_KERNEL_CACHE="1", POCL_CACHE_DIR=str(top / "driver"))
    fill_known_list(top / "guard", 19900)
    salt = uuid.uuid4().hex[:8]
    fill = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from pathlib import Path; from _common import kernel_sources;"
        "from bench_floor import _context, store_floor_binaries;"
        "from runtime_cache.opencl import OpenCLModule;"
        "s = kernel_sources(12, sys.argv[2]); m = OpenCLModule(_context(), s); m.build_all();"
        "store_floor_binaries(m, Path(sys.argv[3]), list(s))"
    )
    subprocess.run(
        [sys.executable, "-c", fill, str(BENCH), salt, str(top / "bins")],
        env=env,
        cwd=top,
        check=True,
    )

    def run(*extra: str) -> dict[str, float]:
        command = [sys.executable, __file__, "--child", salt, *extra]
        done = subprocess.run(command, env=env, cwd=top, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    run()  # warm-up
    ours, floor = [], []
    for r in range(args.rounds):
        pair = [lambda: ours.append(run()), lambda: floor.append(run("--bins", str(top / "bins")))]
        for side in pair[r % 2 :] + pair[: r % 2]:
            side()
    labels = sorted({label for times in ours for label in times})
    print(f"{'step':36} {'ours µs':>9} {'floor µs':>9}")
    for label in labels:
        mine = statistics.median(t.get(label, 0.0) for t in ours) * 1e6
        theirs = statistics.median(t.get(label, 0.0) for t in floor) * 1e6
        print(f"{label:36} {mine:9.0f} {theirs:9.0f}")
    paired = [a["first program"] - b["first program"] for a, b in zip(ours, floor, strict=True)]
    print(f"start-up (paired median): {statistics.median(paired) * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
