"""prune keeps an entry written again or used after it weighed it, on real stores.

Another process (here a second cache over the same store) stores ``p0`` again and reads
``p1`` from inside prune's ``on_progress``: after the listing, before any removal. prune
removes only what is still the entry it judged (``Backend.delete_if_unchanged``): on dir://
and memory:// neither goes (a read moves the last use), on redis:// (which keeps no last
use) the one written again stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.api import Backend, StoredItem
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.cli import main
from runtime_cache.cli import maintain as maintain_cli
from runtime_cache.codec import HEADER_SIZE
from runtime_cache.maintenance import prune

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

DAY = 86400.0
SECRET = "prune-races-secret"


def key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="opencl", purpose="prune", device=None)


def fill(cache: rc.Cache, n: int = 4) -> list[rc.CacheKey]:
    keys = [key(i) for i in range(n)]
    for i, k in enumerate(keys):
        cache.put(k, bytes([65 + i]) * 500)
        time.sleep(0.002)  # created in order: p0 is the oldest (LRU where no use is kept)
    return keys


def age_files(root: Path, days: float) -> None:
    """Every entry file of ``root`` last written (and used) ``days`` ago."""
    then = time.time() - days * DAY
    for path in root.rglob("*.rce"):
        os.utime(path, (then, then))


def racer(
    other: rc.Cache, keys: list[rc.CacheKey]
) -> tuple[Callable[[int, int], None], list[bytes]]:
    """An ``on_progress`` that, once, before the first removal, stores p0 again (another
    value) and reads p1 through ``other``; and the value p0 then holds."""
    stored: list[bytes] = []

    def on_progress(done: int, total: int) -> None:
        if done == 1:
            stored.append(b"rebuilt" * 70)
            assert other.put(keys[0], stored[0])
            assert other.get(keys[1]) is not None

    return on_progress, stored


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def redis_url(redis_server: RedisProcess, unique_prefix: str) -> str:
    return f"{redis_server.url}?prefix={unique_prefix}"


@contextlib.contextmanager
def _caches(url: str) -> Iterator[tuple[rc.Cache, rc.Cache]]:
    first = rc.Cache(rc.open_backend(url), secret=SECRET)
    second = rc.Cache(rc.open_backend(url), secret=SECRET)  # another process's
    yield first, second
    first.close()
    second.close()


def test_dir_keeps_what_is_written_again_or_read_during_prune(root: Path) -> None:
    with _caches(f"dir://{root}?max_size=none") as (cache, other):
        keys = fill(cache)
        age_files(root, 40)
        on_progress, stored = racer(other, keys)
        report = prune(cache, older_than="30d", on_progress=on_progress)
        assert sorted(report.changed) == sorted(map(str, keys[:2]))
        assert report.removed == 2 and not report.failed
        assert report.remaining == 2
        assert other.get(keys[0]) == stored[0]
        assert other.get(keys[1]) == bytes([66]) * 500
        assert other.get(keys[2]) is None and other.get(keys[3]) is None


def test_memory_keeps_what_is_written_again_or_read_during_prune() -> None:
    backend = MemoryBackend()
    cache, other = rc.Cache(backend), rc.Cache(backend)
    keys = fill(cache)
    on_progress, stored = racer(other, keys)
    report = prune(cache, older_than="30d", now=time.time() + 40 * DAY, on_progress=on_progress)
    assert sorted(report.changed) == sorted(map(str, keys[:2]))
    assert report.removed == 2
    assert other.get(keys[0]) == stored[0] and other.get(keys[1]) is not None
    assert other.get(keys[2]) is None


def test_redis_keeps_what_is_written_again_during_prune(redis_url: str) -> None:
    # Redis keeps no last use: the read of p1 cannot be told, and p1 (40 days old by the
    # clock prune is given) goes; p0, stored again, stays.
    with _caches(redis_url) as (cache, other):
        keys = fill(cache)
        on_progress, stored = racer(other, keys)
        now = time.time() + 40 * DAY
        report = prune(cache, older_than="30d", now=now, on_progress=on_progress)
        assert report.changed == [str(keys[0])]
        assert report.removed == 3 and report.remaining == 1 and not report.failed
        assert other.get(keys[0]) == stored[0]
        assert all(other.get(k) is None for k in keys[1:])


def test_redis_max_size_keeps_the_newest_and_removes_the_next_oldest(redis_url: str) -> None:
    # LRU by creation time: p0 and p1 are the oldest, but p0 is written again during the
    # prune; it stays and p2 goes in its place.
    with _caches(redis_url) as (cache, other):
        keys = fill(cache)
        sizes = {item.key: item.size for item in cache.backend.scan()}
        cap = sizes[str(keys[0])] * 2 + sizes[str(keys[0])] // 2
        on_progress, stored = racer(other, keys)
        report = prune(cache, max_size=cap, on_progress=on_progress)
        assert report.changed == [str(keys[0])]
        assert report.removed == 2 and report.over_cap == 0
        assert other.get(keys[0]) == stored[0] and other.get(keys[3]) is not None
        assert other.get(keys[1]) is None and other.get(keys[2]) is None


def test_dir_max_size_keeps_entries_used_during_prune(root: Path) -> None:
    with _caches(f"dir://{root}?max_size=none") as (cache, other):
        keys = fill(cache)
        age_files(root, 2)
        for rank, k in enumerate(keys):  # last used in key order: p0 the least recently
            path = next(root.rglob(f"{str(k).rsplit('/', 1)[-1]}.rce"))
            then = time.time() - DAY + rank * 60
            os.utime(path, (then, then))
        size = next(iter(cache.backend.scan())).size
        on_progress, _ = racer(other, keys)
        report = prune(cache, max_size=size * 2, on_progress=on_progress)
        # p0 and p1 changed (kept), so p2 and p3 go to meet the cap.
        assert sorted(report.changed) == sorted(map(str, keys[:2]))
        assert report.removed == 2
        assert {e.key for e in other.entries()} == {str(keys[0]), str(keys[1])}


@pytest.mark.parametrize("store", ["dir", "redis"])
def test_cli_prune_reports_what_it_kept(
    store: str,
    root: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # dir://: --older-than 30d over entries 40 days old, p0 written again and p1 read: both
    # kept, p2 and p3 removed. redis:// (no last use kept): --max-size of 2.5 entries, p0
    # written again: kept, and p1 and p2 removed in its place (p3, the newest, stays).
    url = f"dir://{root}?max_size=none" if store == "dir" else request.getfixturevalue("redis_url")
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", SECRET)
    keys = [key(i) for i in range(4)]
    changed, left = (keys[:2], keys[:2]) if store == "dir" else (keys[:1], [keys[0], keys[3]])
    with _caches(url) as (cache, other):
        for argv in (["--json"], []):
            fill(cache)  # the same 4 entries, written afresh
            if store == "dir":
                age_files(root, 40)
                limit = ["--older-than", "30d"]
            else:
                size = next(iter(cache.backend.scan())).size
                limit = ["--max-size", f"{size * 5 // 2}B"]
            on_progress, _ = racer(other, keys)
            monkeypatch.setattr(maintain_cli, "_progress", lambda *_, p=on_progress: _Progress(p))
            capsys.readouterr()
            code = main(["--cache", url, "prune", *limit, *argv])
            out, err = capsys.readouterr()
            assert code == 0, err
            assert sorted(e.key for e in other.entries()) == sorted(map(str, left))
            if argv:
                report = json.loads(out)
                assert sorted(report["changed"]) == sorted(map(str, changed))
                assert report["removed"] == 2 and report["failed"] == []
                assert report["remaining"] == 2
            else:
                assert "removed 2 entries" in out
                entries = "entry" if len(changed) == 1 else "entries"
                said = f"kept {len(changed)} {entries} written or used during the prune"
                assert said in out


def test_cli_prune_over_the_cap_for_entries_in_use_exits_0(
    root: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator review of session 41: a cache in use (entries written or read while
    prune ran, and kept) left prune over --max-size, and it exited 1, which a cron job
    takes for a failure. It says so, and exits 0; entries that cannot go still make it 1."""
    url = f"dir://{root}?max_size=none"
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", SECRET)
    with _caches(url) as (cache, other):
        keys = fill(cache)
        size = next(iter(cache.backend.scan())).size
        on_progress, _ = racer(other, keys)
        monkeypatch.setattr(maintain_cli, "_progress", lambda *_, p=on_progress: _Progress(p))
        capsys.readouterr()
        code = main(["--cache", url, "prune", "--max-size", f"{size}B"])
        _, err = capsys.readouterr()
        assert sorted(e.key for e in other.entries()) == sorted(map(str, keys[:2]))
        assert code == 0, err
        assert "over --max-size: entries written or used while prune ran were kept" in err


