"""Child processes never import from the current folder: a ``msgpack.py`` planted in the
folder the app runs in must not run in build workers, vetting children or the demo's runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opencl_support import SCALE_SRC, opencl_context

import runtime_cache as rc
from runtime_cache.cli import main as cli_main
from runtime_cache.opencl.child import child_folder, child_path, python_command

opencl = pytest.mark.opencl


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current folder holds a ``msgpack.py`` that leaves a marker file when imported."""
    folder = tmp_path / "app"
    folder.mkdir()
    marker = tmp_path / "planted-module-ran"
    (folder / "msgpack.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    monkeypatch.chdir(folder)
    return marker


def test_child_path_is_the_parents_without_the_current_folder(planted: Path) -> None:
    cwd = os.getcwd()
    paths = child_path()
    assert cwd not in paths and "" not in paths
    assert all(os.path.isabs(p) for p in paths)
    root = str(Path(rc.__file__).resolve().parent.parent)
    assert root in paths  # where this process imported runtime_cache from


def test_a_child_runs_the_module_isolated_in_a_private_folder(planted: Path) -> None:
    command = python_command("json.tool", ["--compact"])
    assert command[:2] == [sys.executable, "-I"]
    done = subprocess.run(
        command, input='{"a": [1, 2]}', capture_output=True, text=True, cwd=child_folder()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '{"a":[1,2]}'
    probe = python_command("runtime_cache.cli", ["--cache", "memory://", "stats"])
    done = subprocess.run(probe, capture_output=True, text=True, cwd=child_folder())
    assert done.returncode == 0, done.stderr
    assert "total" in done.stdout
    assert not planted.exists()
    assert Path(child_folder()).is_dir() and not os.listdir(child_folder())


@opencl
def test_build_workers_do_not_run_the_planted_module(planted: Path) -> None:
    from runtime_cache.opencl.fingerprint import device_fingerprint
    from runtime_cache.opencl.parallel import start_worker, stop_worker

    ctx = opencl_context()
    process = start_worker([device_fingerprint(d) for d in ctx.devices])
    assert process is not None  # the worker imported msgpack (the real one) and opened the device
    assert stop_worker(process) == 0
    assert not planted.exists()


@opencl
def test_vetting_children_do_not_run_the_planted_module(planted: Path) -> None:
    import pyopencl as cl

    from runtime_cache.opencl.vetting import Vetter

    ctx = opencl_context()
    program = cl.Program(ctx, SCALE_SRC).build()
    vetter = Vetter()
    assert vetter.vet(ctx.devices, [(program.binaries, [], "", "")]) == [True]
    assert vetter.started == 1
    assert not planted.exists()


@opencl
def test_demo_runs_do_not_run_the_planted_module(
    planted: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opencl_context()
    code = cli_main(["--cache", "dir://cache", "demo", "--tiny", "--json"])  # relative: made
    result = json.loads(capsys.readouterr().out)  # absolute for the runs in their own folder
    assert code == 0
    assert result["warm"]["cache_stats"]["hits"] > 0
    assert (Path.cwd() / "cache").is_dir()
    assert not planted.exists()
