"""Driver caches travel: PoCL's kernel cache captured, restored, guarded, trusted only when due.

PoCL reads its folder variable when it starts, so each run is a fresh child
process with its own environment; the test process only plants and inspects.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from opencl_support import generated_sources, opencl_context

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.backends.tiered import TieredBackend
from runtime_cache.errors import CorruptEntryError
from runtime_cache.keys import CacheKey, make_key, module_id_from_sources
from runtime_cache.opencl.driver_cache import (
    PURPOSE,
    DriverCacheSession,
    driver_kind,
    trusted_source,
)
from runtime_cache.opencl.driver_files import (
    TEMP_MARK,
    add_missing,
    pack_files,
    snapshot,
    unpack_files,
)
from runtime_cache.opencl.guard import binary_digest, guard

pytestmark = pytest.mark.opencl

COUNT, SALT = 3, 11

CHILD = textwrap.dedent(
    """
    import json, sys
    from runtime_cache.opencl import prepare_driver_cache
    prepare_driver_cache()  # before PoCL starts
    import numpy as np
    import pyopencl as cl
    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import OpenCLModule, choose_device, opencl_stats

    args = json.loads(sys.argv[1])
    sys.path.insert(0, args["tests"])
    from opencl_support import generated_sources, run_kernel

    backend = DirectoryBackend(args["store"], shared=args["shared"])
    backend.insecure = bool(args["shared"] and not args["secret"])  # unsigned on purpose
    cache = rc.Cache(backend, secret=args["secret"])
    ctx = cl.Context([choose_device()])  # the device under test (PYOPENCL_CTX in CI's matrix)
    module = OpenCLModule(ctx, generated_sources(args["n"], args["salt"]), cache=cache,
                          driver_cache=True)
    module.build_all(workers=1)
    data = np.arange(16, dtype=np.float32)
    ok = all(
        np.array_equal(run_kernel(ctx, module.kernel(f"k{i}"), data), data * (i + 2) + args["salt"])
        for i in range(args["n"])
    )
    stored = module.capture_driver_cache()
    s = opencl_stats()
    session = module._driver.sessions[0]
    print(json.dumps({"ok": ok, "builds": s.source_builds, "restored": session.restored,
                      "stored": stored, "folder": session.folder}))
    """
)


def _env(driver_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")}
    env.update(RUNTIME_CACHE_DRIVER_DIR=str(driver_dir), **extra)
    return env


def _start(
    store: Path, driver_dir: Path, *, shared: bool = False, secret: str | None = None, **env: str
) -> subprocess.Popen[str]:
    args = {
        "store": str(store),
        "shared": shared,
        "secret": secret,
        "n": COUNT,
        "salt": SALT,
        "tests": str(Path(__file__).parent),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(driver_dir, **env),
    )


def _result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _key() -> CacheKey:
    """The key the children use for their module on this machine's first device."""
    from runtime_cache.opencl import device_fingerprint

    device = opencl_context().devices[0]
    return make_key(
        module_id=module_id_from_sources(generated_sources(COUNT, SALT)),
        runtime="opencl",
        purpose=PURPOSE,
        device=device_fingerprint(device),
        driver="pocl",
    )


def _pocl() -> bool:
    """Whether the device under test (the children's too) runs on PoCL.

    On a driver whose cache runtime-cache does not carry (Intel's CPU runtime) this
    asserts so, and the caller returns: there is nothing to capture or restore.
    """
    device = opencl_context().devices[0]
    name = str(device.platform.name)
    if "Portable Computing" in name:
        return True
    from runtime_cache.opencl import device_fingerprint

    kind = driver_kind(device_fingerprint(device))
    if kind is not None:  # NVIDIA: carried, but these runs check PoCL's folder layout
        pytest.skip(f"these runs check PoCL's kernel cache; the first platform is {name!r}")
    return False


def _kernel_files(folder: Path) -> set[str]:
    return {name for name in snapshot(str(folder)) if name.endswith(".so")}


