"""Prune and entries no reader of the cache serves: unsigned ones in a signed store, and
ones dated in the future.

The attacker review of session 40: with a secret, a writer without it planted five
unsigned entries dated in the year 2514 beside five good signed ones in Redis (which
keeps no last uses, so prune goes by the date an entry claims). ``prune --older-than 1s``
and ``prune --max-size`` then removed every good entry and kept all the planted ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import runtime_cache as rc
from runtime_cache.api import StoredItem
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.codec import encode_entry
from runtime_cache.errors import BackendUnavailableError
from runtime_cache.pruning import prune

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

SECRET = "fleet-secret-0123456789abcdef"


class _HeadsDown(MemoryBackend):
    """A store whose heads go unanswered while ``down`` (after its listing answered)."""

    down = False

    def head(self, key: str, size: int) -> bytes | None:
        if self.down:
            raise BackendUnavailableError("the store went away")
        return super().head(key, size)


def _key(name: str) -> rc.CacheKey:
    return rc.make_key(module_id=name, runtime="opencl", purpose="program-binary")


def _plant(cache: rc.Cache, name: str, created_at: float, secret: str | None = None) -> str:
    k = _key(name)
    raw = rc.Cache(cache.backend, insecure=True)  # (the store itself, no check)
    blob = encode_entry(
        str(k),
        k.parts,
        b"X" * 10_000,
        created_at=created_at,
        secret=None if secret is None else secret.encode(),
    )
    raw.backend.set(str(k), blob)
    return str(k)


def _state(cache: rc.Cache, goods: list[str], planted: list[str]) -> tuple[int, int]:
    keys = {item.key for item in cache.backend.scan()}
    return sum(k in keys for k in goods), sum(k in keys for k in planted)


def test_planted_entries_go_before_good_ones(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    cache = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}"), secret=SECRET)
    goods = [str(_key(f"good@{i}")) for i in range(5)]
    for i in range(5):
        cache.put(_key(f"good@{i}"), b"G" * 10_000)
    future = [_plant(cache, f"future@{i}", 2**34 - 1) for i in range(3)]
    unsigned = [_plant(cache, f"unsigned@{i}", time.time() + 60) for i in range(2)]
    size = next(item.size for item in cache.backend.scan() if item.key == goods[0])
    # For size: the five planted go first, though the newest by what they claim.
    report = prune(cache, max_size=5 * size + 100)
    assert _state(cache, goods, future + unsigned) == (5, 0)
    assert report.removed == 5 and sorted(k for k, _ in report.untrusted) == sorted(
        future + unsigned
    )
    assert {why for _, why in report.untrusted} == {
        "dated more than a day in the future",
        "unsigned, and this cache has a secret",
    }
    # For age: one dated in the future goes at any age; a good one only when old enough.
    future = [_plant(cache, f"future@{i}", 2**34 - 1) for i in range(3)]
    report = prune(cache, older_than=3600)
    assert _state(cache, goods, future) == (5, 0) and report.removed == 3
    # A signed entry dated within a day ahead (a fleet's clocks differ) is no suspect.
    ahead = _plant(cache, "ahead", time.time() + 3600, secret=SECRET)
    report = prune(cache, older_than=3600)
    assert report.removed == 0 and report.untrusted == [] and _state(cache, [ahead], [])[0] == 1
    # Without a secret, unsigned entries are the store's own: weighed as any other.
    plain = rc.Cache(cache.backend, insecure=True)
    report = prune(plain, max_size=10**9)
    assert report.untrusted == []
    cache.backend.close()


def test_the_cli_names_why_each_kind_goes_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator review: prune said an entry dated more than a day ahead was one "no
    reader of this cache serves", though reads serve it (a writer's clock ahead); each kind
    is named for what it is now."""
    from runtime_cache.cli import main

    cache = rc.Cache(rc.open_backend(f"dir://{tmp_path}"), secret=SECRET)
    cache.put(_key("good"), b"G" * 100)
    _plant(cache, "ahead", time.time() + 3 * 86_400, secret=SECRET)
    assert cache.get(_key("ahead")) == b"X" * 10_000  # served
    argv = ["--cache", f"dir://{tmp_path}", "--secret", SECRET, "prune", "--older-than", "30d"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 entry dated more than a day in the future" in err and "serves" not in err, err
    _plant(cache, "plain", time.time())
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "1 entry unsigned while this cache has a secret" in err, err


def test_prune_and_verify_say_what_they_did_before_the_store_went_down(
    redis_process: RedisProcess,
) -> None:
    """The operator review: a Redis store that stopped answering midway through prune (or
    verify --repair) gave only the error; 4,537 of 8,000 entries were gone and nothing
    said so. Both stop there now and report what they did."""
    from runtime_cache.maintenance import verify

    cache = rc.Cache(rc.open_backend(redis_process.url), secret=SECRET)
    for i in range(40):
        cache.put(_key(f"e{i}"), b"V" * 1000)

    def down_at(n: int) -> Callable[[int, int], None]:
        def progress(done: int, total: int) -> None:
            if done == n:
                redis_process.kill()

        return progress

    report = prune(cache, max_size=1, on_progress=down_at(11))
    assert report.stopped and report.removed == 10, report
    assert report.remaining == 30 and not report.failed[1:], report
    redis_process.start()  # (a fresh, empty server, and a cache whose breaker is closed)
    cache = rc.Cache(rc.open_backend(redis_process.url), secret=SECRET)
    for i in range(40):
        cache.put(_key(f"e{i}"), b"V" * 1000)
    for i in range(20):
        raw = rc.Cache(cache.backend, insecure=True)  # (the store itself: unsigned junk)
        raw.backend.set(str(_key(f"x{i}")), b"junk")
    report_v = verify(cache, repair=True, on_progress=down_at(31))
    assert report_v.stopped and not report_v.ok and report_v.checked == 30, report_v
    redis_process.start()
    # Every tier of a tiered store down (the re-attack: "every tier failed" was no outage
    # to prune, which went on, then listed nothing and said 4 entries remained of 1,000).
    url = redis_process.url
    cache = rc.Cache(rc.open_backend(f"{url}?prefix=a:,{url}?prefix=b:"), secret=SECRET)
    for i in range(40):
        cache.put(_key(f"e{i}"), b"V" * 1000)
    report = prune(cache, older_than=0, on_progress=down_at(11))
    assert report.stopped and report.removed == 10 and report.remaining == 30, report
    assert not report.failed, report.failed  # (stopped there, not tried on)
    redis_process.start()


def test_a_prune_whose_end_listing_fails_counts_what_each_removal_said() -> None:
    """The second re-attack: the store stopped answering after the end listing's scan, so
    each head raised; the listing left those entries out, and prune said "0 entries
    remain" (exit code 0) while 4 were there. Nor does another thread's failure on the same
    cache count as the listing's (it was taken from the cache's error count)."""
    backend = _HeadsDown()
    cache = rc.Cache(backend)
    for i in range(10):
        cache.put(_key(f"e{i}"), b"V" * 1000)
    size = next(iter(backend.scan())).size

    def last(done: int, total: int) -> None:
        backend.down = done == total

    report = prune(cache, max_size=4 * size, on_progress=last)
    assert report.stopped and report.removed == 6 and report.remaining == 4, report
    backend.down = False
    cache.put(_key("x"), b"V" * 1000)
    cache._counters.add(errors=1)  # (another thread's failure, meanwhile)
    report = prune(cache, max_size=4 * size)
    assert not report.stopped and report.removed == 1 and report.remaining == 4, report


@pytest.mark.parametrize("url", ["memory://", "dir"])
def test_prune_removes_the_truncated_entry_it_found_not_a_good_one(
    url: str, tmp_path: Path
) -> None:
    """The third review: prune listed a truncated entry as corrupt ("the first to go for
    size"), then read its head again without its size, took it for good, kept it and
    removed the least recently used good entry in its place. And an entry longer than its
    head says (padded) was listed as good, though every read removes it."""
    backend = rc.open_backend(f"dir://{tmp_path}" if url == "dir" else url)
    cache = rc.Cache(backend, secret=SECRET)
    keys = [str(_key(f"t{i}")) for i in range(6)]
    for i in range(6):
        cache.put(_key(f"t{i}"), b"V" * 1000)
    size = next(iter(backend.scan())).size
    backend.set(keys[5], (backend.get(keys[5]) or b"")[:-500])  # the newest, cut short
    backend.set(keys[4], (backend.get(keys[4]) or b"") + b"JUNKJUNK")  # padded
    report = prune(cache, max_size=4 * size)
    assert sorted(k for k, _ in report.corrupt) == sorted([keys[4], keys[5]]), report
    assert report.removed == 2 and {item.key for item in backend.scan()} == set(keys[:4])


def test_a_tier_down_at_prunes_end_listing_is_no_empty_store(
    redis_process: RedisProcess, tmp_path: Path
) -> None:
    """The third review: with the entries in a Redis tier below an empty folder, Redis going
    down before prune's end listing made that listing list nothing (a store of tiers lists
    the tiers it reaches), and prune said 0 remained, exit code 0, while Redis held 5. A
    tier down since the first listing is a failed end listing."""
    url = f"dir://{tmp_path},{redis_process.url}"
    shared = rc.Cache(rc.open_backend(redis_process.url), secret=SECRET)
    for i in range(10):
        shared.put(_key(f"r{i}"), b"V" * 1000)
    size = next(iter(shared.backend.scan())).size
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)

    def last(done: int, total: int) -> None:
        if done == total:
            redis_process.kill()

    report = prune(cache, max_size=5 * size, on_progress=last)
    redis_process.start()
    assert report.stopped and report.removed + report.remaining == 10, report


