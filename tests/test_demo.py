"""The demo on a real OpenCL driver (the one under test): the model against numpy, tuning
through the cache, and ``runtime-cache demo`` end to end, cold then warm, on dir:// and Redis."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache import environment
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.cli import main as cli_main
from runtime_cache.demo.phases import PHASES, Phases, Progress
from runtime_cache.demo.report import format_text

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]
opencl = pytest.mark.opencl

REQUIRE = "RUNTIME_CACHE_REQUIRE_OPENCL"


def _device() -> Any:
    from opencl_support import opencl_device

    return opencl_device()


def _demo(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime_cache.demo", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        env=env if env is not None else dict(os.environ, POCL_KERNEL_CACHE="0"),
        check=False,
    )


def _check_cold_then_warm(result: dict[str, Any]) -> None:
    cold, warm = result["cold"], result["warm"]
    assert result["outputs_identical"] is True
    assert cold["output_sha256"] == warm["output_sha256"]
    assert result["max_abs_error"] <= 1e-4
    # Cold tuned every layer and compiled from source; warm did neither.
    assert cold["tuned_layers"] == result["layers"]
    assert warm["tuned_layers"] == 0
    assert warm["phases"]["compile"] == 0.0 and warm["phases"]["tune"] == 0.0
    assert cold["cache_stats"]["hits"] == 0
    assert warm["cache_stats"]["misses"] == 0
    assert warm["cache_stats"]["hits"] >= 2 * result["layers"]  # a record and a program each
    assert warm["records"] == cold["records"]
    for run in (cold, warm):
        assert set(run["phases"]) == set(PHASES)
        assert sum(run["phases"].values()) == pytest.approx(
            run["time_to_first_inference_s"], abs=1e-3
        )
    assert result["speedup"] == pytest.approx(
        cold["time_to_first_inference_s"] / warm["time_to_first_inference_s"], rel=0.01
    )


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    """One ``python -m runtime_cache.demo --tiny --json --keep --fresh-driver-cache`` run
    on a fresh dir:// cache."""
    _device()
    url = f"dir://{tmp_path_factory.mktemp('demo-cache')}"
    done = _demo("--tiny", "--json", "--keep", "--fresh-driver-cache", "--cache", url)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), url


# ---------------------------------------------------------------------- end to end
@opencl
def test_tiny_demo_cold_then_warm_gives_identical_outputs(
    kept_run: tuple[dict[str, Any], str],
) -> None:
    result, url = kept_run
    _check_cold_then_warm(result)
    assert result["cache"] == url
    assert result["driver_cache"] is False


@opencl
def test_the_warm_run_gets_the_drivers_cache_restored_into_an_empty_folder(
    kept_run: tuple[dict[str, Any], str],
) -> None:
    result, _ = kept_run
    assert result["carry_driver_cache"] is True and result["fresh_driver_cache"] is True
    cold, warm = result["cold"]["driver_cache"], result["warm"]["driver_cache"]
    if not cold["carried"]:
        # A driver with no cache of its own to carry (Intel's CPU runtime): nothing is
        # captured or restored, and no driver-cache entry is stored.
        assert not warm["carried"] and warm["restored_files"] == 0
        assert result["entries"]["by_purpose"].get("driver-cache", 0) == 0
        return
    assert cold["carried"] and cold["restored_files"] == 0 and cold["stored"] >= 1
    assert warm["carried"] and warm["restored_files"] > 0
    assert result["entries"]["by_purpose"]["driver-cache"] == 1
    assert "files restored" in format_text(result)


@opencl
def test_keep_leaves_programs_and_records_listable(kept_run: tuple[dict[str, Any], str]) -> None:
    result, url = kept_run
    cache = rc.Cache(rc.open_backend(url))
    infos = list(cache.entries(module_id=result["module_id"]))
    purposes = sorted({info.purpose for info in infos})
    carried = ["driver-cache"] if result["cold"]["driver_cache"]["carried"] else []
    assert purposes == [*carried, "program-binary", "tuning"]
    assert len(infos) == result["entries"]["count"]
    tuning = [info for info in infos if info.purpose == "tuning"]
    assert sorted(info.parts["symbol"] for info in tuning) == sorted(result["cold"]["records"])


