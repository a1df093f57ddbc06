"""Where a lazy program's time goes: ours, step by step, against the floor's steps.

Three sides, each in a fresh process, in an order that rotates from round to round:

* ``floor``: per program, read its binary file, ``pyopencl.Program(ctx, devices,
  [binary])``, ``.build()``, ``pyopencl.Kernel`` (each step timed apart);
* ``thread``: ``OpenCLModule.kernel(name)`` for each program in turn, the read-ahead on
  (as shipped; on NVIDIA the thread only reads);
* ``caller``: the same with the read-ahead off (``RUNTIME_CACHE_OPENCL_READ_AHEAD=0``):
  every step on the caller's thread.

Ours is timed by wrapping the steps of the load path (module functions and methods,
replaced in the child before the clock starts), each adding about 1 µs a call: a step's
time holds the steps it calls. ``T:`` steps ran on the read-ahead thread. Reported per
side: the median over rounds of each step's microseconds a program, over the programs
after the first, and of the first program's.

Run (the cache and guard folders are made in a new temporary folder)::

    python probe-lazy-sections.py 100 5 [platform]

Outputs: ``probe-lazy-sections-nvidia-h100-n{100,12}-2026-12-06-s36.txt`` (an H100, driver cache
on; ``CUDA_CACHE_PATH`` warm from the fill).
"""

import functools
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[2]))  # benchmarks/, for _common

#: The wrapped steps: module, attribute path, label.
STEPS = [
    ("runtime_cache.opencl.module", "OpenCLModule.__init__", "OpenCLModule()"),
    ("runtime_cache.opencl.module", "module_id_from_sources", "module_id_from_sources"),
    ("runtime_cache.opencl.module", "get_cache", "get_cache"),
    ("runtime_cache.opencl.module", "OpenCLModule.kernel", "kernel"),
    ("runtime_cache.opencl.module", "OpenCLModule._load", "_load"),
    ("runtime_cache.opencl.module", "OpenCLModule._name_lock", "_name_lock"),
    ("runtime_cache.opencl.module", "OpenCLModule._adopt", "_adopt"),
    ("runtime_cache.opencl.module_plans", "ModulePlans.plan", "plan"),
    ("runtime_cache.opencl.module_plans", "options_text", "options_text"),
    ("runtime_cache.opencl.module_plans", "key_templates", "key_templates"),
    ("runtime_cache.opencl.module_plans", "plan_program", "plan_program"),
    ("runtime_cache.opencl.prefetch", "ReadAhead.take", "take"),
    ("runtime_cache.cache", "Cache.get_many_views", "get_many_views"),
    ("runtime_cache.batch_reads", "screen_many", "screen_many"),
    ("runtime_cache.backends.directory", "DirectoryBackend.get_many", "dir.get_many"),
    ("runtime_cache.backends.directory", "DirectoryBackend._open", "dir._open"),
    ("runtime_cache.backends.directory", "read_to_end", "dir.read_to_end"),
    ("runtime_cache.backends.directory", "DirectoryBackend._touch", "dir._touch"),
    ("runtime_cache.opencl.module", "fetch", "fetch"),
    ("runtime_cache.opencl.program", "screen_binaries", "screen_binaries"),
    ("runtime_cache.opencl.guard", "LoadGuard._start", "guard._start"),
    ("runtime_cache.opencl.program", "load_cached", "load_cached"),
    ("runtime_cache.opencl.program", "load_from_binaries", "load_from_binaries"),
    ("runtime_cache.opencl.program", "create_and_build", "create_and_build"),
    ("runtime_cache.opencl.program", "pocl_took_other_flags", "pocl_took_other_flags"),
    ("pyopencl", "Kernel", "pyopencl.Kernel"),
]


