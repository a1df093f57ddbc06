"""A fleet's cold start builds each entry once: real processes on one dir:// or redis:// cache.

Each child is a separate Python process. Builds are counted through a file
every build appends to (``O_APPEND``), so the count covers all processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from opencl_support import opencl_context

pytest_plugins = ["redis_servers"]

SECRET = "test-secret"

GET_OR_BUILD = textwrap.dedent(
    """
    import json, os, random, sys, time
    import runtime_cache as rc
    from runtime_cache.fleet import LeasePolicy

    url, log = sys.argv[1], sys.argv[2]
    count, pause, seed = int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    pad = b"x" * (int(sys.argv[6]) if len(sys.argv) > 6 else 0)  # a value the store may refuse
    cache = rc.Cache(rc.open_backend(url), secret="test-secret")
    cache.fleet.policy = LeasePolicy(ttl=1.0, default_expected=4.0)
    keys = [rc.make_key(module_id=f"m{i}", runtime="fleet", purpose="test", device=None)
            for i in range(count)]
    random.Random(seed).shuffle(keys)

    def builder(key):
        def build():
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, f"{os.getpid()} {key.module_id} {time.time()}\\n".encode())
            os.close(fd)
            time.sleep(pause)
            fd = os.open(log + ".done", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(fd, f"{os.getpid()} {key.module_id} {time.time()}\\n".encode())
            os.close(fd)
            return key.module_id.encode() * 3 + pad
        return build

    fd = os.open(log + ".ready", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(fd, b"ready\\n")
    os.close(fd)
    started = time.monotonic()
    ok = all(cache.get_or_build(k, builder(k)) == k.module_id.encode() * 3 + pad for k in keys)
    s = cache.stats()
    print(json.dumps({"ok": ok, "seconds": time.monotonic() - started, "builds": s.builds,
                      "won": s.leases_won, "waits": s.lease_waits, "takeovers": s.takeovers,
                      "wait_seconds": s.wait_seconds, "unshared": s.unshared_builds,
                      "stores": s.stores}))
    """
)


def _start(
    code: str, *args: object, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    # PoCL's scratch folder for uncached builds is not safe for processes at once: one each.
    scratch = cwd / f"pocl-{time.monotonic_ns()}"
    env = dict(os.environ, POCL_KERNEL_CACHE="0", POCL_CACHE_DIR=str(scratch), **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, float]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _builds(log: Path) -> Counter[str]:
    lines = log.read_text().split("\n") if log.exists() else []
    return Counter(line.split()[1] for line in lines if line)


@pytest.fixture(params=["dir", "redis"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """One shared cache URL: a folder, or a fresh prefix on a real redis-server."""
    if request.param == "dir":
        yield f"dir://{tmp_path / 'cache'}"
    else:
        server = request.getfixturevalue("redis_server")
        yield f"{server.url}?prefix=fleet-{tmp_path.name}:"


def test_four_processes_build_each_key_once(shared_url: str, tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    procs = [_start(GET_OR_BUILD, shared_url, log, 24, 0.15, n, cwd=tmp_path) for n in range(4)]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    builds = _builds(log)
    assert sum(builds.values()) == 24 and set(builds.values()) == {1}
    assert sum(r["builds"] for r in results) == 24
    assert sum(r["won"] for r in results) == 24
    assert sum(r["takeovers"] for r in results) == 0


def test_killed_lease_holder_is_taken_over(shared_url: str, tmp_path: Path) -> None:
    log = tmp_path / "builds.log"
    # Same order in every process: all wait on the holder's key while it builds (2 s each).
    first = _start(GET_OR_BUILD, shared_url, log, 3, 2.0, 0, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not _builds(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _builds(log), "the first process never started a build"
    others = [_start(GET_OR_BUILD, shared_url, log, 3, 2.0, 0, cwd=tmp_path) for _ in range(3)]
    ready = tmp_path / "builds.log.ready"
    while (
        not ready.exists() or len(ready.read_text().split()) < 4
    ) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # all three now wait on the first process's lease
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    started = time.monotonic()
    results = [_result(p) for p in others]
    assert all(r["ok"] for r in results)
    builds = _builds(log)
    # The killed key was built twice (by the holder, then by one survivor); the rest once.
    assert sorted(builds.values()) == [1, 1, 2]
    assert sum(r["takeovers"] for r in results) == 1
    # Lease ttl 1 s, builds 2 s each: within the bound, nobody waited out a deadline.
    assert time.monotonic() - started < 3 * 2.0 + 1.0 + 4.0
    assert all(r["wait_seconds"] < 3 * 4.0 + 2 for r in results)


def _spans(log: Path) -> dict[str, tuple[float, float]]:
    # Each build's (start, end) in wall-clock seconds, by "pid module".
    def times(path: Path) -> dict[str, float]:
        rows = [line.split() for line in path.read_text().splitlines() if line]
        return {f"{pid} {mod}": float(when) for pid, mod, when in rows}

    starts, ends = times(log), times(log.with_name(log.name + ".done"))
    return {who: (starts[who], ends[who]) for who in starts}


@pytest.mark.parametrize("store", ["dir", "redis", "memory,dir", "memory,redis"])
def test_an_entry_the_store_refuses_is_built_side_by_side(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A 100 kB value over the shared store's cap: it never lands there, and the lease
    # holder notes so. Tiered, each process's memory tier keeps it: the shared tier's
    # refusal is what counts (for Redis, found by its write-behind queue after put returned).
    if store.endswith("dir"):
        url = f"dir://{tmp_path / 'cache'}?max_size=64KB"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"{server.url}?prefix=refused-{tmp_path.name}:&max_entry_size=50000"
    if store.startswith("memory,"):
        url = f"memory://,{url}"
    log = tmp_path / "builds.log"
    first = _start(GET_OR_BUILD, url, log, 1, 2.0, 0, 100_000, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not _builds(log) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _builds(log), "the first process never started a build"
    others = [_start(GET_OR_BUILD, url, log, 1, 2.0, 0, 100_000, cwd=tmp_path) for _ in range(3)]
    results = [_result(p) for p in [first, *others]]
    assert all(r["ok"] for r in results)
    # The shared store kept none of them (a memory tier counts its own store).
    assert [r["stores"] for r in results] == [int(store.startswith("memory,"))] * 4
    assert sum(r["builds"] for r in results) == 4
    assert results[0]["unshared"] == 0  # the holder built under its lease, then noted
    # Each later process took the lease over, found the note, let the lease go, and built.
    assert [r["unshared"] for r in results[1:]] == [1, 1, 1]
    assert [r["takeovers"] for r in results[1:]] == [1, 1, 1]
    # Side by side: the three later builds all ran at one moment (one after another, under
    # the lease, each would start only when the one before it ended).
    later = sorted(span for who, span in _spans(log).items() if not who.startswith(f"{first.pid} "))
    assert len(later) == 3
    assert max(start for start, _ in later) < min(end for _, end in later)


OPENCL = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.opencl import OpenCLModule, opencl_stats

    sys.path.insert(0, sys.argv[2])
    from opencl_support import generated_sources, run_kernel

    secret = os.environ.get("FLEET_SECRET", "test-secret") or None  # "": unsigned
    cache = rc.Cache(rc.open_backend(sys.argv[1]), secret=secret)
    dev = cl.get_platforms()[0].get_devices()[0]
    ctx = cl.Context([dev])
    count, salt = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else (24, 3)
    module = OpenCLModule(ctx, generated_sources(count, salt=salt), cache=cache)
    started = time.monotonic()
    module.build_all(workers=2)
    seconds = time.monotonic() - started
    data = np.arange(16, dtype=np.float32)
    ok = len(module.built) == count and all(
        np.array_equal(run_kernel(ctx, module.kernel(f"k{i}"), data), data * (i + 2) + salt)
        for i in sorted({0, count // 2, count - 1})
    )
    s, c = opencl_stats(), cache.stats()
    print(json.dumps({"ok": ok, "builds": s.source_builds, "loads": s.binary_loads,
                      "won": c.leases_won, "seconds": seconds, "unshared": c.unshared_builds,
                      "takeovers": c.takeovers}))
    """
)


@pytest.mark.opencl
def test_four_processes_share_a_cold_module(shared_url: str, tmp_path: Path) -> None:
    opencl_context()  # skip (or fail when required) without OpenCL
    tests = Path(__file__).parent
    procs = [_start(OPENCL, shared_url, tests, cwd=tmp_path) for _ in range(4)]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    assert sum(r["builds"] for r in results) == 24
    assert sum(r["won"] for r in results) == 24
    assert all(r["builds"] + r["loads"] == 24 for r in results)


@pytest.mark.opencl
def test_a_staggered_unsigned_start_builds_each_program_once(tmp_path: Path) -> None:
    # The second process starts once the first has stored a few programs, with a guard
    # folder of its own (another machine): it vets what it finds stored, and meanwhile the
    # first stores more. Those stored between its first look and its shared build were
    # taken for refused ones and built again (29 builds for 24); they are loaded.
    opencl_context()
    tests, root = Path(__file__).parent, tmp_path / "cache"
    url = f"dir://{root}"
    unsigned = {"FLEET_SECRET": ""}
    first = _start(OPENCL, url, tests, cwd=tmp_path, env=unsigned)
    deadline = time.monotonic() + 90
    while len(list(root.rglob("*.rce"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    other = {**unsigned, "RUNTIME_CACHE_GUARD_DIR": str(tmp_path / "other-guard")}
    second = _start(OPENCL, url, tests, cwd=tmp_path, env=other)
    results = [_result(first), _result(second)]
    assert all(r["ok"] for r in results)
    assert all(r["builds"] + r["loads"] == 24 for r in results)
    assert sum(r["builds"] for r in results) == 24, results


@pytest.mark.opencl
def test_binaries_the_store_refuses_are_built_side_by_side(
    redis_server: object, tmp_path: Path
) -> None:
    # Every program's binaries are over the store's cap: none lands. Each program's first
    # holder builds it under its lease and notes the refusal; every later taker finds the
    # note, lets the lease go and builds it too, without holding the others off.
    opencl_context()
    url = f"{redis_server.url}?prefix=refused-{tmp_path.name}:&max_entry_size=100"  # type: ignore[attr-defined]
    tests = Path(__file__).parent
    procs = [_start(OPENCL, url, tests, 4, 5, cwd=tmp_path) for _ in range(3)]
    results = [_result(p) for p in procs]
    assert all(r["ok"] for r in results)
    assert [r["builds"] for r in results] == [4, 4, 4] and sum(r["loads"] for r in results) == 0
    assert sum(r["won"] for r in results) == 4  # one holder per program
    # The 8 other builds found the note, unless a wait passed its deadline first.
    assert 1 <= sum(r["unshared"] for r in results) <= 8


@pytest.mark.opencl
def test_killed_process_in_a_shared_module_build(tmp_path: Path) -> None:
    opencl_context()
    tests, root = Path(__file__).parent, tmp_path / "cache"
    url = f"dir://{root}"
    procs = [_start(OPENCL, url, tests, cwd=tmp_path) for _ in range(4)]
    deadline = time.monotonic() + 90
    while not list(root.rglob("*.rce")) and time.monotonic() < deadline:
        time.sleep(0.05)
    procs[0].send_signal(signal.SIGKILL)  # a lease holder, mid-build
    procs[0].communicate(timeout=10)
    results = [_result(p) for p in procs[1:]]
    assert all(r["ok"] for r in results)
    assert all(r["builds"] + r["loads"] == 24 for r in results)
    assert sum(r["builds"] for r in results) <= 24  # the killed one's unfinished ones, once