def test_a_tier_that_cannot_tell_sizes_is_not_called_corrupt() -> None:
    """The third review: the size of an entry was asked of the first tier that could tell
    it, not of the one its head came from: a truncated copy below a store that cannot list
    made a good entry, served by every read, corrupt to listings."""
    from runtime_cache.backends.callback import CallbackBackend
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.backends.tiered import TieredBackend

    held: dict[str, bytes] = {}
    top = CallbackBackend(load=held.get, store=held.__setitem__)  # (no keys=: cannot list)
    below = MemoryBackend()
    cache = rc.Cache(TieredBackend([top, below]), secret=SECRET)
    keys = [_key(f"c{i}") for i in range(3)]
    for key in keys:
        cache.put(key, b"V" * 1000)
    below.set(str(keys[1]), (below.get(str(keys[1])) or b"")[:-10])
    skipped: list[tuple[str, str]] = []
    listed = list(cache.entries(on_skip=lambda k, why: skipped.append((k, why))))
    assert len(listed) == 3 and not skipped, skipped
    assert cache.get(keys[1]) == b"V" * 1000


def test_prunes_end_listing_counts_what_a_failing_tier_hid_as_left(tmp_path: Path) -> None:
    """The fourth review: a tier below an empty folder whose heads failed during prune's
    end listing (after its scan answered) hid its entries from that listing, and prune said
    0 remained (exit code 0) while 4 did. An entry that did not go and is not listed again
    counts as left."""
    from runtime_cache.backends.tiered import TieredBackend

    below = _HeadsDown()
    shared = rc.Cache(below, secret=SECRET)
    for i in range(10):
        shared.put(_key(f"b{i}"), b"V" * 1000)
    size = next(iter(below.scan())).size
    cache = rc.Cache(TieredBackend([DirectoryBackend(tmp_path), below]), secret=SECRET)

    def last(done: int, total: int) -> None:
        below.down = done == total

    report = prune(cache, max_size=4 * size, on_progress=last)
    assert report.removed == 6 and report.remaining == 4, report
    assert len(list(below.scan())) == 4


