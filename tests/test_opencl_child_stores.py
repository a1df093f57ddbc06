"""install()'s deferred stores where no exit handler runs.

* A ``multiprocessing`` child started by ``fork`` or ``forkserver`` ends with
  ``os._exit``, which skips ``atexit``: its programs were never stored (every run
  built them again). They are now stored at the child's end, by ``multiprocessing``'s
  finalizers.
* A service stopped by ``SIGTERM`` runs no exit handler either: once its builds have
  been quiet for ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS``, the programs are handed to a
  detached store, so they are stored all the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from opencl_support import is_pocl, opencl_device

from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import wait_for_detached_stores

pytestmark = pytest.mark.opencl

CHILDREN = 2

# argv: cache folder, start method, salt, how many children. The parent touches no OpenCL
# before the fork.
CHILDREN_APP = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    import runtime_cache as rc

    FOLDER, METHOD, SALT, COUNT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    def work(i):
        import pyopencl as cl
        from runtime_cache.opencl import choose_device, install
        install(rc.Cache(rc.open_backend(f"dir://{FOLDER}")))
        ctx = cl.Context([choose_device()])
        src = "__kernel void c%d(__global int *a) { a[get_global_id(0)] = %d + %s; }"
        cl.Program(ctx, src % (i, i, SALT)).build()  # no flush(): the child's end stores it

    if __name__ == "__main__":
        ctx = mp.get_context(METHOD)
        children = [ctx.Process(target=work, args=(i,)) for i in range(COUNT)]
        for child in children:
            child.start()
        for child in children:
            child.join()
        assert [c.exitcode for c in children] == [0] * len(children), children
    """
)

# argv: cache folder, start method. The child's driver (played as NVIDIA's, whose folder
# layout is one index and data files) adds files to its folder; the child captures none itself.
DRIVER_APP = textwrap.dedent(
    """
    import multiprocessing as mp, os, sys
    import runtime_cache as rc

    FOLDER, METHOD = sys.argv[1], sys.argv[2]

    def work():
        from runtime_cache.opencl import choose_device
        from runtime_cache.opencl.driver_cache import DriverCacheSession
        cache = rc.Cache(rc.open_backend(f"dir://{FOLDER}"))
        session = DriverCacheSession(cache, choose_device(), "m", driver="nvidia")
        session.restore()
        data = os.path.join(os.environ["CUDA_CACHE_PATH"], "a", "1")
        os.makedirs(data)
        with open(os.path.join(data, "0123"), "wb") as out:
            out.write(b"sass")
        with open(os.path.join(os.environ["CUDA_CACHE_PATH"], "index"), "wb") as out:
            out.write(b"index: 0123")

    if __name__ == "__main__":
        child = mp.get_context(METHOD).Process(target=work)
        child.start()
        child.join()
        assert child.exitcode == 0
    """
)

# argv: cache folder, salt. Builds one program, says so, then serves until stopped.
SERVICE = textwrap.dedent(
    """
    import sys, time
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.opencl import choose_device, install
    install(rc.Cache(rc.open_backend(f"dir://{sys.argv[1]}")))
    ctx = cl.Context([choose_device()])
    src = "__kernel void s(__global int *a) { a[get_global_id(0)] = %s; }" % sys.argv[2]
    cl.Program(ctx, src).build()
    print("built", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture(autouse=True)
def _opencl() -> None:
    opencl_device()


def _environment(runs: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, RUNTIME_CACHE_OPENCL_DETACHED_DIR=str(runs), **extra)
    if not is_pocl():  # elsewhere "auto" stores in the process: hand off on every driver
        env.setdefault("RUNTIME_CACHE_OPENCL_DETACH", "1")
    return env


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    """This Python run with ``argv`` in ``env``, which must exit 0."""
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=180, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _entries(folder: Path) -> int:
    return len(list(DirectoryBackend(folder).keys())) if folder.exists() else 0


def _wait_for_entries(folder: Path, runs: Path, count: int) -> int:
    wait_for_detached_stores(timeout=120, folder=str(runs))
    deadline = time.monotonic() + 5  # (a record may lag its last entry by a moment)
    while _entries(folder) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return _entries(folder)


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_programs_built_in_a_multiprocessing_child_are_stored(tmp_path: Path, method: str) -> None:
    folder, runs = tmp_path / "cache", tmp_path / "runs"
    script = tmp_path / "app.py"
    script.write_text(CHILDREN_APP)
    # The idle hand-off off: the child's end alone must store them.
    env = _environment(runs, RUNTIME_CACHE_OPENCL_IDLE_SECONDS="off")
    salt = f"{os.getpid()}{len(method)}"
    done = _run(env, str(script), str(folder), method, salt, str(CHILDREN))
    assert _wait_for_entries(folder, runs, CHILDREN) == CHILDREN, done.stderr[-3000:]


@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_a_multiprocessing_childs_driver_cache_is_captured_at_its_end(
    tmp_path: Path, method: str
) -> None:
    folder, root = tmp_path / "cache", tmp_path / "driver"
    root.mkdir(mode=0o700)
    script = tmp_path / "app.py"
    script.write_text(DRIVER_APP)
    env = dict(
        os.environ,
        RUNTIME_CACHE_DRIVER_DIR=str(root),
        CUDA_CACHE_PATH=str(root / "nvidia"),
        CUDA_CACHE_DISABLE="0",
    )
    done = _run(env, str(script), str(folder), method)
    assert _entries(folder) == 1, done.stderr[-3000:]


def test_a_service_stopped_by_sigterm_after_its_builds_went_quiet_stored_them(
    tmp_path: Path,
) -> None:
    folder, runs = tmp_path / "cache", tmp_path / "runs"
    env = _environment(runs, RUNTIME_CACHE_OPENCL_IDLE_SECONDS="0.5")
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(folder), str(os.getpid())],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert service.stdout is not None
        assert service.stdout.readline().strip() == "built"
        time.sleep(2.0)  # quiet for longer than RUNTIME_CACHE_OPENCL_IDLE_SECONDS
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=30)
    finally:
        service.kill()
    assert service.returncode == -signal.SIGTERM, err[-3000:]
    assert _wait_for_entries(folder, runs, 1) == 1, err[-3000:]