def test_capture_then_restore_into_an_empty_folder(tmp_path: Path) -> None:
    if not _pocl():
        return
    store = tmp_path / "store"
    first = _result(_start(store, tmp_path / "driver1"))
    assert first["ok"] and first["builds"] == COUNT and first["restored"] == 0
    assert first["stored"] >= 1
    cache = rc.Cache(DirectoryBackend(store))
    infos = list(cache.entries(purpose=PURPOSE))
    assert len(infos) == 1 and infos[0].parts["driver"] == "pocl"
    captured = {name for name, _, _ in unpack_files(cache.get(_key()) or b"")}
    assert _kernel_files(tmp_path / "driver1" / "pocl") <= captured

    second = _result(_start(store, tmp_path / "driver2"))
    assert second["ok"] and second["builds"] == 0 and second["restored"] >= COUNT
    assert second["folder"] == str(tmp_path / "driver2" / "pocl")
    assert _kernel_files(tmp_path / "driver2" / "pocl") == _kernel_files(
        tmp_path / "driver1" / "pocl"
    )
    assert second["stored"] == 0  # nothing new: the restored files were all the driver needed


def test_kill_mid_restore_then_a_good_start(tmp_path: Path) -> None:
    if not _pocl():
        return
    store = tmp_path / "store"
    assert _result(_start(store, tmp_path / "driver1"))["stored"] >= 1
    cache = rc.Cache(DirectoryBackend(store))
    key = _key()
    files = unpack_files(cache.get(key) or b"")
    # Many small files that sort first, so the kill lands before PoCL's own files are written.
    padding = [(f"00pad/{i}/x", False, b"p") for i in range(20_000)]
    cache.put(key, pack_padded(files + padding))

    driver = tmp_path / "driver2"
    proc = _start(store, driver)
    pad = driver / "pocl" / "00pad"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if pad.is_dir() and len(os.listdir(pad)) >= 50:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the restore ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert len(os.listdir(pad)) < len(padding)  # killed mid-restore

    after = _result(_start(store, driver))
    assert after["ok"] and after["builds"] == 0 and after["restored"] > 0
    assert not [n for n in snapshot(str(driver / "pocl")) if TEMP_MARK in n]
    assert not any(TEMP_MARK in name for _, _, names in os.walk(driver) for name in names)
    assert cache.get(key) is not None  # a kill while writing is no fault of the entry


def pack_padded(files: list[tuple[str, bool, bytes]]) -> bytes:
    """Pack ``files`` as the capture would (through a real folder)."""
    import msgpack

    return msgpack.packb([[n, e, d] for n, e, d in files], use_bin_type=True)  # type: ignore[no-any-return]


def test_a_forged_entry_in_an_unsigned_shared_store_is_never_restored(tmp_path: Path) -> None:
    if not _pocl():
        return
    store = tmp_path / "team"
    forged = pack_padded(
        [("FORGED/program.bc", False, b"not a program"), ("FORGED/x.so", True, b"")]
    )
    unsigned = DirectoryBackend(store, shared=True)
    unsigned.insecure = True  # a shared store used unsigned on purpose (insecure=1)
    open_store = rc.Cache(unsigned)
    assert not trusted_source(open_store)
    open_store.put(_key(), forged)

    result = _result(_start(store, tmp_path / "driver", shared=True))
    assert result["ok"] and result["restored"] == 0 and result["stored"] == 0
    assert not (tmp_path / "driver" / "pocl" / "FORGED").exists()

    # The same store with a secret supplies what it signed, and only that.
    signed = rc.Cache(DirectoryBackend(store, shared=True), secret="test-secret")
    assert trusted_source(signed)
    good = pack_padded([("SIGNED/extra", False, b"kept")])
    signed.put(_key(), good)
    result = _result(_start(store, tmp_path / "driver3", shared=True, secret="test-secret"))
    assert result["ok"] and result["restored"] == 1
    assert (tmp_path / "driver3" / "pocl" / "SIGNED" / "extra").read_bytes() == b"kept"
    # An unsigned reader of the signed store restores nothing either.
    result = _result(_start(store, tmp_path / "driver4", shared=True))
    assert result["ok"] and result["restored"] == 0


