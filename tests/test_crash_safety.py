"""Crash safety of the directory backend: killed writers, their temp files, and partial entries.

The long run is ``python benchmarks/crash_harness.py --trials 200``; this file
runs a short one, and tests the temp-file rules with real killed processes
and controlled mtimes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends import temp_files
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.maintenance import prune, verify

ROOT = Path(__file__).resolve().parent.parent
KEY = rc.make_key(module_id="m", runtime="crash", purpose="test", device={"driver": "1"})

# A writer that creates and locks a temp file the way DirectoryBackend does,
# writes half a value, reports it is ready, then waits to be killed.
WRITER = """
import os, sys, time
from runtime_cache.backends.temp_files import create_locked
fd = create_locked(sys.argv[1])
os.write(fd, b"half a value")
print("ready", flush=True)
time.sleep(120)
"""


def _start_writer(path: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _folder(root: Path) -> Path:
    backend = DirectoryBackend(root)
    rc.Cache(backend).put(KEY, b"good")
    return next(root.rglob("*.rce")).parent


def test_short_crash_harness(tmp_path: Path) -> None:
    out = tmp_path / "crash.json"
    script = str(ROOT / "benchmarks" / "crash_harness.py")
    run = subprocess.run(
        [sys.executable, script, "--trials", "8", "--seed", "7", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result["trials"] == 8 and result["processes_killed"] == 32
    assert result["entries_checked"] > 0
    for name in ("bad_entries", "wrong_values_served", "acknowledged_entries_lost"):
        assert result[name] == 0, name
    assert result["temp_files_not_cleaned"] == 0


def test_killed_writers_temp_file_is_removed_at_once(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    temp = folder / ".tmp-999-1-1"
    proc = _start_writer(temp)
    backend = DirectoryBackend(tmp_path)
    assert backend.vacuum() == 0 and temp.exists()  # alive: its lock is held
    _kill(proc)
    assert temp.exists()  # a fresh file, seconds old, yet its writer is gone
    assert backend.vacuum() == 1 and not temp.exists()
    assert rc.Cache(backend).get(KEY) == b"good"


def test_live_writer_is_never_cleaned_however_old(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    temp = folder / ".tmp-999-1-2"
    proc = _start_writer(temp)
    try:
        os.utime(temp, (time.time() - 86400,) * 2)  # a stalled but live writer
        assert DirectoryBackend(tmp_path).vacuum() == 0 and temp.exists()
    finally:
        _kill(proc)
    assert DirectoryBackend(tmp_path).vacuum() == 1


def test_age_rule_where_the_file_system_has_no_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder(tmp_path)
    now = time.time()
    ages = {".tmp-1-1-1": 240, ".tmp-1-1-2": 299, ".tmp-1-1-3": 301, ".tmp-1-1-4": 3600}
    for name, age in ages.items():
        (folder / name).write_bytes(b"partial")
        os.utime(folder / name, (now - age, now - age))
    monkeypatch.setattr(temp_files, "fcntl", None)  # as on a platform without flock
    assert DirectoryBackend(tmp_path).vacuum() == 2
    assert sorted(p.name for p in folder.glob(".tmp-*")) == [".tmp-1-1-1", ".tmp-1-1-2"]


def test_open_cleans_when_its_hourly_vacuum_is_due(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / ".tmp-5-5-5").write_bytes(b"left by a dead writer")
    marker = tmp_path / ".vacuumed"
    os.utime(marker, (time.time() - 600,) * 2)
    DirectoryBackend(tmp_path)  # vacuumed 10 minutes ago: not due
    assert (folder / ".tmp-5-5-5").exists()
    os.utime(marker, (time.time() - 3700,) * 2)
    DirectoryBackend(tmp_path)  # due: the open cleans it
    assert not (folder / ".tmp-5-5-5").exists()


def test_prune_cleans_temp_files_at_once(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for i in range(3):
        (folder / f".tmp-7-7-{i}").write_bytes(b"x" * 100)
    report = prune(rc.Cache(DirectoryBackend(tmp_path)))
    assert report.leftovers == 3 and not list(folder.glob(".tmp-*"))
    assert report.remaining == 1


@pytest.mark.parametrize("cut", [0, 10, 36, 60, -1])
def test_partial_entry_is_never_served(tmp_path: Path, cut: int) -> None:
    # What a non-atomic writer killed mid-write would leave in place of the entry.
    folder = _folder(tmp_path)
    (path,) = folder.glob("*.rce")
    whole = path.read_bytes()
    path.write_bytes(whole[:cut])
    cache = rc.Cache(DirectoryBackend(tmp_path))
    report = verify(cache)
    assert report.checked == 1 and len(report.bad) == 1
    assert cache.get(KEY) is None
    stats = cache.stats()
    assert (stats.misses, stats.corrupt, stats.hits) == (1, 1, 0)
    assert not path.exists()  # deleted, so the next get_or_build rebuilds it
    assert cache.get_or_build(KEY, lambda: b"rebuilt") == b"rebuilt"
