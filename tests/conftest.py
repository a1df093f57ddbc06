"""Shared fixtures: honest skips for real drivers and servers.

A test that needs OpenCL or Redis skips when it is missing, but fails when
RUNTIME_CACHE_REQUIRE_OPENCL=1 / RUNTIME_CACHE_REQUIRE_REDIS=1 says it must be
there (CI sets both).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import runtime_cache as rc

# The driver's own kernel cache stays off in tests, so our cache is what we measure.
os.environ.setdefault("POCL_KERNEL_CACHE", "0")
os.environ.setdefault("CUDA_CACHE_DISABLE", "1")
# The OpenCL crash guard keeps its files in a folder private to this test run.
if "RUNTIME_CACHE_GUARD_DIR" not in os.environ:
    _guard_dir = tempfile.mkdtemp(prefix="rc-guard-")
    os.environ["RUNTIME_CACHE_GUARD_DIR"] = _guard_dir
    atexit.register(shutil.rmtree, _guard_dir, True)  # after the guard's own exit hook


# One hypothesis profile for every property test: the same examples on every run (a CI failure
# reproduces), no deadline (a shared CI box stalls), no example database left behind.
# HYPOTHESIS_PROFILE=explore draws fresh examples, 5x as many.
settings.register_profile(
    "runtime-cache",
    max_examples=300,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "explore", settings.get_profile("runtime-cache"), max_examples=1500, derandomize=False
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "runtime-cache"))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Remove the users and groups that a killed earlier run made and left (root only)."""
    import system_users

    gone = system_users.sweep()
    if gone:
        print(f"removed test users left by runs that were killed: {', '.join(gone)}")


@contextlib.contextmanager
def tmpfs(target: Path, size: str, mode: str = "0755") -> Iterator[Path]:
    """A tmpfs of ``size`` (``"1m"``) mounted at ``target`` (made where missing) while the
    block runs, unmounted after; the test skips where none can be mounted (it needs root
    and CAP_SYS_ADMIN), to fill a file system or make one read-only."""
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a tmpfs")
    options = f"size={size},mode={mode}"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.fixture
def closed_folder() -> Iterator[Path]:
    """A fresh folder that nobody but this user or root can write, nor any folder above it
    (made in the home folder: the temporary folder is sticky, and others can move entries
    into a sticky folder); skips where the home folder or one above it is not so."""
    home = Path.home().resolve()
    for folder in (home, *home.parents):
        info = folder.stat()
        if info.st_uid not in (os.geteuid(), 0) or info.st_mode & 0o022:
            pytest.skip(f"others can write {folder}: no folder only this user can write")
    made = Path(tempfile.mkdtemp(prefix=".runtime-cache-test-", dir=home))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def holding(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A child that takes something (a lease, a lock), prints "held" and keeps it until it
    is killed, at the end of the block."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=cwd, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the file system of ``folder`` with one file, then free ``leave`` bytes of it;
    return the file."""
    filler = folder / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as handle:
        while True:
            handle.write(bytes(4096))
            handle.flush()
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


@pytest.fixture(scope="module")
def ctx() -> Any:
    """A context on the OpenCL device under test, one per test module (skips without one,
    or fails when ``RUNTIME_CACHE_REQUIRE_OPENCL=1``)."""
    from opencl_support import opencl_context

    return opencl_context()


def need(what: str, env: str, reason: str) -> None:
    """Skip with ``reason``, or fail when the environment variable ``env`` is 1."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} is required ({env}=1) but unavailable: {reason}")
    pytest.skip(f"{what} unavailable: {reason}")


@pytest.fixture
def cache(tmp_path: Path) -> rc.Cache:
    """A ``dir://`` cache in the test's own folder, with the OpenCL counters at zero (a test
    module may define its own ``cache``, which then wins)."""
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import reset_opencl_stats

    reset_opencl_stats()
    return rc.Cache(DirectoryBackend(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def _isolated_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test starts with no provider set and a private default cache folder (and no
    refusal already warned of: each key's is warned once a process)."""
    from runtime_cache import check

    check._told.clear()
    rc.reset_cache_provider()
    saved = {k: os.environ.get(k) for k in ("RUNTIME_CACHE", "RUNTIME_CACHE_SECRET")}
    os.environ["RUNTIME_CACHE"] = "dir://" + str(tmp_path_factory.mktemp("default-cache"))
    os.environ.pop("RUNTIME_CACHE_SECRET", None)
    yield
    rc.reset_cache_provider()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
