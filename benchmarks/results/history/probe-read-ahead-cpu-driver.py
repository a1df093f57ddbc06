"""A lazy module's read-ahead thread against a simulated NVIDIA load, one probe for its forms.

NVIDIA's driver loads a binary as CPU work on the calling thread, without the GIL (an
H100: 0.48 ms a program, its wall time equal to its CPU time). Here the driver call
(``program.create_and_build``) is replaced by a SHA-256 of a 1 MB buffer (hashlib hashes
without the GIL; 0.55 ms on a 2-core AMD EPYC) under one lock, as NVIDIA serializes
loads, handing back a program built beforehand; kernels are made by the real driver
(PoCL, platform 0). The thread only reads (``RUNTIME_CACHE_OPENCL_LOAD_AHEAD=0``), as on
NVIDIA. Sides, named on the command line and rotated in one process, ``rounds`` times:

* ``floor``: read the binary file, the simulated load, ``pyopencl.Kernel``;
* ``read``: a lazy module, the thread reading as fast as it can;
* ``all``: ``build_all()``, one loading thread;
* ``paced``: one program for each driver call (``PACED_READS``; needs the code before
  ``44c7d98``, which removed it);
* ``gated``: the thread reads only while a driver call runs (needs
  ``gated-read-ahead-trial-2026-12-06.patch`` applied); the simulated driver call then
  notes the process's driver window as the patched ``create_and_build`` does.

Per side: the median ratio to the floor, and the median excess per program of the wall
time and of the caller's own CPU time; the difference is the caller's wait (for the GIL).
The runs of 2026-12-05 (``probe-paced-read-ahead-cpu-driver-2026-12-05.txt``, code
``837011c``) and of session 34 (2026-12-06):

    RUNTIME_CACHE=dir:///tmp/p/c RUNTIME_CACHE_GUARD_DIR=/tmp/p/g \\
        python probe-read-ahead-cpu-driver.py 100 31 floor,read,paced
    RUNTIME_CACHE=dir:///tmp/p/c RUNTIME_CACHE_GUARD_DIR=/tmp/p/g \\
        python probe-read-ahead-cpu-driver.py 100 31 floor,read,gated
"""

import gc
import hashlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for _common

import pyopencl as cl
import xxhash
from _common import kernel_sources

import runtime_cache.opencl.module as module_code
import runtime_cache.opencl.module_ahead as ahead_code
from runtime_cache.opencl import OpenCLModule
from runtime_cache.opencl import program as program_code

os.environ["RUNTIME_CACHE_OPENCL_LOAD_AHEAD"] = "0"
n, rounds = int(sys.argv[1]), int(sys.argv[2])
ctx = cl.Context(cl.get_platforms()[0].get_devices())
sources = kernel_sources(n, uuid.uuid4().hex[:8])
names = list(sources)
built = OpenCLModule(ctx, sources)
built.build_all()
programs: dict[str, Any] = {}
folder = Path(tempfile.mkdtemp(prefix="paced-"))
for name in names:
    binary = built.program(name).get_info(cl.program_info.BINARIES)[0]
    programs[xxhash.xxh3_64_hexdigest(binary)] = built.program(name)
    (folder / f"{name}.bin").write_bytes(binary)
driver = threading.Lock()
BURN = bytes(1_000_000)


def load(_cl: Any, _ctx: Any, _devices: Any, binaries: Any, *_options: Any) -> Any:
    with driver:
        hashlib.sha256(BURN).digest()
    return programs[xxhash.xxh3_64_hexdigest(bytes(binaries[0]))]


program_code.create_and_build = load  # type: ignore[assignment]
import runtime_cache.opencl.cached_load as cld  # noqa: E402

cld.CONCURRENT_LOADS.clear()  # ("all": one loading thread, as on NVIDIA)


def _noting_window(*args: Any) -> Any:
    from runtime_cache.opencl.driver_window import window  # (the patch's)

    started = window.opened()
    try:
        return load(*args)
    finally:
        window.closed(started)


if "gated" in sys.argv[3]:
    program_code.create_and_build = _noting_window  # type: ignore[assignment]
sides = sys.argv[3].split(",")
cpu: dict[str, list[float]] = {s: [] for s in sides}


def floor() -> float:
    kernels, started, cpu_started = [], time.perf_counter(), time.thread_time()
    for name in names:
        binary = (folder / f"{name}.bin").read_bytes()
        kernels.append(cl.Kernel(load(None, None, None, [binary]), name))
    cpu["floor"].append(time.thread_time() - cpu_started)
    return time.perf_counter() - started


def lazy(side: str) -> float:
    ahead_code.GATED_READS = side == "gated"  # (the patch's switch)
    ahead_code.PACED_READS = side == "paced"  # (the switch before 44c7d98)
    gc.collect()
    started, cpu_started = time.perf_counter(), time.thread_time()
    module = OpenCLModule(ctx, sources)
    if side == "all":
        module.build_all()
    kernels = [module.kernel(name) for name in names]
    took = time.perf_counter() - started
    cpu[side].append(time.thread_time() - cpu_started)
    del kernels
    return took


assert module_code.OpenCLModule is OpenCLModule
wall: dict[str, list[float]] = {side: [] for side in sides}
for r in range(rounds):
    for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
        wall[side].append(floor() if side == "floor" else lazy(side))
med = statistics.median
for side in sides:
    ratio = med([a / b for a, b in zip(wall[side], wall["floor"], strict=True)])
    over = med([(a - b) / n * 1e6 for a, b in zip(wall[side], wall["floor"], strict=True)])
    own = med([(a - b) / n * 1e6 for a, b in zip(cpu[side], cpu["floor"], strict=True)])
    print(
        f"n={n} {side:6} {med(wall[side]) / n * 1e6:7.1f} us a program, {ratio:.3f} of the "
        f"floor; over the floor's program: wall {over:6.1f} us, the caller's CPU {own:6.1f} us"
    )
