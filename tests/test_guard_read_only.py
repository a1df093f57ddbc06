"""The crash guard in a folder it can read but not write (a read-only mount): what the
folder holds against loading (its blocklist, and dead processes' marks) is still refused,
and the marks stay for a process that can record them.

Root reads and writes past file modes, so the folders here are read-only mounts (a tmpfs
remounted read-only): the tests skip where none can be mounted."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from guard_scripts import TWO_PROGRAMS

from conftest import need, tmpfs
from runtime_cache.opencl.guard import LoadGuard
from runtime_cache.opencl.known_list import read_lines

D1, D2, D3 = "a" * 32, "b" * 32, "c" * 32

#: Blocklists D1, then dies while loading D2 (as in a driver crash): a dead process's mark.
_BLOCK_THEN_DIE = f"""
import os, signal
from runtime_cache.opencl.guard import guard
guard.block([{D1!r}])
with guard.loading([{D2!r}]):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _remount(where: Path, mode: str) -> None:
    done = subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot remount a tmpfs {mode}: {done.stderr.decode().strip()}")


def _crash_in(folder: Path) -> None:
    """Leave ``folder`` with D1 blocklisted and a dead process's mark of D2."""
    env = {**os.environ, "RUNTIME_CACHE_GUARD_DIR": str(folder)}
    done = subprocess.run([sys.executable, "-c", _BLOCK_THEN_DIE], env=env, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert read_lines(str(folder / "blocklist")) == [D1]
    (mark,) = folder.glob("*.loading")
    assert mark.read_bytes().rstrip(b"\0") == f"{D2}\n".encode()


def test_a_read_only_guard_folder_still_refuses_what_it_blocklisted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Operator review (t8, t9): a guard folder that could not be written turned the guard
    off, its blocklist unread, so a binary that had killed a process loaded again."""
    with tmpfs(tmp_path / f"ro-{uuid.uuid4().hex[:6]}", "1m") as where:
        folder = where / "guard"
        folder.mkdir(mode=0o700)
        _crash_in(folder)
        before = sorted(os.listdir(folder))
        _remount(where, "ro")
        guard = LoadGuard(str(folder))
        try:
            with caplog.at_level(logging.WARNING, logger="runtime_cache.opencl.guard"):
                assert guard.blocked([D1])  # on the blocklist
                # A dead process's: struck (no clearance could be recorded here).
                assert guard.held_back([D2]) and not guard.suspected([D2])
                assert guard.recovered == 1
                assert not guard.blocked([D3])
                guard.block([D3])  # a vetting child's crash: refused in this process
                assert guard.blocked([D3])
                guard.unblock([D1])
                guard.vouch([D3])
                guard.set_aside([D3])
                with guard.loading([D3]):  # unmarked: nothing can be written
                    assert guard._fd is None
            said = [r.getMessage() for r in caplog.records if "cannot be written" in r.message]
            assert len(said) == 1 and "not recorded" in said[0]
        finally:
            guard.close()
        assert sorted(os.listdir(folder)) == before  # the dead mark left in place
        # Writable again: the next process records the dead process's mark at last.
        _remount(where, "rw")
        after = LoadGuard(str(folder))
        try:
            assert after.suspected([D2]) and after.recovered == 1
        finally:
            after.close()
        assert not list(folder.glob("*.loading"))
        assert read_lines(str(folder / "blocklist")) == [D1]
        assert read_lines(str(folder / "suspect")) == [D2]


def test_a_read_only_home_guard_folder_is_still_read_from_the_fallback(tmp_path: Path) -> None:
    """The default folder on a read-only mount: the guard moves to the private temporary
    folder (recording crashes there), and still refuses what the home folder's guard had
    blocklisted, or found a process dead while loading."""
    with tmpfs(tmp_path / "state", "1m") as state:
        home = state / "runtime-cache" / "opencl-guard"
        home.mkdir(parents=True, mode=0o700)
        _crash_in(home)
        _remount(state, "ro")
        code = (
            "from runtime_cache.opencl.guard import guard\n"
            f"print(guard.blocked([{D1!r}]), guard.held_back([{D2!r}]), guard.blocked([{D3!r}]))\n"
            f"guard.block([{D3!r}])\n"
            "print(guard.folder, guard._fd is not None)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "RUNTIME_CACHE_GUARD_DIR"}
        run = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "XDG_STATE_HOME": str(state), "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        one, two, three, folder, marked = run.stdout.split()
        assert (one, two, three) == ("True", "True", "False")
        assert folder.startswith(str(tmp_path / "runtime-cache-")) and marked == "True"
        assert read_lines(os.path.join(folder, "blocklist")) == [D3]  # recorded there
        assert len(list(home.glob("*.loading"))) == 1  # left for a process that can write


def test_a_binary_that_crashed_a_process_is_rebuilt_though_the_guard_is_read_only(
    tmp_path: Path,
) -> None:
    """End to end (t9): with the guard folder read-only after a crash, the binary that was
    loading was loaded again (2 loads, 0 builds); with no child to vet it, it is built from
    source here, and not evicted (a kill from outside dies the same way)."""
    try:
        import pyopencl as cl

        cl.get_platforms()
    except Exception as exc:  # no driver or no platform
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))
    with tmpfs(tmp_path / f"ro-{uuid.uuid4().hex[:6]}", "1m") as where:
        env = {
            **os.environ,
            "RUNTIME_CACHE_GUARD_DIR": str(where / "guard"),
            "RUNTIME_CACHE_OPENCL_VET": "off",  # the guard alone stands between
            "POCL_KERNEL_CACHE": "0",
        }

        def run(mode: str) -> subprocess.CompletedProcess[str]:
            cache = f"dir://{tmp_path / 'cache'}"
            command = [sys.executable, "-c", TWO_PROGRAMS, cache, mode]
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

        cold = run("plain")
        assert cold.returncode == 0, cold.stderr[-2000:]
        assert cold.stdout.split() == ["0", "2", "0", "0"]
        assert run("crash").returncode == -signal.SIGKILL
        _remount(where, "ro")
        after = run("plain")
        assert after.returncode == 0, after.stderr[-2000:]
        assert after.stdout.split() == ["1", "1", "0", "0"]  # the crashed one rebuilt
        assert "cannot be written" in after.stderr