@opencl
def test_a_run_whose_cache_stored_nothing_claims_no_speed_up(
    kept_run: tuple[dict[str, Any], str],
) -> None:
    """As on a full disk: the report must not print a speed-up, entries "0 ()", or a driver
    cache "carried" that was never stored (a new-user review saw all three)."""
    import copy

    result = copy.deepcopy(kept_run[0])
    result["warm"]["cache_stats"]["hits"] = 0
    result["entries"] = {"count": 0, "bytes": 0, "by_purpose": {}}
    text = format_text(result)
    assert "faster" not in text and "no cache hits: no speed-up from the cache" in text
    assert "cache entries: none stored" in text and "()" not in text
    if result["warm"]["driver_cache"]["carried"]:
        assert "driver cache: not carried (its entry was not stored" in text
        assert "carried by runtime-cache" not in text


@opencl
def test_text_report_of_a_real_run(kept_run: tuple[dict[str, Any], str]) -> None:
    text = format_text(kept_run[0])
    assert "time to first inference" in text
    assert "outputs identical: yes" in text
    for name in PHASES:
        assert f"  {name} " in text
    assert "kept (see `runtime-cache ls`)" in text
    carried = kept_run[0]["warm"]["driver_cache"]
    if kept_run[0].get("carry_driver_cache"):  # says "carried" only when it was
        assert ("carried by runtime-cache" in text) == carried["carried"]
        assert ("none to carry" in text) != carried["carried"]


@opencl
def test_cli_demo_removes_its_entries_afterwards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _device()
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    url = f"dir://{tmp_path}"
    code = cli_main(["--cache", url, "demo", "--tiny", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    _check_cold_then_warm(result)
    assert result["kept"] is False and result["entries"]["count"] > 0
    assert list(rc.Cache(rc.open_backend(url)).entries()) == []


@opencl
def test_cli_demo_json_goes_out_whole_into_a_small_non_blocking_pipe(tmp_path: Path) -> None:
    """The operator review of the output fixes: the demo (a plug-in command) prints with
    print(), which wrote 4096 of its 4307 bytes into a full non-blocking pipe and exit 0."""
    import fcntl
    import time

    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, 1031, 4096)  # F_SETPIPE_SZ: the smallest pipe
    os.set_blocking(write_end, False)
    child = subprocess.Popen(
        [sys.executable, "-m", "runtime_cache", "demo", "--tiny", "--json"],
        stdout=write_end,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "POCL_KERNEL_CACHE": "0"},
    )
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 512):
        chunks.append(chunk)
        time.sleep(0.01)  # a slow reader: the pipe stays full
    os.close(read_end)
    assert child.wait(600) == 0, child.stderr.read() if child.stderr else ""
    assert json.loads(b"".join(chunks))["outputs_identical"] is True


@opencl
def test_demo_on_redis(redis_server: RedisProcess) -> None:
    _device()
    env = dict(os.environ, POCL_KERNEL_CACHE="0", RUNTIME_CACHE_SECRET="demo-secret")
    done = _demo("--tiny", "--json", "--cache", redis_server.url, env=env)
    assert done.returncode == 0, done.stderr
    _check_cold_then_warm(json.loads(done.stdout))