def test_the_users_own_driver_cache_is_left_alone(tmp_path: Path) -> None:
    if not _pocl():
        return
    store = tmp_path / "store"
    assert _result(_start(store, tmp_path / "driver1"))["stored"] >= 1
    # A folder the user chose: PoCL keeps using it, and nothing of ours goes into it.
    mine = tmp_path / "users-pocl"
    (mine / "AB" / "CDEF").mkdir(parents=True)
    sentinel = mine / "AB" / "CDEF" / "program.bc"
    sentinel.write_bytes(b"the user's own")
    result = _result(_start(store, tmp_path / "driver2", POCL_CACHE_DIR=str(mine)))
    assert result["ok"] and result["restored"] == 0 and result["folder"] is None
    assert sentinel.read_bytes() == b"the user's own"
    assert not (tmp_path / "driver2" / "pocl").exists()
    # The driver's default folder (no variable set) is not touched either: PoCL is
    # pointed at ours instead, which gets the restored files.
    home = tmp_path / "home"
    default = home / ".cache" / "pocl" / "kcache"
    (default / "XY").mkdir(parents=True)
    (default / "XY" / "file").write_bytes(b"default")
    before = snapshot(str(home / ".cache" / "pocl"))
    env = {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
    result = _result(_start(store, tmp_path / "driver3", **env))
    assert result["ok"] and result["restored"] > 0
    assert snapshot(str(home / ".cache" / "pocl")) == before


def test_a_module_asking_for_driver_files_it_cannot_have_is_told_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator review: ``OpenCLModule(..., driver_cache=True)`` after the platforms
    were listed, without ``prepare_driver_cache()``, carried nothing and said nothing."""
    from runtime_cache.opencl import driver_folders

    ctx = opencl_context()
    monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
    monkeypatch.setattr(driver_folders, "_told", set())
    with caplog.at_level(logging.INFO, logger="runtime_cache.opencl.driver_folders"):
        for _ in range(2):
            session = DriverCacheSession(
                rc.Cache(MemoryBackend()), ctx.devices[0], "m", driver="pocl"
            )
            assert not session.active
    (said,) = [r for r in caplog.records if "not carried" in r.getMessage()]  # once
    assert said.levelno == logging.WARNING and "prepare_driver_cache()" in said.getMessage()
    monkeypatch.setenv("POCL_CACHE_DIR", "/somewhere/of/yours")
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    assert "folder of yours" in driver_folders.unmanaged_reason("pocl")


def _pocl_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, files: list[Any]
) -> tuple[rc.Cache, DriverCacheSession, bytes]:
    """A session over a memory cache whose entry holds ``files``, the driver pointed at
    ``tmp_path/driver/pocl``."""
    ctx = opencl_context()
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(tmp_path / "driver"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "driver" / "pocl"))
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    cache = rc.Cache(MemoryBackend())
    session = DriverCacheSession(cache, ctx.devices[0], name, driver="pocl")
    assert session.key is not None
    value = pack_padded(files)
    cache.put(session.key, value)
    return cache, session, value


def test_a_set_that_crashed_a_process_is_not_used_here_and_left_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set in use when a process died is never restored here again; its entry stays for
    other machines (a kill from outside dies the same way: the third re-attack review saw a
    shared entry deleted at every start, as nothing clears a set)."""
    cache, session, value = _pocl_session(
        tmp_path, monkeypatch, "crashy", [("CRASH/x.so", True, b"boom")]
    )
    assert session.key is not None
    guard.held_back([])  # (started: its lists read)
    guard._suspect.add(binary_digest(value))  # (as a dead process's mark leaves it)
    try:
        assert session.restore() == 0
    finally:
        guard._suspect.discard(binary_digest(value))
    assert cache.get(session.key) == value
    assert not (tmp_path / "driver" / "pocl" / "CRASH").exists()


def test_a_set_that_crashed_a_process_is_also_removed_from_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restored by the run that crashed, its files stay where the driver loads them: the
    crash repeated on every later run, after the entry itself was gone."""
    pocl = tmp_path / "driver" / "pocl"
    _, session, value = _pocl_session(
        tmp_path, monkeypatch, "crashy2", [("CRASH/x.so", True, b"boom")]
    )
    (pocl / "CRASH").mkdir(parents=True, mode=0o700)
    (pocl / "CRASH" / "x.so").write_bytes(b"boom")  # what the crashed run restored
    (pocl / "OTHER.so").write_bytes(b"the driver's own")
    guard.block([binary_digest(value)])
    assert session.restore() == 0
    assert not (pocl / "CRASH" / "x.so").exists() and (pocl / "OTHER.so").exists()


def test_restored_files_stop_taking_the_blame_once_the_process_lived_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A healthy app killed long after its loads (a container stopped) must not have its
    good driver-cache set dropped by the next start."""
    import time

    from runtime_cache.opencl import driver_cache as carrier

    monkeypatch.setattr(carrier, "SETTLE_AFTER", 0.2)
    _, session, value = _pocl_session(tmp_path, monkeypatch, "lives-on", [("K/x.so", True, b"lib")])
    assert session.restore() == 1
    digest = binary_digest(value)
    assert digest in guard._loading  # blamed while the programs load
    for _ in range(50):
        if digest not in guard._loading:
            break
        time.sleep(0.05)
    assert digest not in guard._loading
    session.settle()  # settling again (at exit) is harmless


def test_a_crashed_sets_files_are_never_removed_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pocl = tmp_path / "driver" / "pocl"
    _, session, value = _pocl_session(
        tmp_path, monkeypatch, "crashy3", [("CRASH/x.so", True, b"boom")]
    )
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x.so").write_bytes(b"the victim's")
    pocl.mkdir(parents=True, exist_ok=True)
    (pocl / "CRASH").symlink_to(victim)  # made by the user, say: still not followed
    guard.block([binary_digest(value)])
    assert session.restore() == 0
    assert (victim / "x.so").read_bytes() == b"the victim's"


def test_a_driver_folder_others_can_write_is_neither_restored_nor_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = opencl_context()
    root = tmp_path / "driver"
    (root / "pocl").mkdir(parents=True)
    os.chmod(root / "pocl", 0o777)  # as in a 1777 folder where another user made it
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(root))
    monkeypatch.setenv("POCL_CACHE_DIR", str(root / "pocl"))
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    cache = rc.Cache(MemoryBackend())
    session = DriverCacheSession(cache, ctx.devices[0], "shared-folder", driver="pocl")
    assert session.key is not None
    cache.put(session.key, pack_padded([("K/x.so", True, b"lib")]))
    assert session.restore() == 0 and not (root / "pocl" / "K").exists()
    (root / "pocl" / "planted.so").write_bytes(b"someone else's")
    assert session.capture() is False


