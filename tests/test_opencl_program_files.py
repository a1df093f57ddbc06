"""Each program's driver files travel with its binaries during a fleet's cold build.

Real processes on real PoCL: two start cold on one shared store (a folder, or a
real redis-server), each with a fresh driver folder of its own, and each loads
the programs the other built after adding their driver files. In-process tests
plant bad sets and check that they never reach the driver folder.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from opencl_support import opencl_context

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.opencl.counters import opencl_stats
from runtime_cache.opencl.driver_cache import PURPOSE
from runtime_cache.opencl.driver_files import capture_build, snapshot, unpack_files
from runtime_cache.opencl.guard import binary_digest, guard
from runtime_cache.opencl.program_files import ProgramFiles

pytestmark = pytest.mark.opencl
pytest_plugins = ["redis_servers"]

SECRET = "test-secret"
COUNT = 8

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from runtime_cache.opencl import prepare_driver_cache
    prepare_driver_cache()  # before the driver starts
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.opencl import OpenCLModule, choose_device, opencl_stats

    url, secret, go, salt, tests, count = sys.argv[1:7]
    sys.path.insert(0, tests)
    from opencl_support import generated_sources

    cache = rc.Cache(rc.open_backend(url), secret=secret or None)
    ctx = cl.Context([choose_device()])
    sources = generated_sources(int(count), int(salt))
    module = OpenCLModule(ctx, sources, cache=cache, driver_cache=True)
    for name in module.sources:
        module._plan(name)
    while not os.path.exists(go):
        time.sleep(0.005)
    module.build_all(workers=2, processes=True)
    s = opencl_stats()
    print(json.dumps({"builds": s.source_builds, "loads": s.binary_loads,
                      "published": s.driver_files_published,
                      "restored": s.driver_files_restored,
                      "kinds": sorted(module.kernel(n).function_name for n in module.sources)}))
    """
)