@opencl
def test_a_demo_on_tiers_with_one_down_gives_its_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator review (helper-77): with the Redis tier of ``dir://...,redis://...``
    down, both runs went well, and then removing the demo's entries raised ("1 of 2 tiers
    could not remove"): the figures were lost, and the exit code was 2, a usage error."""
    import socket

    _device()
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"dir://{tmp_path}/c,redis://127.0.0.1:{port}/0"
    code = cli_main(["--cache", url, "--secret", "demo-secret", "demo", "--tiny", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    _check_cold_then_warm(json.loads(out))
    assert "could not be removed" in err


# ---------------------------------------------------------------------- clean failures
def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


@opencl
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the cold run through /proc")
@pytest.mark.parametrize("module", ["runtime_cache", "runtime_cache.demo"])
def test_ctrl_c_during_the_cold_run_is_a_line_and_exit_130(tmp_path: Path, module: str) -> None:
    """A Ctrl-C (SIGINT to the whole process group) printed a KeyboardInterrupt traceback,
    or "the cold run failed with exit code -2" and exit 1."""
    import signal
    import time

    _device()
    argv = ["--cache", f"dir://{tmp_path}", "demo"] if module == "runtime_cache" else []
    process = subprocess.Popen(
        [sys.executable, "-m", module, *argv],  # the 12-layer model: its cold run is long
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, POCL_KERNEL_CACHE="0", RUNTIME_CACHE=f"dir://{tmp_path}"),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not _children(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # until the cold run has started
    time.sleep(1.0)  # and is compiling
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err, err


@opencl
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_demo_killed_outright_takes_its_run_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``kill -9`` of ``runtime-cache demo`` left its cold run compiling on to the end,
    re-parented to init (the new-user review: it wrote all 50 entries afterwards). And
    its folder of driver caches stayed in the temporary folder for good (the operator
    review of session 41: 93 of them on one machine): the next run sweeps it."""
    import signal
    import time

    from runtime_cache.opencl import scratch

    _device()
    temp = tmp_path / "temp"
    temp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime_cache", "--cache", f"dir://{tmp_path}", "demo"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, POCL_KERNEL_CACHE="0", TMPDIR=str(temp)),
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while not (runs := _children(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runs, "the cold run never started"
    time.sleep(0.5)
    process.kill()
    process.wait(timeout=30)

    def running(pid: int) -> bool:  # a zombie left for an init that does not reap is gone
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while any(map(running, runs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [pid for pid in runs if running(pid)]
    for pid in alive:  # (before the fix: stop it, then fail)
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the cold run outlived the demo"
    left = list(temp.glob("runtime-cache-demo-driver-*"))
    assert len(left) == 1, sorted(temp.iterdir())
    monkeypatch.setattr(scratch, "LEFT_AFTER", 0.0)  # (it is seconds old)
    scratch.sweep_left_folders(str(temp))
    assert not left[0].exists()


@opencl
@pytest.mark.parametrize("hidden", ["no platform", "no device"])
def test_no_opencl_device_names_what_to_install(tmp_path: Path, hidden: str) -> None:
    pytest.importorskip("pyopencl")
    if hidden == "no device" and importlib.util.find_spec("pocl_binary_distribution") is None:
        pytest.skip("pip's PoCL (pocl-binary-distribution, the opencl extra's) is not installed")
    env = {k: v for k, v in os.environ.items() if k != "PYOPENCL_CTX"}
    if hidden == "no platform":  # the ICD loader finds no driver at all
        env["OCL_ICD_VENDORS"] = str(tmp_path / "no-such-folder")
    else:  # pip's PoCL is still found (through PYOPENCL_HOME), but lists no device
        (tmp_path / "vendors").mkdir()
        env.update(OCL_ICD_VENDORS=str(tmp_path / "vendors"), POCL_DEVICES="none")
    done = _demo("--tiny", "--cache", f"dir://{tmp_path / 'cache'}", env=env)
    assert done.returncode == 2, done.stderr
    assert "apt-get install pocl-opencl-icd" in done.stderr
    assert "pip install 'intel-opencl-rt>=2024.0'" in done.stderr
    assert "Traceback" not in done.stderr
    if hidden == "no device":
        assert "PoCL 3.0" in done.stderr  # each platform tried, with its error


@opencl
def test_a_cold_run_that_loads_from_the_cache_is_no_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the tier-down fix (helper-78): when the last run's entries could not be
    removed (immutable files), the "cold" run loaded them, and the demo printed 1.0x and
    exit 0 as if it had measured something."""
    from runtime_cache.demo import cli as demo_cli

    _device()
    monkeypatch.setenv("POCL_KERNEL_CACHE", "0")
    url = f"dir://{tmp_path}"
    assert cli_main(["--cache", url, "demo", "--tiny", "--keep"]) == 0
    monkeypatch.setattr(demo_cli, "remove_entries", lambda cache, module_id, **_: 0)
    capsys.readouterr()
    assert cli_main(["--cache", url, "demo", "--tiny", "--json"]) == 1
    assert "no cold run" in capsys.readouterr().err


def test_a_warm_run_without_hits_or_entries_is_a_failure() -> None:
    from runtime_cache.demo.cli import _broken_cache

    good = {"entries": {"count": 14}, "warm": {"cache_stats": {"hits": 10}}}
    assert _broken_cache(good) is None
    nothing = {"entries": {"count": 0}, "warm": {"cache_stats": {"hits": 0}}}
    assert "stored nothing" in str(_broken_cache(nothing))
    no_hits = {"entries": {"count": 14}, "warm": {"cache_stats": {"hits": 0}}}
    assert "no cache hits" in str(_broken_cache(no_hits))


@opencl
def test_a_demo_on_a_full_disk_says_why_nothing_was_stored(tmp_path: Path) -> None:
    """It said only "the cache stored nothing", and a run that stored part said nothing."""
    from conftest import fill, tmpfs

    with tmpfs(tmp_path / "full", "256k") as full:
        fill(full)
        done = _demo("--tiny", "--cache", f"dir://{full / 'cache'}")
    assert done.returncode == 1, done.stderr
    assert "the cache stored nothing (" in done.stderr
    assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
    assert "cold: " in done.stdout and "cache errors (the last: set: BackendError" in done.stdout


@opencl
def test_a_store_that_fails_after_the_first_inference_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator review: the report said "driver cache: not carried (its entry was not
    stored ...)" with no error count when the disk filled: a run's counters were taken
    before the recapture stored the driver cache's entry, so its failure went uncounted."""
    from runtime_cache.demo import run as demo_run
    from runtime_cache.demo.engine import Engine
    from runtime_cache.errors import BackendError

    _device()

    class FullAfterwards(MemoryBackend):
        full = False

        def set(self, key: str, value: bytes) -> None:
            if self.full:
                raise BackendError("write: No space left on device")
            super().set(key, value)

    backend = FullAfterwards()

    def recapture(engine: Engine) -> int:  # as the driver cache's capture stores its entry
        backend.full = True
        engine.cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"files")
        return 0

    monkeypatch.setattr(Engine, "recapture", recapture)
    with rc.cache_provider(rc.Cache(backend)):
        report = demo_run.first_inference("tiny", None, None)
    stats = report["cache_stats"]
    assert stats["errors"] == 1 and "No space left" in stats["last_error"], stats


@opencl
@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("memory://", "outlives"),
        ("nosuch://x", "no backend for scheme 'nosuch'"),
        ("off", "caching is off"),
    ],
)
def test_unusable_cache_is_a_clean_error(url: str, message: str) -> None:
    _device()
    done = _demo("--tiny", "--cache", url)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("other", ["--driver-cache", "--no-carry-driver-cache"])
