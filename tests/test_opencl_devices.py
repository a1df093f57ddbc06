"""The one device chooser, Intel's PyPI runtime beside the system's drivers, and a source
checkout that is a whole package (``runtime_cache.backends`` found in ``backends/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opencl_support import driver, opencl_device

import runtime_cache as rc
from conftest import need

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.opencl


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=env if env is not None else dict(os.environ),
        check=False,
    )


def test_the_chosen_device_builds_and_is_chosen_once() -> None:
    import pyopencl as cl

    from runtime_cache.opencl.devices import choose_device, try_devices

    device = opencl_device()
    assert choose_device() == device  # the same device, tried once per process
    trial = next(t for t in try_devices() if t.device == device)
    assert trial.works and trial.platform == driver()
    program = cl.Program(cl.Context([device]), "__kernel void k(__global int *a) { a[0] = 1; }")
    program.build()


def test_an_explicit_choice_wins_and_a_bad_one_says_what_exists() -> None:
    from runtime_cache.opencl.devices import NoWorkingDeviceError, choose_device, try_devices

    opencl_device()
    working = [t for t in try_devices() if t.works]
    last = working[-1]
    assert choose_device(str(last.index)) == last.device
    assert choose_device(str(last.device.name)[-12:]) is not None
    with pytest.raises(NoWorkingDeviceError, match="no OpenCL device matches 'no such device'"):
        choose_device("no such device")


def test_pyopencl_ctx_chooses_the_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyopencl as cl

    from runtime_cache.opencl.devices import choose_device, driver_label

    opencl_device()
    for index, platform in enumerate(cl.get_platforms()):
        monkeypatch.setenv("PYOPENCL_CTX", str(index))
        try:
            chosen = choose_device()
        except rc.errors.RuntimeCacheError as exc:  # a driver that cannot build: named
            assert driver_label(platform) in str(exc)
            continue
        assert chosen.platform == platform


@pytest.mark.parametrize("choice", ["9", "0:5", "no-such-platform"])
def test_a_pyopencl_ctx_that_names_no_device_lists_the_devices(
    monkeypatch: pytest.MonkeyPatch, choice: str
) -> None:
    """The new-user review: a typo in PYOPENCL_CTX said to install an OpenCL driver."""
    import pyopencl as cl

    from runtime_cache.opencl.devices import NoWorkingDeviceError, choose_device

    opencl_device()
    monkeypatch.setenv("PYOPENCL_CTX", choice)
    with pytest.raises(NoWorkingDeviceError) as caught:
        choose_device()
    text = str(caught.value)
    assert f"no OpenCL device matches PYOPENCL_CTX={choice!r}; the devices are 0:0 " in text
    assert "install" not in text.lower()
    assert len(cl.get_platforms()) < 9


def test_driver_labels_tell_the_two_pocls_apart() -> None:
    import pyopencl as cl

    from runtime_cache.opencl.devices import driver_label

    opencl_device()
    labels = [driver_label(p) for p in cl.get_platforms()]
    assert len(set(labels)) == len(labels), labels
    for label in labels:
        assert label and "\n" not in label


def test_intel_runtime_is_seen_beside_the_system_drivers() -> None:
    from runtime_cache.opencl.icd import intel_library

    opencl_device()
    if intel_library() is None:
        need("Intel's OpenCL runtime", "RUNTIME_CACHE_REQUIRE_OPENCL", "intel-opencl-rt missing")
    env = {k: v for k, v in os.environ.items() if k != "OCL_ICD_VENDORS"}
    code = (
        "import runtime_cache.opencl, os, pyopencl as cl\n"
        "print(os.environ['OCL_ICD_VENDORS'])\n"
        "print('|'.join(p.name for p in cl.get_platforms()))\n"
    )
    done = _python(code, env)
    assert done.returncode == 0, done.stderr
    folder, names = done.stdout.split("\n")[:2]
    assert "Intel(R) OpenCL" in names.split("|")
    assert "Portable Computing Language" in names.split("|")  # the others stay visible
    icds = {p.name: p.read_text().strip() for p in Path(folder).glob("*.icd")}
    assert icds["runtime-cache-intel-cpu.icd"] == intel_library()
    for system in Path("/etc/OpenCL/vendors").glob("*.icd"):
        assert icds[system.name] == system.read_text().strip()
    # The user's own setting wins.
    done = _python(code, dict(env, OCL_ICD_VENDORS="/etc/OpenCL/vendors"))
    assert done.stdout.split("\n")[0] == "/etc/OpenCL/vendors"
    assert "Intel(R) OpenCL" not in done.stdout


def test_the_source_checkout_finds_every_backend(tmp_path: Path) -> None:
    # As from a checkout's root after a non-editable install: the checkout's runtime_cache
    # comes first on sys.path, and no editable finder maps runtime_cache.backends.
    sites = [p for p in sys.path if p.endswith("-packages")]
    code = (
        "import sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, *{sites!r}]\n"
        "import runtime_cache as rc\n"
        "assert rc.__file__.startswith(sys.path[0]), rc.__file__\n"
        "print(rc.open_backend('memory://'), rc.open_backend('dir://' + sys.argv[1]))\n"
        "from runtime_cache.backends.directory import DirectoryBackend\n"
        "print(DirectoryBackend.__module__, sys.modules['runtime_cache.backends'].__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "MemoryBackend" in done.stdout and "DirectoryBackend" in done.stdout
    assert str(ROOT / "backends" / "__init__.py") in done.stdout
    # python -m runtime_cache, the same way.
    main = (
        "import runpy, sys\n"
        f"sys.path[:0] = [{str(ROOT)!r}, *{sites!r}]\n"
        "sys.argv = ['runtime-cache', '--cache', 'dir://' + sys.argv[1], 'stats']\n"
        "runpy.run_module('runtime_cache', run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", main, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "total" in done.stdout


def test_a_chosen_device_that_cannot_build_names_the_ones_that_can() -> None:
    """`--device 2` on pip's PoCL (which cannot compile for some CPUs, this box's AMD EPYC
    among them) said to install a driver, though devices 0 and 1 built."""
    from runtime_cache.opencl import devices

    trials = [t for t in devices.try_devices() if t.device is not None]
    broken = [t for t in trials if not t.works]
    if not broken or not any(t.works for t in trials):
        pytest.skip("needs one device that builds here and one that cannot (pip's PoCL)")
    with pytest.raises(devices.NoWorkingDeviceError) as caught:
        devices.choose_device(str(broken[0].index))
    text = str(caught.value)
    assert "cannot build a program here" in text and "install" not in text
    working = next(t for t in trials if t.works)
    assert f"{working.index}: " in text and "(cannot build)" in text
