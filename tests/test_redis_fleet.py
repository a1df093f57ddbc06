"""Two processes stand in for two hosts sharing one Redis: one compiles, the other only loads.

Process A builds an ``OpenCLModule`` against ``RUNTIME_CACHE=redis://...``;
process B (memory tier over the same Redis) loads every program from Redis with
zero source builds, and runs each kernel to show the binaries work. A third
process with another secret gets nothing from the shared cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]
pytestmark = [pytest.mark.redis, pytest.mark.opencl]

KERNELS = 4
NO_OPENCL = 77

HOST = r"""
import json, sys
from dataclasses import asdict
try:
    import numpy as np
    import pyopencl as cl
    from runtime_cache.opencl import choose_device
    ctx = cl.Context([choose_device()])
except Exception as exc:
    print(exc, file=sys.stderr)
    sys.exit(77)
import runtime_cache as rc
from runtime_cache.opencl import OpenCLModule, opencl_stats

n = int(sys.argv[1])
sources = {
    f"add{i}": f"__kernel void add{i}(__global float *x) {{ x[get_global_id(0)] += {i}.0f; }}"
    for i in range(n)
}
module = OpenCLModule(ctx, sources)
built = module.build_all(workers=1)
queue = cl.CommandQueue(ctx)
correct = 0
for i in range(n):
    host = np.zeros(64, dtype=np.float32)
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    module.kernel(f"add{i}")(queue, (64,), None, buf)
    cl.enqueue_copy(queue, host, buf)
    correct += bool((host == float(i)).all())
cache = rc.get_cache()
print(json.dumps({
    "built": built,
    "correct": correct,
    "backend": type(cache.backend).__name__,
    "opencl": asdict(opencl_stats()),
    "cache": cache.stats().as_dict(),
}))
cache.close()
"""


def _host(cache_url: str, secret: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(
        RUNTIME_CACHE=cache_url,
        RUNTIME_CACHE_SECRET=secret,
        POCL_KERNEL_CACHE="0",  # the driver's own cache must not do our work
    )
    done = subprocess.run(
        [sys.executable, "-c", HOST, str(KERNELS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    if done.returncode == NO_OPENCL:
        from conftest import need

        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", done.stderr.strip()[-300:])
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_one_host_builds_every_other_host_loads(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    redis_url = f"{redis_server.url}?prefix={unique_prefix}&ttl=1h"

    a = _host(redis_url, "fleet-secret")
    assert a["backend"] == "RedisBackend"
    assert a["built"] == KERNELS and a["correct"] == KERNELS
    assert a["opencl"]["source_builds"] == KERNELS
    assert a["cache"]["stores"] >= KERNELS  # one entry per program per device

    b = _host(f"memory://,{redis_url}", "fleet-secret")  # the RUNTIME_CACHE tiered form
    assert b["backend"] == "TieredBackend"
    assert b["built"] == 0 and b["correct"] == KERNELS
    assert b["opencl"]["source_builds"] == 0
    assert b["opencl"]["binary_loads"] == KERNELS
    assert b["cache"]["hits"] == a["cache"]["stores"]
    assert b["cache"]["misses"] == 0 and b["cache"]["rejected"] == 0

    # A host with another secret must not trust these binaries: it builds its own.
    c = _host(redis_url, "another-fleet")
    assert c["opencl"]["binary_loads"] == 0
    assert c["opencl"]["source_builds"] == KERNELS and c["correct"] == KERNELS
    assert c["cache"]["rejected"] == a["cache"]["stores"]