class _Progress:
    """Stands in for the CLI's progress bar: tells ``on_progress``."""

    def __init__(self, on_progress: Callable[[int, int], None]) -> None:
        self.at = on_progress

    def close(self) -> None:
        return None


class _CountingBackend(MemoryBackend):
    """A memory store that counts conditional removals (prune must use them)."""

    def __init__(self) -> None:
        super().__init__()
        self.conditional = 0

    def delete(self, key: str) -> bool:
        raise AssertionError("prune removed an entry unconditionally")

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        self.conditional += 1
        assert len(head) == HEADER_SIZE
        return super().delete_if_unchanged(key, listed, head)


def test_prune_removes_only_through_the_conditional_delete() -> None:
    backend = _CountingBackend()
    cache = rc.Cache(backend)
    fill(cache, 3)
    report = prune(cache, max_size=0)
    assert report.removed == 3 and backend.conditional == 3 and report.changed == []


def test_default_delete_if_unchanged_compares_the_head() -> None:
    class Plain(Backend):
        def __init__(self) -> None:
            self.data: dict[str, bytes] = {}

        def get(self, key: str) -> bytes | None:
            return self.data.get(key)

        def set(self, key: str, value: bytes) -> None:
            self.data[key] = value

        def delete(self, key: str) -> bool:
            return self.data.pop(key, None) is not None

        def keys(self, prefix: str = "") -> Any:
            return iter([k for k in list(self.data) if k.startswith(prefix)])

    plain = Plain()
    plain.set("a/b", b"first-head" + b"." * 10)
    listed = StoredItem("a/b", 20)
    assert plain.delete_if_unchanged("a/b", listed, b"other-head") is False
    assert plain.delete_if_unchanged("a/b", listed, b"first-head") is True
    assert plain.get("a/b") is None