def test_restore_adds_only_missing_files_and_capture_stores_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = opencl_context()
    folder = tmp_path / "driver" / "pocl"
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(tmp_path / "driver"))
    monkeypatch.setenv("POCL_CACHE_DIR", str(folder))
    monkeypatch.setenv("POCL_KERNEL_CACHE", "1")
    (folder / "AA").mkdir(parents=True)
    (folder / "AA" / "kept").write_bytes(b"local")
    cache = rc.Cache(MemoryBackend())
    session = DriverCacheSession(cache, ctx.devices[0], "m", driver="pocl")
    assert session.key is not None
    cache.put(session.key, pack_padded([("AA/kept", False, b"remote"), ("BB/new", True, b"n")]))
    assert session.restore() == 1
    assert (folder / "AA" / "kept").read_bytes() == b"local"  # never overwritten
    assert (folder / "BB" / "new").read_bytes() == b"n"
    assert os.stat(folder / "BB" / "new").st_mode & 0o100
    assert not session.capture()  # nothing new since the restore
    (folder / "CC").mkdir()
    (folder / "CC" / "later").write_bytes(b"jit")
    assert session.capture()
    names = {name for name, _, _ in session.files()}
    assert names == {"AA/kept", "BB/new", "CC/later"}


@pytest.mark.parametrize(
    "name",
    ["../x", "/abs", "a/../b", "a//b", "", "a/./b", f"a/b{TEMP_MARK}1", "a\\b", "a/\x00"],
)
def test_unsafe_file_names_are_refused(name: str) -> None:
    with pytest.raises(CorruptEntryError):
        unpack_files(pack_padded([(name, False, b"")]))


