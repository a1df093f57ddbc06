"""Short multi-process, multi-thread stress runs (the long ones: benchmarks/stress.py, 60 s).

Each run starts real worker processes with several threads on one cache folder
or one real redis-server and checks: no torn read, no lost entry, the size cap
at rest, and each process's stats matching what its threads saw.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))


def _stress(tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "stress.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "stress.py"), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    result: dict[str, object] = json.loads(out.read_text())
    assert result["ops"] and result["thread_errors"] == 0
    assert result["torn"] == 0 and result["corrupt"] == 0 and result["stats_consistent"]
    return result


def test_directory_no_cap_loses_nothing(tmp_path: Path) -> None:
    args = ["--backend", "dir", "--processes", "4", "--seconds", "3", "--cap-mb", "0"]
    result = _stress(tmp_path, *args)
    assert result["lost"] == 0 and result["cap_bytes"] == 0


def test_directory_under_a_cap(tmp_path: Path) -> None:
    args = ["--backend", "dir", "--processes", "4", "--seconds", "3", "--cap-mb", "8"]
    result = _stress(tmp_path, *args)
    assert result["cap_holds_at_rest"] is True
    assert isinstance(result["peak_bytes"], int) and result["peak_bytes"] > 0


def test_redis(tmp_path: Path) -> None:
    from redis_servers import require_redis

    require_redis("redis-server")
    result = _stress(tmp_path, "--backend", "redis", "--processes", "4", "--seconds", "3")
    assert result["lost"] == 0 and result["errors"] == 0


# Regression tests for what the stress runs found.
def test_concurrent_evictions_do_not_empty_the_cache(tmp_path: Path) -> None:
    # Found by stress: every process evicted down to 90% of the cap on its own
    # view, and a file another one had removed first did not count, so together
    # they emptied the cache (4% of the cap left). Now one evicts at a time.
    cap = 100_000
    DirectoryBackend(tmp_path, max_size=None)
    filler = DirectoryBackend(tmp_path, max_size=None)
    for i in range(40):
        filler.set(f"s/t/k{i:02}", bytes(5000))  # 200 KB, twice the cap
    now = time.time()
    for i, path in enumerate(sorted(tmp_path.rglob("*.rce"))):
        os.utime(path, (now - 1000 + i, now - 1000 + i))
    evictors = [DirectoryBackend(tmp_path, max_size=cap) for _ in range(6)]
    barrier = threading.Barrier(len(evictors))

    def evict(backend: DirectoryBackend) -> None:
        barrier.wait()
        backend.enforce_size()

    threads = [threading.Thread(target=evict, args=(b,)) for b in evictors]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left = filler.total_size()
    assert 0.8 * cap <= left <= cap
    kept = sorted(filler.keys())
    assert kept == [f"s/t/k{i:02}" for i in range(40 - len(kept), 40)]  # the newest stay


def test_coalesced_builds_count_as_hits() -> None:
    # Found by stress: a thread served from another thread's build counted as
    # neither hit nor miss, so lookups did not add up.
    cache = rc.Cache(MemoryBackend())
    key = rc.make_key(module_id="m", runtime="stress", purpose="test", device=None)
    gate = threading.Event()
    calls: list[int] = []

    def build() -> bytes:
        calls.append(1)
        gate.wait(10)
        return b"built once"

    threads = [threading.Thread(target=cache.get_or_build, args=(key, build)) for _ in range(6)]
    for t in threads:
        t.start()
    while len(cache._flights) == 0:
        time.sleep(0.001)
    time.sleep(0.05)  # let the others join the flight; any that come later hit the store
    gate.set()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert calls == [1] and stats.builds == 1
    assert stats.hits + stats.misses == 6 and stats.misses == 1


@pytest.mark.parametrize("workers", [8])
def test_threads_share_one_directory_backend(tmp_path: Path, workers: int) -> None:
    backend = DirectoryBackend(tmp_path, max_size=200_000)
    cache = rc.Cache(backend)
    bad: list[str] = []

    def work(n: int) -> None:
        for i in range(150):
            key = rc.make_key(module_id=f"k{i % 30}", runtime="stress", purpose="t", device=None)
            value = cache.get_or_build(key, lambda i=i: f"{i % 30}".encode() * 500)
            if value != f"{i % 30}".encode() * 500:
                bad.append(f"thread {n} got a wrong value for k{i % 30}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert backend.total_size() <= 200_000
    stats = cache.stats()
    assert stats.hits + stats.misses == workers * 150 and stats.corrupt == 0