def test_a_corrupt_copy_over_a_good_one_below_keeps_prune_to_its_cap(tmp_path: Path) -> None:
    """The fourth review: a truncated copy in the folder over a good one in the tier below
    was removed, the entry taken for gone, and prune stopped short of its cap (exit 0, 2.4
    KB over). The good copy now read counts, and the least recently used go to meet it."""
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.backends.tiered import TieredBackend

    top, below = DirectoryBackend(tmp_path), MemoryBackend()
    cache = rc.Cache(TieredBackend([top, below]), secret=SECRET)
    keys = [_key(f"g{i}") for i in range(6)]
    for key in keys:
        cache.put(key, b"V" * 1000)
    size = next(iter(below.scan())).size
    for key in keys[4:]:  # the newest two, cut short in the folder alone
        top.set(str(key), (top.get(str(key)) or b"")[:-500])
    report = prune(cache, max_size=4 * size)
    stored = {item.key: item.size for item in cache.backend.scan()}
    assert sum(stored.values()) <= 4 * size and len(stored) == 4, (report, stored)
    assert report.remaining == 4 and not report.over_cap, report
    assert all(cache.get(key) == b"V" * 1000 for key in keys if str(key) in stored)


def test_prune_on_a_store_down_from_the_start_raises_strict_or_not() -> None:
    """The third review: `prune()` on a cache that carries on past failures, over a store
    down before its listing, reported an empty store (0 removed, 0 remaining) while all 10
    entries were there. It raises, as on a strict cache (what the CLI uses)."""
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.errors import BackendUnavailableError

    class Down(MemoryBackend):
        down = False

        def scan(self, prefix: str = "") -> Iterator[StoredItem]:
            if self.down:
                raise BackendUnavailableError("the store went away")
            return super().scan(prefix)

    backend = Down()
    for strict in (False, True):
        cache = rc.Cache(backend, secret=SECRET, strict=strict)
        cache.put(_key("d"), b"V" * 100)
        backend.down = True
        with pytest.raises(BackendUnavailableError):
            prune(cache, max_size=1)
        backend.down = False
        assert cache.stats().errors >= 1