def test_a_delete_set_on_the_instance_sees_prunes_removals() -> None:
    """Review: a ``delete`` hook set on a backend instance (to log, to count) was passed by,
    where one a subclass defines was not."""
    from runtime_cache.backends.memory import MemoryBackend

    backend = MemoryBackend()
    seen: list[str] = []
    real = backend.delete

    def logged(key: str) -> bool:
        seen.append(key)
        return real(key)

    backend.delete = logged  # type: ignore[method-assign]
    cache = rc.Cache(backend)
    keys = fill(cache, 2)
    report = prune(cache, max_size=0)
    assert report.removed == 2 and sorted(seen) == sorted(str(k) for k in keys)


def test_entries_used_during_prune_cost_no_listing_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review: each entry an app used while prune ran was listed again to tell "changed"
    from "stuck", and a dir:// listing reads the hits journal whole (up to 0.5 s): 202
    journal reads for 200 entries used."""
    from runtime_cache.backends import hits_journal
    from runtime_cache.backends.directory import DirectoryBackend

    cache = rc.Cache(DirectoryBackend(tmp_path, max_size=None))
    keys = [key(i) for i in range(50)]
    for k in keys:
        cache.put(k, b"v" * 100)
    time.sleep(1.1)  # (file times: the uses below come after what prune weighs)
    app = rc.Cache(DirectoryBackend(tmp_path, max_size=None))
    reads = []
    real = hits_journal.HitsJournal.read

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(hits_journal.HitsJournal, "read", counted)

    def progress(done: int, total: int) -> None:
        if done == 1:
            for k in keys:
                app.get(k)

    report = prune(cache, older_than=0.5, on_progress=progress)
    assert len(report.changed) == len(keys) - report.removed >= len(keys) - 1
    assert len(reads) <= 2, len(reads)  # the listing's own, not one per entry used
