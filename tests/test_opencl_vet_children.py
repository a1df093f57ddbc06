"""Vetting children that are stopped, signalled from outside, or outlive their app.

The third review of the crash guard found that a vetting child that never answered
its start blocked ``build_all`` for good (130 s and on), that any failed start made
the process load every later unknown binary unvetted, that a ``SIGTERM`` to the
process group condemned a good binary, and that a child whose app was killed
(``kill -9``) spun on at parent 1 with its scratch folder left in ``/tmp``. Real
children on the driver under test, real signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opencl_kernels import SCALE_SRC
from opencl_support import fresh_guard

pytestmark = pytest.mark.opencl

#: A kernel whose trial launch never ends (the zeroed buffer keeps it looping).
SPIN_SRC = """
__kernel void spin(volatile __global int *a) {
    while (a[0] == 0) { }
}
"""


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("RUNTIME_CACHE_GUARD_DIR", str(tmp_path / "guard"))
    yield from fresh_guard(tmp_path / "guard")


def _workers(parent: int) -> list[int]:
    """The pids of the worker processes (build or vetting) whose parent is ``parent``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"runtime_cache.opencl.worker" in command:
            found.append(int(entry))
    return found


def _signal_the_child(sig: int, after: float = 0.0) -> tuple[threading.Thread, list[int]]:
    """Send ``sig`` to this process's next worker child ``after`` seconds after it appears."""
    hit: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            children = _workers(os.getpid())
            if children:
                time.sleep(after)
                os.kill(children[0], sig)
                hit.append(children[0])
                return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, hit


def _item(ctx: Any, source: str) -> tuple[Any, list[str], str, str]:
    import pyopencl as cl

    return cl.Program(ctx, source).build().binaries, [], "", source


def test_a_child_signalled_from_outside_at_its_start_could_not_vet(ctx: Any) -> None:
    from runtime_cache.opencl.vetting import LOCAL, Vetter

    vetter, item = Vetter(), _item(ctx, SCALE_SRC)
    watcher, hit = _signal_the_child(signal.SIGTERM)
    assert vetter.vet(ctx.devices, [item]) == [LOCAL]  # not loaded unvetted (None), not refused
    watcher.join()
    assert hit and not vetter._unavailable
    assert vetter.vet(ctx.devices, [item]) == [True]  # the next batch is vetted as ever