def test_malformed_values_are_refused() -> None:
    for value in (b"\xc1", pack_padded([]) + b"x", b"\x91\x01", b"\x91\x93\xa1a\xc2\x01"):
        with pytest.raises(CorruptEntryError):
            unpack_files(value)
    twice = pack_padded([("a", False, b""), ("a", False, b"")])
    nested = pack_padded([("a", False, b""), ("a/b", False, b"")])
    for value in (twice, nested):
        with pytest.raises(CorruptEntryError):
            unpack_files(value)


def test_pack_and_add_missing_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f").write_bytes(b"1")
    (src / "g").write_bytes(b"2")
    os.chmod(src / "g", 0o700)
    value = pack_files(str(src), ["d/f", "g", "missing"])
    assert value is not None
    files = unpack_files(value)
    assert [(n, e) for n, e, _ in files] == [("d/f", False), ("g", True)]
    dst = tmp_path / "dst"
    assert add_missing(str(dst), files) == 2
    assert add_missing(str(dst), files) == 0
    assert snapshot(str(dst)).keys() == snapshot(str(src)).keys()


def test_private_backends(tmp_path: Path) -> None:
    assert MemoryBackend().private
    assert DirectoryBackend(tmp_path / "mine").private
    assert not DirectoryBackend(tmp_path / "team", shared=True).private
    assert TieredBackend([MemoryBackend(), DirectoryBackend(tmp_path / "mine")]).private
    shared = DirectoryBackend(tmp_path / "team", shared=True)
    assert not TieredBackend([MemoryBackend(), shared]).private
    assert trusted_source(rc.Cache(shared, secret="test-secret"))
    shared.insecure = True  # insecure=1: opens unsigned, and is never a trusted source
    assert not trusted_source(rc.Cache(shared))


def test_an_indexed_folder_is_stored_by_a_later_process_and_restored_index_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVIDIA's layout (one index, files named by hash), written at exit, played on PoCL."""
    ctx = opencl_context()
    root = tmp_path / "driver"
    folder = root / "nvidia"
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(root))
    monkeypatch.setenv("CUDA_CACHE_PATH", str(folder))
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    cache = rc.Cache(MemoryBackend())
    # What an earlier process left at its exit, with nothing stored yet.
    (folder / "a" / "1").mkdir(parents=True)
    (folder / "a" / "1" / "0123").write_bytes(b"sass")
    (folder / "index").write_bytes(b"index: 0123")
    first = DriverCacheSession(cache, ctx.devices[0], "m1", driver="nvidia")
    assert first.restore() == 0
    assert first.capture()  # stores what the earlier process left
    assert {n for n, _, _ in first.files()} == {"a/1/0123", "index"}
    # A fresh folder that the driver's start-up already wrote to: data added, index replaced.
    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "fresh" / "nvidia"))
    (tmp_path / "fresh" / "nvidia").mkdir(parents=True)
    (tmp_path / "fresh" / "nvidia" / "index").write_bytes(b"index: empty")
    other = DriverCacheSession(cache, ctx.devices[0], "m2", driver="nvidia")
    assert other.key == first.key  # one set per device, whatever the module
    assert other.restore() == 2
    assert (tmp_path / "fresh" / "nvidia" / "index").read_bytes() == b"index: 0123"
    assert not other.capture()
    # A warm folder that holds everything is left as it is.
    again = DriverCacheSession(cache, ctx.devices[0], "m3", driver="nvidia")
    assert again.restore() == 0
    # A folder made for one module alone (the demo's runs): its files are that module's, so
    # the module's entries list them, and another module's device-wide set is not restored.
    own = DriverCacheSession(cache, ctx.devices[0], "m4", driver="nvidia", own_folder=True)
    assert own.key is not None and own.key != first.key
    assert own.key.parts["module_id"] == "m4"
    with pytest.raises(ValueError):
        DriverCacheSession(cache, ctx.devices[0], "m", driver="amd")
