"""Child scripts of the crash guard's tests."""

from __future__ import annotations

#: Two programs built through the cache (``argv[1]``, a URL); with ``argv[2]`` "crash",
#: the process dies (SIGKILL) while it loads the first cached binary. Prints the loads,
#: source builds, rejected binaries and vetted programs.
TWO_PROGRAMS = """
import os, signal, sys
import pyopencl as cl
import runtime_cache as rc
from runtime_cache.opencl import build_program, choose_device, opencl_stats
from runtime_cache.opencl.guard import LoadGuard
if sys.argv[2] == "crash":  # the driver dies while it loads the first cached binary
    loading = LoadGuard.loading
    class Dying:
        def __init__(self, block):
            self.block = block
        def __enter__(self):
            self.block.__enter__()  # marked as loading, then killed
            os.kill(os.getpid(), signal.SIGKILL)
        def __exit__(self, *exc):
            self.block.__exit__(*exc)
    LoadGuard.loading = lambda guard, digests: Dying(loading(guard, digests))
ctx = cl.Context([choose_device()])
cache = rc.Cache(rc.open_backend(sys.argv[1]))
for i in range(2):
    build_program(ctx, f"kernel void k{i}(global float *a) {{ a[0] += {i}.0f; }}", cache=cache)
s = opencl_stats()
print(s.binary_loads, s.source_builds, s.rejected_binaries, s.vetted)
"""