def test_a_stopped_child_is_given_up_on_at_the_start_timeout(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime_cache.opencl import parallel
    from runtime_cache.opencl.vetting import LOCAL, Vetter

    monkeypatch.setattr(parallel, "START_TIMEOUT", 3.0)
    vetter, item = Vetter(), _item(ctx, SCALE_SRC)
    watcher, hit = _signal_the_child(signal.SIGSTOP)
    outcome: list[object] = []
    vetting = threading.Thread(target=lambda: outcome.append(vetter.vet(ctx.devices, [item])))
    started = time.monotonic()
    vetting.start()
    vetting.join(60)
    try:
        assert not vetting.is_alive(), "the stopped child blocked vetting"
        assert outcome == [[LOCAL]] and time.monotonic() - started < 30
        watcher.join()
        assert hit and not Path(f"/proc/{hit[0]}").exists()  # killed and reaped
    finally:
        for pid in hit:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_after_failed_starts_in_a_row_no_child_starts_and_nothing_loads_unvetted(
    ctx: Any,
) -> None:
    from runtime_cache.opencl.vetting import FAILED_STARTS, LOCAL, Vetter

    vetter, item = Vetter(), _item(ctx, SCALE_SRC)
    for _ in range(FAILED_STARTS):
        watcher, hit = _signal_the_child(signal.SIGTERM)
        assert vetter.vet(ctx.devices, [item]) == [LOCAL]
        watcher.join()
        assert hit
    started = vetter.started
    assert vetter.vet(ctx.devices, [item]) == [LOCAL]  # no child, and not loaded unvetted
    assert vetter.started == started and not _workers(os.getpid())


def test_a_sigterm_during_the_trial_launch_sets_nothing_aside(ctx: Any) -> None:
    from runtime_cache.opencl import opencl_stats
    from runtime_cache.opencl.guard import BLOCKED, SET_ASIDE, binary_digest, bindings, guard
    from runtime_cache.opencl.vetting import vet_unknown

    binaries, options, text, source = _item(ctx, SPIN_SRC)
    digests = [binary_digest(b) for b in binaries]
    keys = [f"spin-{i}" for i in range(len(binaries))]
    # Past the child's start and load (about a second), inside its 20 s trial launch.
    watcher, hit = _signal_the_child(signal.SIGTERM, after=5.0)
    load = vet_unknown(ctx.devices, [(binaries, options, text, source)], trusted=False, keys=[keys])
    watcher.join()
    assert hit and load == [False]  # built from source this time
    assert guard.standing(bindings(keys, digests), digests) not in (SET_ASIDE, BLOCKED)
    assert opencl_stats().vet_local == 1 and opencl_stats().vet_failures == 0


_KILLED_APP = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import pyopencl as cl
    from opencl_support import opencl_context
    from runtime_cache.opencl.vetting import Vetter
    ctx = opencl_context()
    source = sys.argv[2]
    program = cl.Program(ctx, source).build()
    print("vetting", flush=True)
    Vetter().vet(ctx.devices, [(program.binaries, [], "", source)])  # spins: killed in it
    """
)


def test_a_killed_app_leaves_no_vetting_child_and_its_folder_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime_cache.opencl import scratch

    temp = tmp_path / "temp"
    temp.mkdir()
    app = subprocess.Popen(
        [sys.executable, "-c", _KILLED_APP, str(Path(__file__).parent), SPIN_SRC],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    try:
        assert app.stdout is not None and app.stdout.readline().strip() == "vetting"
        deadline = time.monotonic() + 60
        while not _workers(app.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        (child,) = _workers(app.pid)
        time.sleep(2.0)  # in its spinning trial launch
        app.kill()
        app.wait(10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{child}").exists(), "the vetting child outlived its app"
    finally:
        app.kill()
    left = sorted(temp.iterdir())  # its child's working folder and the vetting child's
    kinds = [
        next((k for k in (scratch.CHILD, scratch.VET) if p.name.startswith(k)), p.name)
        for p in left
    ]
    assert sorted(kinds) == sorted([scratch.CHILD, scratch.VET])
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(temp))
    held = scratch.Scratch()  # one in use by a live process (this one)
    monkeypatch.setattr(scratch, "LEFT_AFTER", 0.0)  # (the left one is seconds old)
    try:
        assert scratch.sweep_left_folders(str(temp)) == 2
        assert not any(p.exists() for p in left) and Path(held.path).is_dir()
    finally:
        held.remove()
    assert not list(temp.iterdir())


def test_after_a_load_that_hangs_the_rest_of_the_batch_is_built_from_source(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fourth review: N binaries that hang at load cost N x LOAD_TIMEOUT (120 s each),
    a child at a time. Here the first load never returns (the child waits on for the rest
    of its job, which never comes): that binary is refused, the rest could not be vetted."""
    from runtime_cache.opencl import vetting
    from runtime_cache.opencl.vetting import LOCAL, Vetter

    real_write = vetting.write_message

    def cut_short(stream: Any, message: Any) -> None:
        if isinstance(message, list) and message and message[0] == "load":
            stream.write(b"\xff" * 4)  # a part of the length: the child reads on, forever
            stream.flush()
            return
        real_write(stream, message)

    monkeypatch.setattr(vetting, "write_message", cut_short)
    monkeypatch.setattr(vetting, "LOAD_TIMEOUT", 2.0)
    items = [_item(ctx, SCALE_SRC.replace("scale", f"scale{i}")) for i in range(3)]
    vetter = Vetter()
    started = time.monotonic()
    assert vetter.vet(ctx.devices, items) == [False, LOCAL, LOCAL]
    assert vetter.started == 1 and time.monotonic() - started < 15  # one hang, not three


def test_a_child_stopped_from_outside_mid_load_condemns_nothing(
    ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fourth review: a child stopped (SIGSTOP) while it loads ran past its time and
    its binary was condemned; it is stopped from outside, so none of its batch is."""
    from runtime_cache.opencl import parallel, vetting
    from runtime_cache.opencl.vetting import LOCAL, Vetter

    real_start = parallel.start_worker

    def start_then_stop(*args: Any, **kwargs: Any) -> Any:
        process = real_start(*args, **kwargs)
        if process is not None:
            os.kill(process.pid, signal.SIGSTOP)
        return process

    monkeypatch.setattr(parallel, "start_worker", start_then_stop)
    monkeypatch.setattr(vetting, "LOAD_TIMEOUT", 2.0)
    items = [_item(ctx, SCALE_SRC.replace("scale", f"scale{i}")) for i in range(2)]
    assert Vetter().vet(ctx.devices, items) == [LOCAL, LOCAL]


def test_a_shared_build_does_not_vet_again_what_the_first_look_could_not(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fourth review: binaries of a shared cache that the first look could not vet
    (its child never started) were read and vetted again by the shared build that
    follows: two children, two start timeouts, and every hit and ``vet_local`` twice."""
    from opencl_support import generated_sources

    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import OpenCLModule, opencl_stats, parallel, reset_opencl_stats
    from runtime_cache.opencl.guard import guard
    from runtime_cache.opencl.vetting import Vetter

    sources = generated_sources(4)
    cache = rc.Cache(DirectoryBackend(tmp_path / "cache"))  # unsigned, with dir:// leases
    OpenCLModule(ctx, sources, cache=cache).build_all(workers=1)
    monkeypatch.setenv("RUNTIME_CACHE_GUARD_DIR", str(tmp_path / "guard-elsewhere"))
    guard.reset()  # another machine: it knows none of these binaries
    vetter = Vetter()
    monkeypatch.setattr("runtime_cache.opencl.vetting.vetter", vetter)
    monkeypatch.setattr(parallel, "START_TIMEOUT", 0.01)  # no child can say it started
    reset_opencl_stats()
    cache = rc.Cache(DirectoryBackend(tmp_path / "cache"))
    assert OpenCLModule(ctx, sources, cache=cache).build_all(workers=1) == 4
    assert vetter._failed_starts == 1 and opencl_stats().vet_local == 4
    assert cache.stats().hits == 4 and opencl_stats().source_builds == 4
