"""install()'s stores left at exit, handed to a detached process (opencl.detached_store):
stored after the app exits, whole or not at all, with the same trust rules; in-process where the
store cannot be reopened."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from opencl_support import is_pocl, opencl_device

import runtime_cache as rc
from conftest import fill, tmpfs
from runtime_cache.backends import CallbackBackend, MemoryBackend, TieredBackend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import detached_runs, device_fingerprint, wait_for_detached_stores
from runtime_cache.opencl.child import python_command
from runtime_cache.opencl.reopen import open_spec, reopen_spec
from runtime_cache.opencl.wire import write_message

pytestmark = pytest.mark.opencl
pytest_plugins = ["redis_servers"]

SECRET = "detached-test-secret"

# argv: kind (dir | shared | memory | url), cache folder (or URL), how many programs, salt.
APP = textwrap.dedent(
    """
    import atexit, json, sys
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.backends import MemoryBackend
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import choose_device, install, opencl_stats
    kind, folder, count, salt = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if kind == "memory":
        cache = rc.Cache(MemoryBackend())
    elif kind == "url":
        cache = rc.Cache(rc.open_backend(folder), secret=sys.stdin.read().strip())
    elif kind == "shared":
        cache = rc.Cache(DirectoryBackend(folder, shared=True), secret=sys.stdin.read().strip())
    else:
        cache = rc.Cache(DirectoryBackend(folder))

    def report():  # registered before install()'s own handler, so it runs after it
        s = opencl_stats()
        print(json.dumps({"handed_off": s.stores_handed_off, "builds": s.source_builds,
                          "loads": s.binary_loads, "stores": cache.stats().stores}), flush=True)

    atexit.register(report)
    install(cache)
    ctx = cl.Context([choose_device()])
    for i in range(count):
        src = "__kernel void d%d(__global int *a) { a[get_global_id(0)] = %d + %s; }" % (i, i, salt)
        cl.Program(ctx, src).build()
    """
)


@pytest.fixture(autouse=True)
def _opencl() -> None:
    opencl_device()


def _app(
    runs: Path,
    kind: str,
    folder: Path | str,
    count: int,
    salt: str,
    stdin: str = "",
    cwd: Path | None = None,
    **env: str,
) -> dict[str, Any]:
    if not is_pocl():
        # Elsewhere a read-back is cheap and "auto" keeps the store in the process: hand off
        # anyway, so the detached store runs on every driver of the matrix.
        env.setdefault("RUNTIME_CACHE_OPENCL_DETACH", "1")
    done = subprocess.run(
        [sys.executable, "-c", APP, kind, str(folder), str(count), salt],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=dict(os.environ, RUNTIME_CACHE_OPENCL_DETACHED_DIR=str(runs), **env),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _keys(folder: Path, shared: bool = False) -> list[str]:
    return list(DirectoryBackend(folder, shared=shared).keys())


def test_a_program_built_in_a_process_that_exits_is_stored_after_it(tmp_path: Path) -> None:
    runs, folder, salt = tmp_path / "runs", tmp_path / "cache", str(os.getpid())
    cold = _app(runs, "dir", folder, 2, salt)
    assert cold["builds"] == 2 and cold["handed_off"] == 2 and cold["stores"] == 0
    # Recorded by the app itself before it exits: a waiter cannot miss a store still starting.
    assert list(runs.glob("*.running")) or list(runs.glob("*.json"))
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    (record,) = detached_runs(str(runs))
    assert record["programs"] == 2 and record["stored"] == 2, record
    assert record["failed"] == record["changed"] == record["left"] == 0
    assert len(_keys(folder)) == 2
    warm = _app(runs, "dir", folder, 2, salt)
    assert warm["builds"] == 0 and warm["loads"] == 2 and warm["handed_off"] == 0
    assert not list(runs.glob("*.jobs")), "the jobs file is removed once read"


def test_a_relative_records_folder_and_an_endless_bound_still_store(tmp_path: Path) -> None:
    """The attacker review: RUNTIME_CACHE_OPENCL_DETACHED_DIR=runs was looked up again from
    inside it by the detached process, and a bound of inf overflowed its alarm; either
    killed it before it stored anything, after the app had handed the programs off."""
    folder, salt = tmp_path / "cache", str(os.getpid())
    bound = {"RUNTIME_CACHE_OPENCL_DETACHED_SECONDS": "inf"}
    cold = _app(Path("runs"), "dir", folder, 2, salt, cwd=tmp_path, **bound)
    assert cold["handed_off"] == 2
    assert wait_for_detached_stores(timeout=180, folder=str(tmp_path / "runs"))
    (record,) = detached_runs(str(tmp_path / "runs"))
    assert record["stored"] == 2 and "error" not in record, record
    assert len(_keys(folder)) == 2


def test_a_relative_guard_folder_is_the_apps_in_the_detached_store(tmp_path: Path) -> None:
    """The fourth review: the detached store, started in the records folder, looked up a
    relative RUNTIME_CACHE_GUARD_DIR from there, and kept a crash guard of its own."""
    folder, salt = tmp_path / "cache", f"{os.getpid()}1"
    guard = {"RUNTIME_CACHE_GUARD_DIR": "guard"}
    cold = _app(tmp_path / "runs", "dir", folder, 2, salt, cwd=tmp_path, **guard)
    assert cold["handed_off"] == 2
    assert wait_for_detached_stores(timeout=180, folder=str(tmp_path / "runs"))
    (record,) = detached_runs(str(tmp_path / "runs"))
    assert record["stored"] == 2 and "error" not in record, record
    assert (tmp_path / "guard").is_dir()
    assert not (tmp_path / "runs" / "guard").exists(), sorted(os.listdir(tmp_path / "runs"))


def test_a_full_records_folder_stops_no_store(tmp_path: Path) -> None:
    """The records folder on a full disk, the cache's with room: the detached process died
    on its first record, and nothing was stored."""
    with tmpfs(tmp_path / "full", "2m") as full:
        runs = full / "runs"
        runs.mkdir(mode=0o700)
        fill(full, leave=4096)  # room for the jobs file alone
        folder = tmp_path / "cache"
        cold = _app(runs, "dir", folder, 2, str(os.getpid()))
        assert cold["handed_off"] == 2
        deadline = time.monotonic() + 180
        while len(_keys(folder)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_keys(folder)) == 2
        assert not [p for p in runs.iterdir() if p.name.endswith(".tmp")]


def test_a_fifo_at_the_log_neither_hangs_the_app_nor_stops_the_store(tmp_path: Path) -> None:
    """The operator review: a FIFO at ``detached.log`` (left there by anything of this
    user's) kept the app from exiting: the hand-off's open for writing waited for a reader
    that never came. Now the log is opened without waiting, and only as a regular file."""
    runs, folder = tmp_path / "runs", tmp_path / "cache"
    runs.mkdir(mode=0o700)
    os.mkfifo(runs / "detached.log", 0o600)
    cold = _app(runs, "dir", folder, 2, f"{os.getpid()}7")  # (300 s timeout: it hung)
    assert cold["handed_off"] == 2
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    assert len(_keys(folder)) == 2
    assert stat.S_ISFIFO((runs / "detached.log").lstat().st_mode)  # left as it was


def test_a_read_only_store_stops_the_detached_store_at_its_first_failed_write(
    tmp_path: Path,
) -> None:
    """The operator review: on a read-only cache every run's exit handed its programs to a
    detached store that built each one again and stored none ("0 of 8 stored, 8 failed")."""
    runs = tmp_path / "runs"
    with tmpfs(tmp_path / "ro", "1m") as where:
        (where / "cache").mkdir()
        done = subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only: {done.stderr.decode().strip()}")
        cold = _app(runs, "dir", where / "cache", 3, f"{os.getpid()}3")
        assert cold["builds"] == 3 and cold["handed_off"] == 3
        assert wait_for_detached_stores(timeout=180, folder=str(runs))
    (record,) = detached_runs(str(runs))
    assert record["programs"] == 3 and record["stored"] == 0, record
    assert record["failed"] == 1 and record["left"] == 2 and record["read_only"], record


def test_never_detach_keeps_the_bounded_flush_in_the_process(tmp_path: Path) -> None:
    runs, folder = tmp_path / "runs", tmp_path / "cache"
    result = _app(runs, "dir", folder, 1, str(os.getpid()), RUNTIME_CACHE_OPENCL_DETACH="0")
    assert result["handed_off"] == 0 and result["stores"] == 1
    assert not detached_runs(str(runs)) and len(_keys(folder)) == 1


def test_a_memory_cache_is_stored_in_the_process(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    result = _app(runs, "memory", tmp_path / "unused", 1, str(os.getpid()))
    assert result["handed_off"] == 0 and result["stores"] == 1
    assert not detached_runs(str(runs))


def test_only_stores_another_process_can_open_have_a_spec(tmp_path: Path) -> None:
    assert reopen_spec(rc.Cache(MemoryBackend())) is None
    assert reopen_spec(rc.Cache(CallbackBackend(lambda k: None, lambda k, v: None))) is None
    assert reopen_spec(rc.Cache(None)) is None
    folder = DirectoryBackend(tmp_path / "d", max_size="1MB")
    spec = reopen_spec(rc.Cache(TieredBackend([MemoryBackend(), folder])))
    assert spec == {"tiers": [reopen_spec(rc.Cache(folder))]}
    opened = open_spec(reopen_spec(rc.Cache(folder)) or {})
    assert isinstance(opened, DirectoryBackend)
    assert opened.root == folder.root and opened.max_size == folder.max_size
    # Unsigned only by Cache(insecure=True): the other process would (rightly) refuse it.
    shared = DirectoryBackend(tmp_path / "s", shared=True)
    assert reopen_spec(rc.Cache(shared, insecure=True)) is None
    assert reopen_spec(rc.Cache(shared, secret=SECRET)) is not None


def test_an_unsigned_shared_store_is_refused_by_the_detached_store(tmp_path: Path) -> None:
    runs, folder = tmp_path / "runs", tmp_path / "shared"
    DirectoryBackend(folder, shared=True)
    runs.mkdir()
    jobs = runs / "x.jobs"
    fingerprint = device_fingerprint(opencl_device())
    job = ["__kernel void u(__global int *a) { a[0] = 1; }", [], "", [fingerprint], "m", ["k"], 0.1]
    jobs.write_bytes(msgpack.packb([job], use_bin_type=True))
    spec = {"dir": str(folder), "options": {"shared": True}, "insecure": False}
    child = subprocess.Popen(
        python_command("runtime_cache.opencl.detached_worker"),
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=runs,
        env=dict(os.environ, RUNTIME_CACHE_OPENCL_DETACHED_DIR=str(runs)),
    )
    assert child.stdin is not None
    message = {"spec": spec, "secret": None, "producer": "t", "jobs": str(jobs), "seconds": 60}
    write_message(child.stdin, message)
    child.stdin.close()
    assert child.wait(timeout=120) == 1
    (record,) = detached_runs(str(runs))
    assert "InsecureStoreError" in record["error"] and record["stored"] == 0
    assert not _keys(folder, shared=True) and not jobs.exists()


def test_a_signed_shared_store_is_signed_by_the_detached_store(tmp_path: Path) -> None:
    runs, folder, salt = tmp_path / "runs", tmp_path / "shared", str(os.getpid())
    cold = _app(runs, "shared", folder, 1, salt, stdin=SECRET)
    assert cold["handed_off"] == 1
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    (key,) = _keys(folder, shared=True)
    assert rc.Cache(DirectoryBackend(folder, shared=True), secret=SECRET).get(key)
    other = rc.Cache(DirectoryBackend(folder, shared=True), secret="another secret")
    assert other.get(key) is None  # signed with the parent's secret, and checked
    assert SECRET not in (runs / "detached.log").read_text(errors="replace")


def test_a_killed_detached_store_leaves_no_partial_entry(tmp_path: Path) -> None:
    runs, folder, salt = tmp_path / "runs", tmp_path / "cache", str(os.getpid())
    count = 6
    assert _app(runs, "dir", folder, count, salt)["handed_off"] == count
    deadline = time.monotonic() + 120
    while not _keys(folder) and time.monotonic() < deadline:
        time.sleep(0.01)
    (running,) = runs.glob("*.running")
    os.kill(int(running.stem), signal.SIGKILL)
    assert wait_for_detached_stores(timeout=30, folder=str(runs))
    stored = _keys(folder)
    assert 0 < len(stored) < count, "killed mid-way"
    cache = rc.Cache(DirectoryBackend(folder))
    assert all(cache.get(key) for key in stored), "every entry is whole"
    assert cache.stats().corrupt == 0
    # The next run loads what was stored and builds (then hands off) the rest.
    warm = _app(runs, "dir", folder, count, salt)
    assert warm["loads"] == len(stored) and warm["builds"] == count - len(stored)
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    assert len(_keys(folder)) == count


def test_a_redis_store_is_reopened_from_its_url(tmp_path: Path, redis_server: Any) -> None:
    runs, salt = tmp_path / "runs", f"{os.getpid()}{time.time_ns() % 100000}"
    url = f"{redis_server.url}?namespace=detached{salt}"
    cold = _app(runs, "url", url, 1, salt, stdin=SECRET)
    assert cold["handed_off"] == 1
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    assert detached_runs(str(runs))[0]["stored"] == 1
    warm = _app(runs, "url", url, 1, salt, stdin=SECRET)
    assert warm["builds"] == 0 and warm["loads"] == 1


def test_a_records_folder_others_can_write_keeps_the_store_in_the_process(
    tmp_path: Path,
) -> None:
    runs, folder = tmp_path / "runs", tmp_path / "cache"
    runs.mkdir()
    runs.chmod(0o777)  # whoever writes there could swap the jobs file
    result = _app(runs, "dir", folder, 1, str(os.getpid()))
    assert result["handed_off"] == 0 and result["stores"] == 1
    assert not list(runs.iterdir())


def test_a_records_folder_under_a_folder_others_can_swap_keeps_the_store_in_the_process(
    tmp_path: Path,
) -> None:
    """Session 25's open item: the records folder was checked with its parent alone. A
    folder two levels up that others can write (and is not sticky) lets them move the whole
    subtree away and put theirs, with their jobs file, in its place."""
    open_above = tmp_path / "open"
    open_above.mkdir()
    open_above.chmod(0o777)  # not sticky: anyone may rename what lies in it
    runs, folder = open_above / "mine" / "runs", tmp_path / "cache"
    runs.parent.mkdir(mode=0o700)
    result = _app(runs, "dir", folder, 1, str(os.getpid()))
    assert result["handed_off"] == 0 and result["stores"] == 1
    assert not runs.exists() or not list(runs.iterdir())


def test_auto_keeps_a_cheap_read_back_in_the_process(tmp_path: Path) -> None:
    """On a driver whose read-back costs little (not PoCL), "auto" stores at exit itself."""
    if is_pocl():
        pytest.skip("PoCL compiles on read-back: auto hands off at once there")
    runs, folder = tmp_path / "runs", tmp_path / "cache"
    result = _app(runs, "dir", folder, 2, str(os.getpid()), RUNTIME_CACHE_OPENCL_DETACH="auto")
    assert result["builds"] == 2 and result["handed_off"] == 0
    assert len(_keys(folder)) == 2  # stored before the process ended
    assert not detached_runs(str(runs))


def test_a_record_left_by_a_killed_store_does_not_wait_on_a_pid_reused(tmp_path: Path) -> None:
    """The attacker review: `kill -9` of a detached store leaves its `<pid>.running`, and
    a process of any user later given that pid kept wait_for_detached_stores() waiting."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (runs / f"{other.pid}.running").write_text("{}")
        started = time.monotonic()
        assert wait_for_detached_stores(timeout=10, folder=str(runs))
        assert time.monotonic() - started < 5
    finally:
        other.kill()
        other.wait()


def test_a_live_store_whose_command_line_reads_empty_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load, ``/proc/<pid>/cmdline`` of a live detached store read empty now and then
    (Intel's CPU runtime, 1 run in 5-10): the wait ended at once and the app's test found
    one program of two stored. An empty command line of a process with a program file is
    waited for; a kernel thread's (no program file) is not."""
    from runtime_cache.opencl import detached_store

    real_open = open

    def empty_cmdline(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith("/cmdline"):
            return io.BytesIO(b"")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", empty_cmdline)
    assert detached_store._a_worker(os.getpid())  # a live process with a program file
    real_readlink = os.readlink

    def no_program(path: Any) -> str:
        if str(path).endswith("/exe"):
            raise FileNotFoundError(path)
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", no_program)
    assert not detached_store._a_worker(os.getpid())  # as a kernel thread reads


CHDIR_APP = textwrap.dedent(
    """
    import os, sys
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import choose_device, install
    install(rc.Cache(DirectoryBackend(sys.argv[1])))
    src = '#include "val.h"\\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }'
    cl.Program(cl.Context([choose_device()]), src + "//" + sys.argv[2]).build(options=["-I", "inc"])
    os.chdir(sys.argv[3])  # the app moves on before it exits
    """
)


def test_a_detached_store_builds_in_the_folder_the_headers_were_found_from(
    tmp_path: Path,
) -> None:
    """The last review: the detached store planned the keys again in the folder the app was
    in at exit, where a relative -I named nothing: "changed", and nothing stored."""
    runs, folder, project = tmp_path / "runs", tmp_path / "cache", tmp_path / "project"
    (project / "inc").mkdir(parents=True)
    (project / "inc" / "val.h").write_text("#define VAL 3.0f\n")
    env = dict(os.environ, RUNTIME_CACHE_OPENCL_DETACHED_DIR=str(runs))
    env.setdefault("RUNTIME_CACHE_OPENCL_DETACH", "1")
    done = subprocess.run(
        [sys.executable, "-c", CHDIR_APP, str(folder), str(os.getpid()), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=project,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert wait_for_detached_stores(timeout=180, folder=str(runs))
    (record,) = detached_runs(str(runs))
    assert record["stored"] == 1 and record["changed"] == 0, record
    assert len(_keys(folder)) == 1


def test_jobs_kept_from_the_hand_off_are_stored_here_not_counted_handed(tmp_path: Path) -> None:
    """helper-82: where the hand-off left out a job (PoCL's, after this process changed its
    extra flags), the whole group was counted handed off and released, and that job was
    never stored. It now stays queued and is stored in the process. (A second platform is
    played: the check answers yes for the first program only.)"""
    script = textwrap.dedent(
        """
        import json, sys
        import pyopencl as cl, runtime_cache as rc, runtime_cache.opencl as rco
        import importlib
        wb = importlib.import_module("runtime_cache.opencl.write_behind")
        cache = rc.Cache(rc.open_backend(sys.argv[1])); rco.install(cache=cache)
        ctx = cl.create_some_context(interactive=False)
        for n in (1, 2):
            cl.Program(ctx, f"__kernel void k{n}(__global float *a) {{ a[0] = {n}; }}").build()
        answers = iter([True, False])
        wb.pocl_flags_unknown = lambda devices: next(answers, False)
        handed = wb.write_behind.detach()
        left = wb.write_behind.pending()
        rco.flush(120)
        print(json.dumps([handed, left, rco.wait_for_detached_stores(120)]))
        """
    )
    env = {
        **os.environ,
        "RUNTIME_CACHE_OPENCL_DETACH": "1",
        "RUNTIME_CACHE_OPENCL_DETACHED_DIR": str(tmp_path / "runs"),
        "POCL_KERNEL_CACHE": "0",
    }
    folder = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, f"dir://{folder}"],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [1, 1, True]
    assert len(_keys(folder)) == 2
