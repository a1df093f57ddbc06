"""The crash guard: a process that dies while loading cached binaries does not doom the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import need
from runtime_cache.opencl.cached_load import CONCURRENT_LOADS

N = 60
CHILD = """
import sys
import pyopencl as cl
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import OpenCLModule, choose_device, opencl_stats
ctx = cl.Context([choose_device()])
n = int(sys.argv[2])
sources = {f"k{i}": f"kernel void k{i}(global float *a) {{ a[get_global_id(0)] += {i}.0f; }}"
           for i in range(n)}
module = OpenCLModule(ctx, sources, cache=rc.Cache(DirectoryBackend(sys.argv[1])))
module.build_all(processes=False)
s = opencl_stats()
print(s.binary_loads, s.source_builds, s.rejected_binaries, flush=True)
"""


def _run(cache: Path, env: dict[str, str]) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), str(N)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()]


def _kill_mid_load(cache: Path, env: dict[str, str], guard_dir: Path) -> tuple[Path, int]:
    """Kill a loading process once its mark names a binary; return the mark and how many
    binaries it names after the kill."""
    victim = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache), str(N)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    loading = guard_dir / "none yet"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and victim.poll() is None:
        loading = next(guard_dir.glob(f"{victim.pid}.*.loading"), loading)  # its mark file
        if loading.exists() and loading.read_bytes().strip(b"\0"):  # a digest is in it
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.0005)
    victim.wait(30)
    if victim.returncode != -signal.SIGKILL:
        pytest.fail("the loader finished before it could be killed mid-load")
    # What the dead process was loading: one binary, or two where the driver loads two at
    # once (CONCURRENT_LOADS: PoCL); the second may land just before the kill. None when
    # the kill landed after a load had ended (the Intel runtime, once in CI).
    return loading, len(loading.read_bytes().strip(b"\0").split())


def test_a_crash_while_loading_is_not_repeated(tmp_path: Path) -> None:
    try:
        import pyopencl as cl

        cl.get_platforms()
    except Exception as exc:  # no driver or no platform
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))
    guard_dir = tmp_path / "guard"
    env = {**os.environ, "POCL_KERNEL_CACHE": "0", "RUNTIME_CACHE_GUARD_DIR": str(guard_dir)}
    cache = tmp_path / "cache"
    assert _run(cache, env) == [0, N, 0]  # cold: every program from source, binaries stored
    # A process loading those binaries dies in the middle (SIGKILL, as a driver crash would).
    for _ in range(5):  # a kill that lands just after a load emptied the mark: again
        loading, in_flight = _kill_mid_load(cache, env, guard_dir)
        if in_flight:
            break
    assert 1 <= in_flight <= max(CONCURRENT_LOADS.values())
    # The next process blocklists the binaries that were loading, rebuilds them from
    # source, and loads every other program from the cache.
    loads, builds, rejected = _run(cache, env)
    assert (loads, builds, rejected) == (N - in_flight, in_flight, in_flight)
    assert not loading.exists()
    # At most those binaries are blocklisted (none when a rebuild gave the same bytes).
    assert len((guard_dir / "blocklist").read_text().split()) <= in_flight
    # The rebuilt binary is stored afresh, so the run after that is all hits.
    assert _run(cache, env) == [N, 0, 0]


def test_dead_process_digests_are_blocklisted_until_the_driver_makes_them(tmp_path: Path) -> None:
    from runtime_cache.opencl.guard import LoadGuard

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead_pid = int(done.stdout)
    (tmp_path / f"{dead_pid}.loading").write_text("aaaa\nbbbb\n")  # an earlier version's
    (tmp_path / f"{os.getpid()}.loading").write_text("cccc\n")  # alive: left alone
    guard = LoadGuard(str(tmp_path))
    assert guard.blocked(["aaaa"]) and guard.blocked(["x", "bbbb"]) and not guard.blocked(["cccc"])
    assert guard.recovered == 2 and not (tmp_path / f"{dead_pid}.loading").exists()
    (mine,) = tmp_path.glob(f"{os.getpid()}.*.loading")
    # The file is mapped into memory and padded with NULs to a page.
    with guard.loading(["dddd"]):
        assert mine.read_text().rstrip("\0") == "dddd\n"
        with guard.loading(["eeee", "ffff"]):
            assert mine.read_text().rstrip("\0") == "dddd\neeee\nffff\n"
    assert mine.read_text().rstrip("\0") == ""
    many = [f"{i:032x}" for i in range(300)]  # more than a page: the map grows
    with guard.loading(many):
        assert mine.read_text().rstrip("\0").split() == many
    guard.unblock(["aaaa"])
    guard.close()
    again = LoadGuard(str(tmp_path))
    assert not again.blocked(["aaaa"]) and again.blocked(["bbbb"])
    again.close()


def test_a_planted_temporary_guard_folder_turns_the_guard_off(tmp_path: Path) -> None:
    """The private temporary folder's name, made writable by others first: not used."""
    from runtime_cache import environment
    from runtime_cache.opencl.guard import LoadGuard

    planted = tmp_path / environment.fallback_name("state")
    planted.mkdir()
    planted.chmod(0o777)  # as if another user had made it for us
    guard = LoadGuard(str(planted / "opencl-guard"))
    assert guard.known(["x"]) is False  # started: refused the folder, kept no files
    assert guard._fd is None
    assert not list((planted / "opencl-guard").glob("*.loading"))
    planted.chmod(0o700)
    mine = LoadGuard(str(planted / "opencl-guard"))
    mine.known(["x"])
    assert mine._fd is not None  # a private folder of this user's own is used
    mine.close()