def test_a_fresh_driver_cache_that_nothing_would_fill_is_refused(other: str) -> None:
    done = _demo("--tiny", "--fresh-driver-cache", other, "--cache", "dir:///nonexistent/x")
    assert done.returncode == 2 and "--fresh-driver-cache needs" in done.stderr
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------- in process
def _engine(model_name: str, cache: rc.Cache) -> Any:
    from runtime_cache.demo.engine import Engine
    from runtime_cache.demo.model import build_model

    return Engine(build_model(model_name), _device(), cache=cache, phases=Phases())


@opencl
def test_full_model_matches_numpy() -> None:
    from runtime_cache.demo.model import make_weights, reference

    cache = rc.Cache(MemoryBackend())
    engine = _engine("cnn", cache)
    assert len(engine.model.layers) == 12
    # Seed each layer's record with its largest tile, so this test compiles 12 programs
    # instead of tuning them all; the tuner itself is exercised on the tiny model.
    for layer in engine.model.layers:
        tile, local = layer.candidates(engine.max_work_group)[-1]
        engine.tuning.put(layer.symbol, {"tile": tile, "local_size": list(local)})
    engine.prepare()
    out = engine.infer()
    expected = reference(engine.model, engine.input, make_weights(engine.model))
    assert out.shape == (2, 10)
    assert abs(out - expected).max() <= 1e-4
    assert abs(out.sum(axis=1) - 1.0).max() <= 1e-5  # softmax rows


@opencl
def test_tuned_model_warm_from_the_cache_is_bit_identical() -> None:
    from runtime_cache.demo.model import make_weights, reference

    cache = rc.Cache(MemoryBackend())
    cold = _engine("tiny", cache)
    cold.prepare()
    first = cold.infer()
    for item in cold.prepared:
        assert item.tuned
        candidates = item.layer.candidates(cold.max_work_group)
        assert item.record["trials"] == len(candidates)
        assert (item.record["tile"], tuple(item.record["local_size"])) in candidates
    assert cold.tuning.symbols() == [layer.symbol for layer in cold.model.layers]

    warm = _engine("tiny", cache)  # a new context: programs come back as binaries
    warm.prepare()
    assert not any(item.tuned for item in warm.prepared)
    assert warm.phases.seconds["compile"] == 0.0
    second = warm.infer()
    assert first.tobytes() == second.tobytes()
    expected = reference(warm.model, warm.input, make_weights(warm.model))
    assert abs(second - expected).max() <= 1e-4


