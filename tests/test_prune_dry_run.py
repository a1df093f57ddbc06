"""``prune --dry-run`` and ``prune(dry_run=True)``: what would go, in order, and nothing gone."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.pruning import prune

DEVICE = {"vendor": "Acme", "name": "Acme GPU 7", "driver": "31.0.1"}


def _fill(root: Path, n: int) -> tuple[rc.Cache, list[rc.CacheKey]]:
    cache = rc.Cache(DirectoryBackend(root, max_size=None))
    keys = [
        rc.make_key(module_id=f"net@{i}", runtime="opencl", purpose="program-binary", device=DEVICE)
        for i in range(n)
    ]
    base = time.time() - 3600
    for i, k in enumerate(keys):
        cache.put(k, bytes([i]) * 1000)
    order = [3, 0, 4, 1, 2] if n == 5 else list(range(n))
    for rank, i in enumerate(order):  # last uses, oldest first
        digest = str(keys[i]).rsplit("/", 1)[-1]
        (path,) = root.rglob(f"{digest}.rce")
        os.utime(path, (base + rank * 60, base + rank * 60))
    return cache, keys


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def test_a_dry_run_names_what_would_go_in_order_and_removes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache, keys = _fill(root, 5)
    sizes = {item.key: item.size for item in cache.backend.scan()}
    limit = sum(sizes[str(keys[i])] for i in (4, 1, 2))
    stale = root / ".tmp-0123456789abcdef"  # a leftover a real prune would remove
    stale.write_bytes(b"x")
    os.utime(stale, (1, 1))
    before = _files(root)
    report = prune(cache, max_size=limit, dry_run=True)
    assert report.dry_run and report.removed == 2 and report.leftovers == 0
    assert report.would_remove == [str(keys[3]), str(keys[0])]  # least recently used first
    assert report.freed == sizes[str(keys[3])] + sizes[str(keys[0])]
    assert (report.remaining, report.remaining_bytes, report.over_cap) == (3, limit, 0)
    assert _files(root) == before  # nothing removed, nothing touched
    real = prune(cache, max_size=limit)  # the real run does what the dry run said
    assert (real.removed, real.freed, real.remaining) == (2, report.freed, 3)
    assert not real.dry_run and real.would_remove == []
    assert {item.key for item in cache.backend.scan()} == {str(keys[i]) for i in (4, 1, 2)}
    cache.close()


def test_the_command_says_would_and_leaves_the_folder_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "cache"
    cache, keys = _fill(root, 3)
    cache.close()
    url = f"dir://{root}?max_size=none"
    before = _files(root)
    assert main(["--cache", url, "prune", "--older-than", "1s", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would remove 3 entries") and "nothing was removed" in out
    assert all(str(k) in out for k in keys)
    assert main(["--cache", url, "prune", "--older-than", "1s", "--dry-run", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["dry_run"] is True and found["removed"] == 3
    assert found["would_remove"] == [str(keys[i]) for i in (0, 1, 2)]
    assert _files(root) == before  # no vacuum marker either: a dry run only reads
    assert main(["--cache", url, "prune", "--older-than", "1s"]) == 0
    assert capsys.readouterr().out.startswith("removed 3 entries")
