"""Does warming the driver on a thread (GIL released) hide our start-up? argv: mode folder"""

import ctypes
import gc
import glob
import json
import os
import sys
import threading
import time
from pathlib import Path

import pyopencl as cl
import pyopencl.characterize
import pyopencl.invoker

mode, folder = sys.argv[1], sys.argv[2]
plat = cl.get_platforms()[0]
dev = plat.get_devices()[0]
ctx = cl.Context([dev])
SRC = (
    "__kernel void k%d(__global float *a) { int i = get_global_id(0); a[i] = a[i] * %d.0f + 1.0f; }"
)
if mode == "fill":
    os.makedirs(folder, exist_ok=True)
    for i in range(3):
        p = cl.Program(ctx, SRC % (i, i + 2)).build()
        Path(f"{folder}/p{i}.bin").write_bytes(p.get_info(cl.program_info.BINARIES)[0])
    p = cl.Program(ctx, "__kernel void w(void) {}").build()
    Path(f"{folder}/tiny.bin").write_bytes(p.get_info(cl.program_info.BINARIES)[0])
    print(Path(f"{folder}/tiny.bin").read_bytes().decode(errors="replace"))
    sys.exit()
libs = sorted(
    glob.glob(os.path.join(os.path.dirname(cl.__file__), "..", "pyopencl.libs", "libOpenCL*"))
)
lib = ctypes.CDLL(libs[0] if libs else "libOpenCL.so.1")
lib.clCreateProgramWithBinary.restype = ctypes.c_void_p
lib.clCreateProgramWithBinary.argtypes = [
    ctypes.c_void_p,
    ctypes.c_uint,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_char_p),
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int),
]
lib.clBuildProgram.argtypes = [
    ctypes.c_void_p,
    ctypes.c_uint,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
]
lib.clReleaseProgram.argtypes = [ctypes.c_void_p]
HAND = b".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry w()\n{\n\tret;\n}\n"
tiny = HAND if mode.endswith("hand") else Path(f"{folder}/tiny.bin").read_bytes()
out = {}


def warm():
    s = time.perf_counter()
    d = (ctypes.c_void_p * 1)(dev.int_ptr)
    n = (ctypes.c_size_t * 1)(len(tiny))
    b = (ctypes.c_char_p * 1)(tiny)
    st = (ctypes.c_int * 1)()
    err = ctypes.c_int()
    prog = lib.clCreateProgramWithBinary(ctx.int_ptr, 1, d, n, b, st, ctypes.byref(err))
    out["warm_create_ms"] = (time.perf_counter() - s) * 1e3
    out["warm_err"] = err.value
    if prog:
        out["warm_build_rc"] = lib.clBuildProgram(prog, 1, d, None, None, None)
        lib.clReleaseProgram(prog)
    out["warm_ms"] = (time.perf_counter() - s) * 1e3


def spin(ms):
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


bins = [Path(f"{folder}/p{i}.bin").read_bytes() for i in range(3)]
gc.collect()
t0 = time.perf_counter()
th = None
if mode.startswith("warm"):
    th = threading.Thread(target=warm)
    th.start()
if "spin" in mode:
    spin(1.2)
a = time.perf_counter()
p = cl.Program(ctx, [dev], [bins[0]])
b = time.perf_counter()
p.build()
c = time.perf_counter()
k = cl.Kernel(p, "k0")
d = time.perf_counter()
out.update(first_ms=(d - t0) * 1e3, create_ms=(b - a) * 1e3)
out.update(build_ms=(c - b) * 1e3, kernel_ms=(d - c) * 1e3)
s = time.perf_counter()
k2 = cl.Kernel(cl.Program(ctx, [dev], [bins[1]]).build(), "k1")
out["second_ms"] = (time.perf_counter() - s) * 1e3
if th:
    th.join()
print(json.dumps(out))