@opencl
def test_a_record_the_layer_cannot_use_is_retuned() -> None:
    cache = rc.Cache(MemoryBackend())
    engine = _engine("tiny", cache)
    first = engine.model.layers[0]
    engine.tuning.put(first.symbol, {"tile": 3, "local_size": [7, 7]})
    engine.prepare()
    assert engine.prepared[0].tuned
    record = engine.tuning.get(first.symbol)
    assert record is not None and record["tile"] in first.tiles


# ---------------------------------------------------------------------- helpers
def test_phases_charge_the_innermost_phase_once() -> None:
    phases = Phases()
    with phases.open("tune"), phases.open("compile") as build:
        build.name = "load"  # a build that turned out to be a cache hit
    total = phases.total()
    assert phases.seconds["compile"] == 0.0  # the renamed phase charged nothing to compile
    assert phases.seconds["run"] == 0.0
    assert sum(phases.seconds.values()) == pytest.approx(total)
    assert set(phases.as_dict()) == set(PHASES)


def test_progress_draws_only_when_enabled() -> None:
    shown, hidden = io.StringIO(), io.StringIO()
    for stream, enabled in ((shown, True), (hidden, False)):
        progress = Progress(4, "cold", stream=stream, enabled=enabled)
        progress.step("tune 01_conv3x3")
        progress.close()
    assert "cold [" in shown.getvalue() and "1/4 tune 01_conv3x3" in shown.getvalue()
    assert hidden.getvalue() == ""


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/0", "redis://user:***@h/0"),
        ("rediss://pw@h", "rediss://***@h"),
        ("redis://h:6379/0?password=pw&db=1", "redis://h:6379/0?password=***&db=1"),
        ("memory://,dir:///tmp/a", "memory://,dir:///tmp/a"),
    ],
)
def test_printed_cache_url_hides_passwords(url: str, shown: str) -> None:
    from runtime_cache.urls import redact  # the demo prints through the one redactor

    assert redact(url) == shown


def test_the_default_cache_is_shown_as_a_url_that_opens_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new-user review: a home folder named with a space, '#' or '%' was shown raw, and
    pasting the line into --cache failed (a fragment) or named another folder."""
    import argparse

    from runtime_cache.demo.cli import _cache_url
    from runtime_cache.urls import BackendURL

    for name in ("my home#1", "pct%41"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / name))
        monkeypatch.delenv("RUNTIME_CACHE", raising=False)
        _, shown = _cache_url(argparse.Namespace(cache=None))
        assert BackendURL.parse(shown).folder() == str(tmp_path / name / "runtime-cache")


def test_the_demo_opens_the_default_cache_where_the_library_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator review: with the user cache folder unusable (a read-only
    XDG_CACHE_HOME), `ls` and the library fell back to the private temporary folder, and
    `demo` failed: "open of ...: Read-only", exit 2. It falls back the same way, and says so."""
    import argparse
    import logging
    import tempfile
    import threading

    from runtime_cache.demo import cli as demo_cli

    (tmp_path / "runtime-cache").write_text("not a folder")  # the default can't be made
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("RUNTIME_CACHE", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(environment, "_warned", threading.Event())  # (said once a process)
    url, _ = demo_cli._cache_url(argparse.Namespace())
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        cache, opened = demo_cli._open(url, None)
    fallback = tmp_path / environment.fallback_name("cache")
    assert opened == f"dir://{fallback}" and cache.backend.root == fallback
    assert (
        "no usable home folder" in caplog.text and str(tmp_path / "runtime-cache-") in caplog.text
    )
    with rc.cache_provider("dir://") as library:
        assert library.backend.root == cache.backend.root
    cache.close()


def test_the_global_secret_reaches_the_demo_and_its_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import argparse

    from runtime_cache.demo import cli as demo_cli
    from runtime_cache.demo.runs import child_env, write_secret_file

    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "from-env")
    monkeypatch.setenv("RUNTIME_CACHE_SECRET_FILE", "/nonexistent")
    args = argparse.Namespace(secret_keys=["new", "old"])
    keys = demo_cli._secret(args)
    assert keys == ["new", "old"]
    (tmp_path / "a").mkdir(mode=0o700)
    env = child_env("dir:///tmp/x", False, None, write_secret_file(keys, str(tmp_path / "a")))
    assert "RUNTIME_CACHE_SECRET" not in env
    monkeypatch.setattr(os, "environ", env)
    assert environment.read_secret() == ["new", "old"]  # what a run reads
    # Joined at commas, a secret file's key that holds one, or a short old key of a
    # rotation, broke the runs (the third review): they are passed as the file has them.
    for n, secret in enumerate((["correct horse, battery staple"], ["new-key-0123456789", "old"])):
        folder = tmp_path / str(n)
        folder.mkdir(mode=0o700)
        path = write_secret_file(secret, str(folder))
        monkeypatch.setattr(os, "environ", child_env("dir:///tmp/x", False, None, path))
        assert environment.read_secret() == secret
        assert os.stat(path).st_mode & 0o077 == 0
    # A key with a line break cannot be passed so (it was split into two keys).
    with pytest.raises(demo_cli.DemoError, match="line break"):
        write_secret_file(["line1\nline2-secret"], str(tmp_path))
    monkeypatch.undo()
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "from-env")
    assert demo_cli._secret(argparse.Namespace()) == ["from-env"]