def wrap_steps(acc: dict[str, list[float]]) -> None:
    """Replace each step with a timed wrapper adding into ``acc[label]``."""
    main = threading.main_thread()

    def timed(f: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(f)
        def step(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                name = label if threading.current_thread() is main else f"T:{label}"
                acc.setdefault(name, [0.0])[0] += time.perf_counter() - started

        return step

    for module_name, path, label in STEPS:
        owner: Any = importlib.import_module(module_name)
        *parents, attr = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        setattr(owner, attr, timed(getattr(owner, attr), label))


def child(side: str, n: int, salt: str, bins: Path, platform: int) -> dict[str, Any]:
    """One side in this process: per-step microseconds, first program and the rest."""
    import pyopencl as cl
    import pyopencl.characterize  # imported before the clock, as bench_floor does
    import pyopencl.invoker
    from _common import kernel_sources

    from runtime_cache.opencl import OpenCLModule

    ctx = cl.Context([cl.get_platforms()[platform].get_devices()[0]])
    devices = ctx.devices
    sources = kernel_sources(n, salt)
    names = list(sources)
    if side == "fill":
        module = OpenCLModule(ctx, sources)
        module.build_all()
        bins.mkdir(exist_ok=True)
        for name in names:
            binary = module.program(name).get_info(cl.program_info.BINARIES)[0]
            (bins / f"{name}.bin").write_bytes(bytes(binary))
        return {}
    acc: dict[str, list[float]] = {}
    if side != "floor":
        wrap_steps(acc)
    first: dict[str, float] = {}
    kernels = []  # kept, as bench_floor keeps them: a program let go of is unloaded
    gc.collect()
    started = time.perf_counter()
    module = OpenCLModule(ctx, sources) if side != "floor" else None
    for i, name in enumerate(names):
        if module is not None:
            kernels.append(module.kernel(name))
        else:
            a = time.perf_counter()
            with open(bins / f"{name}.bin", "rb") as f:
                binary = f.read()
            b = time.perf_counter()
            program = cl.Program(ctx, devices, [binary])
            c = time.perf_counter()
            program.build()
            d = time.perf_counter()
            kernels.append(cl.Kernel(program, name))
            e = time.perf_counter()
            for label, seconds in (
                ("read", b - a),
                ("Program()", c - b),
                ("build()", d - c),
                ("pyopencl.Kernel", e - d),
            ):
                acc.setdefault(label, [0.0])[0] += seconds
        if i == 0:
            first = {k: v[0] * 1e6 for k, v in acc.items()}
            first["total"] = (time.perf_counter() - started) * 1e6
            acc.clear()
            rest_started = time.perf_counter()
    rest = {k: v[0] * 1e6 / (n - 1) for k, v in acc.items()}
    rest["total"] = (time.perf_counter() - rest_started) * 1e6 / (n - 1)
    return {"first": first, "rest": rest}


def main() -> int:
    """Fill, run the rounds in fresh processes, print the medians."""
    if sys.argv[1] == "--child":
        side, n, salt, bins, platform = sys.argv[2:7]
        print(json.dumps(child(side, int(n), salt, Path(bins), int(platform))))
        return 0
    n, rounds = int(sys.argv[1]), int(sys.argv[2])
    platform = sys.argv[3] if len(sys.argv) > 3 else "0"
    top = Path(tempfile.mkdtemp(prefix="probe-sections-"))
    env = dict(os.environ)
    env.setdefault("RUNTIME_CACHE", f"dir://{top / 'cache'}")
    env.setdefault("RUNTIME_CACHE_GUARD_DIR", str(top / "guard"))
    salt = uuid.uuid4().hex[:8]

    def run(side: str) -> dict[str, Any]:
        side_env = dict(env)
        if side == "caller":
            side_env["RUNTIME_CACHE_OPENCL_READ_AHEAD"] = "0"
        command = [sys.executable, str(HERE), "--child", side, str(n), salt, str(top / "bins")]
        done = subprocess.run(
            [*command, platform], cwd=top, env=side_env, capture_output=True, text=True, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    run("fill")
    run("floor")  # a warm-up round: the driver's cache and the page cache
    sides = ["floor", "thread", "caller"]
    got: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in sides[r % 3 :] + sides[: r % 3]:
            got[side].append(run(side))
    print(f"{n} programs, {rounds} rounds; microseconds, median over rounds")
    for side in sides:
        labels = dict.fromkeys(k for one in got[side] for k in (*one["first"], *one["rest"]))
        print(f"\n{side:24} {'first program':>14} {'a later one':>12}")
        for label in labels:
            values = [
                statistics.median(one[part].get(label, 0.0) for one in got[side])
                for part in ("first", "rest")
            ]
            print(f"  {label:22} {values[0]:14.1f} {values[1]:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