def _start(url: str, secret: str, go: Path, salt: int, driver_dir: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")}
    env.update(RUNTIME_CACHE_DRIVER_DIR=str(driver_dir), RUNTIME_CACHE_DRIVER_CACHE="1")
    tests = str(Path(__file__).parent)
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, url, secret, str(go), str(salt), tests, str(COUNT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=driver_dir.parent,
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _carried() -> bool:
    """Whether the device under test's driver cache is carried (PoCL, NVIDIA)."""
    from runtime_cache.opencl import device_fingerprint
    from runtime_cache.opencl.driver_cache import driver_kind

    return driver_kind(device_fingerprint(opencl_context().devices[0])) is not None


@pytest.fixture(params=["dir", "redis", "dir-unsigned"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A shared store's URL and secret ("" for the unsigned one)."""
    if request.param == "dir":
        yield f"dir://{tmp_path / 'cache'}?shared=1", SECRET
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        yield f"{server.url}?prefix=files-{tmp_path.name}:", SECRET
    else:
        yield f"dir://{tmp_path / 'cache'}?shared=1&insecure=1", ""


def test_two_processes_carry_each_programs_driver_files(
    store: tuple[str, str], tmp_path: Path
) -> None:
    if not _carried():
        pytest.skip("the driver under test has no carried cache")
    url, secret = store
    go, salt = tmp_path / "go", time.monotonic_ns() % 100_000
    procs = [_start(url, secret, go, salt, tmp_path / f"driver{i}") for i in range(2)]
    time.sleep(0.2)
    go.write_text("go")
    results = [_result(p) for p in procs]
    assert all(r["kinds"] == sorted(f"k{i}" for i in range(COUNT)) for r in results)
    assert sum(r["builds"] for r in results) == COUNT
    cache = rc.Cache(rc.open_backend(url), secret=secret or None)
    stored = [e for e in cache.entries(purpose=PURPOSE) if e.parts.get("scope") == "program"]
    if not secret:  # an unsigned shared store supplies no driver files and gets none
        assert stored == []
        assert all(r["published"] == 0 and r["restored"] == 0 for r in results)
        return
    # Every program built in a worker stored its files; every program loaded from
    # the other process's binaries had its files added first.
    assert len(stored) == COUNT
    for r in results:
        assert r["published"] == r["builds"]
        assert r["restored"] == r["loads"]
    assert sum(r["restored"] for r in results) == sum(r["loads"] for r in results)


def _files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ProgramFiles, Path]:
    ctx = opencl_context()
    folder = tmp_path / "driver" / "pocl"
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(tmp_path / "driver"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(folder))
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    files = ProgramFiles.open(rc.Cache(MemoryBackend()), ctx, enabled=True, driver="pocl")
    assert files is not None
    return files, folder


def _pack(files: list[list[Any]]) -> bytes:
    return msgpack.packb(files, use_bin_type=True)  # type: ignore[no-any-return]


def test_published_files_restore_into_another_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, folder = _files(tmp_path, monkeypatch)
    packed = _pack([["AB/CDEF/program.bc", False, b"bitcode"], ["index", False, b"never"]])
    assert files.publish("opencl/program-binary/" + "0" * 32, packed) == 1
    assert (folder / "AB" / "CDEF" / "program.bc").read_bytes() == b"bitcode"
    assert not (folder / "index").exists()  # a folder-wide index never travels per program
    other = ProgramFiles(files.cache, files._fingerprint, "pocl", str(tmp_path / "other"))
    before = opencl_stats().driver_files_restored
    with other.loading(["opencl/program-binary/" + "0" * 32, "opencl/program-binary/" + "1" * 32]):
        assert (tmp_path / "other" / "AB" / "CDEF" / "program.bc").read_bytes() == b"bitcode"
    assert opencl_stats().driver_files_restored == before + 1


@pytest.mark.parametrize(
    "value",
    [
        b"\xc1 not msgpack",
        _pack([["../escape", False, b"x"]]),
        _pack([["/abs/path", False, b"x"]]),
        _pack([["AB/x", "yes", b"x"]]),
    ],
)
def test_a_planted_bad_entry_is_dropped(
    value: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, folder = _files(tmp_path, monkeypatch)
    binary_key = "opencl/program-binary/" + "2" * 32
    files.cache.put(files.key(binary_key), value)
    dropped = opencl_stats().driver_files_dropped
    with files.loading([binary_key]):
        pass
    assert files.cache.get(files.key(binary_key)) is None
    assert opencl_stats().driver_files_dropped == dropped + 1
    assert snapshot(str(folder)) == {}
    assert not (tmp_path / "driver" / "escape").exists()


def test_a_set_that_crashed_a_process_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, folder = _files(tmp_path, monkeypatch)
    binary_key = "opencl/program-binary/" + "3" * 32
    value = _pack([["CRASH/program.bc", False, b"boom"]])
    files.cache.put(files.key(binary_key), value)
    guard.block([binary_digest(value)])
    assert files.restore([binary_key]) == []
    assert files.cache.get(files.key(binary_key)) is None
    assert not (folder / "CRASH").exists()


def test_a_crash_while_loading_blocklists_the_set(tmp_path: Path) -> None:
    """A process killed while loading programs with restored files: the next one does not
    restore them (and leaves the entry to other machines)."""
    code = textwrap.dedent(
        """
        import os, signal, sys
        import runtime_cache as rc
        from runtime_cache.backends.directory import DirectoryBackend
        from runtime_cache.opencl.program_files import ProgramFiles
        folder, store, key, mode = sys.argv[1:5]
        cache = rc.Cache(DirectoryBackend(store))
        files = ProgramFiles(cache, {"name": "test"}, "pocl", folder)
        if mode == "crash":
            with files.loading([key]):
                os.kill(os.getpid(), signal.SIGKILL)
        print(len(files.restore([key])))
        """
    )
    store, key = tmp_path / "store", "opencl/program-binary/" + "4" * 32
    cache = rc.Cache(DirectoryBackend(str(store)))
    planted = ProgramFiles(cache, {"name": "test"}, "pocl", str(tmp_path / "unused"))
    cache.put(planted.key(key), _pack([["P/program.bc", False, b"crashes the driver"]]))
    env = dict(os.environ, RUNTIME_CACHE_GUARD_DIR=str(tmp_path / "guard"))

    def run(mode: str, folder: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-c", code, folder, str(store), key, mode]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)

    crashed = run("crash", str(tmp_path / "first"))
    assert crashed.returncode == -signal.SIGKILL
    assert (tmp_path / "first" / "P" / "program.bc").exists()  # added, then the crash
    after = run("restore", str(tmp_path / "second"))
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == "0"
    assert not (tmp_path / "second" / "P").exists()
    assert cache.get(planted.key(key)) is not None  # left to other machines


def test_capture_build_takes_what_one_build_added(tmp_path: Path) -> None:
    (tmp_path / "index").write_bytes(b"old")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "old.bin").write_bytes(b"1")
    before = snapshot(str(tmp_path))
    assert capture_build(str(tmp_path), before) is None
    (tmp_path / "index").write_bytes(b"rewritten")
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "b" / "c" / "new.bin").write_bytes(b"22")
    packed = capture_build(str(tmp_path), before)
    assert packed is not None
    assert [name for name, _, _ in unpack_files(packed)] == ["b/c/new.bin"]


def test_untrusted_or_unmanaged_carry_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = opencl_context()
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(tmp_path / "driver"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "driver" / "pocl"))
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    unsigned = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'shared'}?shared=1&insecure=1"))
    assert ProgramFiles.open(unsigned, ctx, enabled=True, driver="pocl") is None
    signed = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'shared2'}?shared=1"), secret=SECRET)
    assert ProgramFiles.open(signed, ctx, enabled=True, driver="pocl") is not None
    assert ProgramFiles.open(signed, ctx, enabled=False, driver="pocl") is None
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "elsewhere"))  # the user's own folder
    assert ProgramFiles.open(signed, ctx, enabled=True, driver="pocl") is None