def test_the_secret_may_follow_demo_as_it_follows_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runtime-cache demo --secret-file F`` was a usage error ("unrecognized arguments")."""
    from runtime_cache.cli.app import build_parser
    from runtime_cache.demo import cli as demo_cli

    monkeypatch.delenv("RUNTIME_CACHE_SECRET", raising=False)
    monkeypatch.delenv("RUNTIME_CACHE_SECRET_FILE", raising=False)
    secret = tmp_path / "secret"
    secret.write_text("first\nsecond\n")
    args = build_parser().parse_args(["demo", "--secret-file", str(secret), "--tiny"])
    assert args.secret_file == str(secret)
    args = build_parser().parse_args(["demo", "--secret", "a,b"])
    assert args.secret == "a,b"
    # python -m runtime_cache.demo reads them itself
    standalone = demo_cli.build_parser().parse_args(["--secret-file", str(secret)])
    assert demo_cli._secret(standalone) == ["first", "second"]
    assert demo_cli._secret(demo_cli.build_parser().parse_args(["--secret", "x"])) == ["x"]


def test_two_different_models_asked_for_is_a_usage_error() -> None:
    """`demo --model cnn --tiny` ran the tiny model without a word."""
    from runtime_cache.demo import cli as demo_cli

    code = demo_cli.main(["--model", "cnn", "--tiny"])
    assert code == 2


def test_the_runs_carry_the_drivers_cache_only_in_folders_the_demo_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The H200 run of the suite: NVIDIA's files, one set per device, were stored under the
    device's key, which the demo neither listed nor removed, and a later demo's cold run
    restored them (a cache hit: "no cold run"). The runs now store them as the model's, and
    a user's RUNTIME_CACHE_DRIVER_CACHE=1 does not make a run carry the user's own folder."""
    from runtime_cache.demo.runs import child_env

    monkeypatch.setenv("RUNTIME_CACHE_DRIVER_CACHE", "1")
    assert "RUNTIME_CACHE_DRIVER_CACHE" not in child_env("dir:///tmp/x", False)
    assert "RUNTIME_CACHE_DRIVER_CACHE" not in child_env("dir:///tmp/x", True)
    env = child_env("dir:///tmp/x", False, "/tmp/demo-driver")
    assert env["RUNTIME_CACHE_DRIVER_CACHE"] == "1"
    assert env["RUNTIME_CACHE_DRIVER_DIR"] == "/tmp/demo-driver"


def test_a_listing_that_fails_is_not_called_entries_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Operator review, session 36: with the cache's store down, the demo warned that "1 of
    the demo's entries could not be removed", though it could not even list them."""
    from runtime_cache.backends.callback import CallbackBackend
    from runtime_cache.demo.entries import remove_entries
    from runtime_cache.errors import BackendUnavailableError

    def down(*args: object) -> None:
        raise BackendUnavailableError("the store is down")

    cache = rc.Cache(CallbackBackend(load=down, store=down, delete=down, keys=down), strict=True)
    assert remove_entries(cache, "m") == 0
    err = capsys.readouterr().err
    assert "could not be listed" in err and "could not be removed" not in err
    assert "the store is down" in err
