"""The Cache front: hits and misses, failure policy, coalesced builds, bundles, listings."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.api import StoredItem
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidBundleError,
    InvalidKeyError,
)


def key(i: int = 0, **extra: object) -> rc.CacheKey:
    return rc.make_key(
        module_id=f"mod{i % 2}", runtime="test", purpose="unit", device={"d": 1}, i=i, **extra
    )


class FlakyBackend(MemoryBackend):
    """A real memory store whose calls fail while ``down`` is set, like a dead server."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.read_only = False
        self.gets = 0
        self.heads = 0

    def get(self, k: str) -> bytes | None:
        self.gets += 1
        if self.down:
            raise BackendUnavailableError("server down")
        return super().get(k)

    def head(self, k: str, size: int) -> bytes | None:
        self.heads += 1
        return super().head(k, size)

    def set(self, k: str, v: bytes) -> None:
        if self.down or self.read_only:
            raise BackendError("cannot write")
        super().set(k, v)


def test_hit_miss_and_stats() -> None:
    cache = rc.Cache(MemoryBackend())
    assert cache.get(key()) is None
    assert cache.put(key(), b"v", build_seconds=1.25)
    assert cache.get(key()) == b"v"
    assert cache.get(str(key())) == b"v"
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.stores) == (2, 1, 1)
    assert stats.seconds_saved == pytest.approx(2.5)
    assert stats.bytes_read == 2 * stats.bytes_written > 2
    assert stats.hit_rate == pytest.approx(2 / 3)
    assert key() in cache and key(9) not in cache


def test_put_validates_types() -> None:
    cache = rc.Cache(MemoryBackend())
    with pytest.raises(TypeError):
        cache.put(key(), "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.put("test/unit/" + "0" * 32, b"v")  # type: ignore[arg-type]


@pytest.mark.parametrize("wrong", [123, None, b"test/unit/" + b"0" * 32])
def test_reads_and_deletes_refuse_what_is_no_key(wrong: object) -> None:
    """``get(123)`` was a counted miss (the text "123"), where ``put`` raises."""
    cache = rc.Cache(MemoryBackend())
    cache.put(key(), b"v")
    for call in (cache.get, cache.get_entry, cache.info, cache.delete):
        with pytest.raises(TypeError, match="a cache key is a CacheKey"):
            call(wrong)  # type: ignore[arg-type]
    for many in (cache.get_many, cache.get_many_views):
        with pytest.raises(TypeError, match="a cache key is a CacheKey"):
            many([key(), wrong])  # type: ignore[list-item]
    assert wrong not in cache
    assert cache.stats().misses == 0 and cache.stats().errors == 0
    assert cache.get(str(key())) == b"v"  # its text is a key


def test_corrupt_entry_counted_deleted_rebuilt() -> None:
    backend = MemoryBackend()
    cache = rc.Cache(backend)
    cache.put(key(), b"good")
    backend.set(str(key()), b"garbage")
    assert cache.get_or_build(key(), lambda: b"rebuilt") == b"rebuilt"
    assert cache.stats().corrupt == 1 and cache.stats().builds == 1
    assert cache.get(key()) == b"rebuilt"


def test_entry_under_wrong_name_is_never_served() -> None:
    backend = MemoryBackend()
    cache = rc.Cache(backend)
    cache.put(key(1), b"for key 1")
    backend.set(str(key(2)), backend.get(str(key(1))) or b"")  # a swapped file
    assert cache.get(key(2)) is None
    assert cache.stats().rejected == 1  # not the entry of key(2): rejected, and kept


def test_backend_down_is_a_miss_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    backend = FlakyBackend()
    cache = rc.Cache(backend)
    cache.put(key(), b"v")
    backend.down = True
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        for _ in range(50):
            assert cache.get(key()) is None
            assert cache.put(key(), b"v") is False
        assert cache.get_or_build(key(3), lambda: b"built") == b"built"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one for reads, one for writes: not one per call
    assert cache.stats().errors == 102
    backend.down = False
    assert cache.get(key()) == b"v"


def test_a_value_over_the_memory_cap_is_refused_not_counted_as_stored() -> None:
    """memory://'s stores counter said 1 for a value it never kept (over max_size)."""
    from runtime_cache.errors import EntryTooLargeError

    backend = MemoryBackend(max_size="1KB")
    backend.set("t/p/kept", b"x" * 500)
    with pytest.raises(EntryTooLargeError):
        backend.set("t/p/big", b"y" * 5000)
    assert backend.get("t/p/kept") == b"x" * 500 and backend.get("t/p/big") is None
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.get_or_build(key, lambda: b"z" * 5000) == b"z" * 5000
    assert cache.stats().stores == 0 and cache.stats().errors == 1
    assert list(backend.keys()) == ["t/p/kept"]


def test_read_only_store_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    backend = FlakyBackend()
    cache = rc.Cache(backend)
    cache.put(key(), b"v")
    backend.read_only = True
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        for i in range(20):
            assert cache.get(key()) == b"v"
            assert not cache.put(key(i + 1), b"x")
    assert len(caplog.records) == 1


def test_strict_raises() -> None:
    backend = FlakyBackend()
    backend.down = True
    cache = rc.Cache(backend, strict=True)
    with pytest.raises(BackendUnavailableError):
        cache.get(key())
    with pytest.raises(BackendError):
        cache.put(key(), b"v")


def test_get_or_build_coalesces_threads() -> None:
    cache = rc.Cache(MemoryBackend())
    calls = []
    gate = threading.Event()

    def build() -> bytes:
        calls.append(1)
        gate.wait(5)
        return b"once"

    results: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_build(key(), build)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join()
    assert calls == [1]
    assert results == [b"once"] * 8


def test_get_or_build_shares_failure_and_checks_type() -> None:
    cache = rc.Cache(MemoryBackend())
    with pytest.raises(ZeroDivisionError):
        cache.get_or_build(key(), lambda: 1 // 0)  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError):
        cache.get_or_build(key(), lambda: "str")  # type: ignore[arg-type, return-value]
    assert cache.get_or_build(key(), lambda: b"ok") == b"ok"


def test_entries_do_not_load_values() -> None:
    backend = FlakyBackend()
    cache = rc.Cache(backend)
    for i in range(6):
        cache.put(key(i), b"x" * 10_000, build_seconds=i)
    backend.gets = 0
    infos = list(cache.entries(runtime="test", module_id="mod1"))
    assert sorted(info.parts["i"] for info in infos) == [1, 3, 5]
    assert backend.gets == 0 and backend.heads == 3 * 2
    info = infos[0]
    assert info.size == 10_000 and info.runtime == "test" and info.purpose == "unit"
    assert list(cache.entries(runtime="other")) == []
    assert len(list(cache.entries(runtime="test", purpose="unit"))) == 6


def test_generation_and_dirty() -> None:
    cache = rc.Cache(MemoryBackend())
    assert not cache.dirty
    cache.put(key(), b"v")
    assert cache.dirty
    data = cache.dumps()
    assert not cache.dirty
    cache.dumps(runtime="test")
    cache.delete(key())
    assert cache.dirty and cache.generation == 2
    cache.loads(data)
    assert cache.generation == 3


def test_bundles_filter_and_validate() -> None:
    source = rc.Cache(MemoryBackend())
    for i in range(4):
        source.put(key(i), b"v%d" % i)
    other = rc.make_key(module_id="x", runtime="other", purpose="unit")
    source.put(other, b"o")
    target = rc.Cache(MemoryBackend())
    assert target.loads(source.dumps(runtime="test", module_id="mod0")) == 2
    assert target.get(key(2)) == b"v2" and target.get(key(1)) is None
    assert target.loads(source.dumps()) == 5
    with pytest.raises(InvalidBundleError):
        target.loads(source.dumps()[:-5])
    # An entry whose key does not match its parts is refused.
    forged = codec.encode_entry(str(key(1)), key(2).parts, b"evil", created_at=0.0)
    assert rc.Cache(MemoryBackend()).loads(codec.encode_bundle([forged])) == 0


def test_loads_without_overwrite_keeps_existing() -> None:
    cache = rc.Cache(MemoryBackend())
    cache.put(key(), b"new")
    old = rc.Cache(MemoryBackend())
    old.put(key(), b"old")
    assert cache.loads(old.dumps(), overwrite=False) == 0
    assert cache.get(key()) == b"new"


def test_loads_without_overwrite_replaces_what_fails_the_check() -> None:
    """The attacker review: keep-existing kept whatever sat at a key, so damaged bytes or
    an entry a forger planted unsigned blocked the restore, reported as kept."""
    secret = b"s" * 32
    source = rc.Cache(MemoryBackend(), secret=secret)
    for i in range(3):
        source.put(key(i), b"good %d" % i)
    store = MemoryBackend()
    rc.Cache(store).put(key(0), b"planted")  # unsigned: rejected by the signed cache
    rc.Cache(store, secret=secret).put(key(1), b"theirs")
    store.set(str(key(1)), store.get(str(key(1)))[:-3])  # type: ignore[index]  # damaged
    rc.Cache(store, secret=secret).put(key(2), b"kept")  # good: stays
    cache = rc.Cache(store, secret=secret)
    assert cache.loads(source.dumps(), overwrite=False) == 2
    assert [cache.get(key(i)) for i in range(3)] == [b"good 0", b"good 1", b"kept"]


def test_loads_counts_what_it_wrote_past_a_key_the_store_cannot_hold(tmp_path: Path) -> None:
    """The attack review: a bundle entry named ``x.rce`` (taken by make_key, Redis and
    memory; a ``dir://`` folder cannot hold it) last of four: three were written, and
    ``loads`` said 0. First of a batch, none of the rest were written. Strict or not, it is
    one ``unstorable`` entry, and a ``put_many`` writes the others too."""
    odd = rc.make_key(module_id="m", runtime="x.rce", purpose="unit", device=None)
    loose = rc.Cache(MemoryBackend())
    loose.put_many({key(i): b"v%d" % i for i in range(3)})
    loose.put(odd, b"odd")
    for bundle in (loose.dumps(), codec.encode_bundle(codec.decode_bundle(loose.dumps())[::-1])):
        for strict in (False, True):
            folder = tmp_path / f"{strict}{bundle[-1]}"
            cache = rc.Cache(rc.open_backend(f"dir://{folder}"), strict=strict)
            result = cache.loads(bundle)
            assert int(result) == 3 and cache.stats().stores == 3, strict
            assert result.unstorable == 1
            assert "x.rce" in result.unstorable_errors[0]
            assert sorted(cache.backend.keys("")) == sorted(str(key(i)) for i in range(3))
            again = cache.loads(bundle, overwrite=False)  # (judged by their heads: kept)
            assert (int(again), again.unstorable) == (0, 1)
    cache = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'put'}"))
    assert cache.put_many({odd: b"odd", key(7): b"seven"}) is False
    assert cache.get(key(7)) == b"seven" and cache.stats().stores == 1
    strict = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'strict'}"), strict=True)
    with pytest.raises(InvalidKeyError):  # the caller's own key: raised, once the rest went in
        strict.put_many({odd: b"odd", key(7): b"seven"})
    assert strict.get(key(7)) == b"seven"


def test_secret_signs_and_rejects() -> None:
    backend = MemoryBackend()
    plain = rc.Cache(backend)
    signed = rc.Cache(backend, secret="fleet-secret")
    plain.put(key(1), b"unsigned")
    assert signed.get(key(1)) is None
    assert signed.stats().rejected == 1
    assert plain.get(key(1)) == b"unsigned"  # rejected entries are not deleted
    signed.put(key(2), b"signed")
    assert signed.get(key(2)) == b"signed"
    assert rc.Cache(backend, secret="other").get(key(2)) is None
    bundle = signed.dumps()
    assert (
        rc.Cache(MemoryBackend(), secret="fleet-secret").loads(bundle) == 1
    )  # unsigned one left out
    with pytest.raises(InvalidBundleError):
        rc.Cache(MemoryBackend(), secret="other").loads(bundle)


def test_disabled_cache() -> None:
    cache = rc.Cache(None)
    assert not cache.enabled
    assert cache.put(key(), b"v") is False
    assert cache.get_or_build(key(), lambda: b"v") == b"v"
    assert cache.get(key()) is None
    assert list(cache.entries()) == []


def test_maintenance_verify_and_prune() -> None:
    from runtime_cache import maintenance

    backend = MemoryBackend()
    cache = rc.Cache(backend)
    for i in range(5):
        cache.put(key(i), b"x" * 100)
    backend.set(str(key(3)), b"broken")
    report = maintenance.verify(cache)
    assert report.checked == 5 and [k for k, _ in report.bad] == [str(key(3))]
    report = maintenance.verify(cache, repair=True)
    assert report.removed == 1 and len(list(backend.keys())) == 4
    for i in (0, 1, 2):  # key(4) stays least recently used
        cache.get(key(i))
    size = next(iter(backend.scan())).size
    pruned = maintenance.prune(cache, max_size=3 * size)
    assert pruned.removed == 1 and cache.get(key(4)) is None


@pytest.mark.parametrize(
    "limits",
    [
        {"max_size": True},
        {"max_size": -1},
        {"max_size": "5XB"},
        {"max_size": float("inf")},
        {"max_size": [1]},
        {"older_than": -5},
        {"older_than": float("nan")},
        {"older_than": False},
        {"older_than": "soon"},
    ],
)
def test_prune_refuses_a_size_or_an_age_that_means_nothing(limits: dict[str, Any]) -> None:
    """max_size=True was one byte and older_than=-5 every entry: both removed everything."""
    from runtime_cache import maintenance
    from runtime_cache.errors import InvalidValueError

    cache = rc.Cache(MemoryBackend())
    cache.put(key(0), b"x" * 100)
    with pytest.raises(InvalidValueError):
        maintenance.prune(cache, **limits)
    assert cache.get(key(0)) == b"x" * 100


def test_last_error_says_why_each_counted_error_happened(tmp_path: Path) -> None:
    from runtime_cache.backends.directory import DirectoryBackend

    cache = rc.Cache(DirectoryBackend(tmp_path, max_size="5KB"))
    assert cache.last_error is None
    cache.put(key(0), bytes(10_000))  # refused for its size: an error, with its reason
    assert cache.stats().errors == 1
    assert str(cache.last_error).startswith("set: EntryTooLargeError: ")
    cache.reset_stats()
    assert cache.last_error is None


def test_prune_takes_a_size_and_an_age_as_text() -> None:
    from runtime_cache import maintenance

    cache = rc.Cache(MemoryBackend())
    cache.put(key(0), b"x" * 100)
    assert maintenance.prune(cache, max_size="1MB", older_than="30d").removed == 0
    assert maintenance.prune(cache, max_size=2e9, older_than=86400).removed == 0  # computed
    assert maintenance.prune(cache, max_size="0B").removed == 1


class _Stuck(MemoryBackend):
    """A store where some keys cannot be deleted (an immutable file), and says so."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck: set[str] = set()

    def removable(self, key: str) -> bool:
        return key not in self.stuck

    def delete(self, key: str) -> bool:
        if key in self.stuck:
            raise BackendError(f"{key} cannot be removed")
        return super().delete(key)


@pytest.mark.parametrize("where", [0, 2, 4])
def test_prune_plans_around_entries_that_cannot_go(where: int) -> None:
    """The fourth review of prune: --max-size 0B removed nothing; an entry that cannot go
    and fills the cap exactly stopped removal (the cap was reachable); and one that cannot
    go, larger than the cap, met last (recently used), still let prune empty the rest."""
    from runtime_cache import maintenance

    backend = _Stuck()
    cache = rc.Cache(backend, strict=True)
    for i in range(5):
        cache.put(key(i), b"x" * 100)
    size = next(iter(backend.scan())).size
    assert maintenance.prune(cache, max_size=0).removed == 5  # nothing is stuck: all go

    def refill() -> None:
        for i in range(5):
            cache.put(key(i), b"x" * 100)
            time.sleep(0.002)  # key(0) least recently used, key(4) most
        backend.stuck = {str(key(where))}

    refill()
    report = maintenance.prune(cache, max_size=size - 1)  # it alone is over the cap
    assert report.removed == 0 and len(list(backend.keys())) == 5, report
    assert report.kept_the_rest and report.over_cap == 5 * size - (size - 1)
    backend.stuck = set()
    maintenance.prune(cache, max_size=0)
    refill()
    report = maintenance.prune(cache, max_size=size)  # it alone fills the cap: reachable
    assert report.removed == 4 and list(backend.keys()) == [str(key(where))], report
    assert report.remaining_bytes == size and report.stuck == 1 and not report.over_cap
    assert not report.failed  # known before: never tried


class _Unaware(_Stuck):
    """A store that cannot tell which keys it cannot delete (a Redis ACL)."""

    def removable(self, key: str) -> bool:
        return True


def test_prune_weighs_every_tier_and_counts_what_stays() -> None:
    """The operator review of prune: a tier that cannot delete an entry was outvoted by
    one that can (memory:// in front of dir://), so prune emptied the rest again; a tier
    that kept an entry its store said was removed, and an entry found stuck only when
    tried, were missing from the report; an unreadable entry was left out silently."""
    from runtime_cache import maintenance
    from runtime_cache.backends.tiered import TieredBackend

    for back, tiered in ((_Stuck(), True), (_Unaware(), True), (_Unaware(), False)):
        cache = rc.Cache(TieredBackend([MemoryBackend(), back]) if tiered else back, strict=True)
        for i in range(5):
            cache.put(key(i), b"x" * 100)
            time.sleep(0.002)
        size = next(iter(back.scan())).size
        back.stuck = {str(key(4))}  # the most recently used
        report = maintenance.prune(cache, max_size=size - 1)
        if isinstance(back, _Unaware):  # found only when tried, after the others went
            assert report.removed == 4 and report.stuck == 1 and report.failed, report
        else:  # known before: nothing removed, since the cap cannot be met
            assert report.removed == 0 and report.kept_the_rest, report
        assert report.over_cap == report.remaining_bytes - (size - 1) > 0
        assert str(key(4)) in set(back.keys())
    # Expired, in a tier that swallows its failure (the other tier had nothing to remove).
    back = _Stuck()
    cache = rc.Cache(TieredBackend([MemoryBackend(), back]), strict=True)
    for i in range(3):
        back.set(str(key(i)), cache._encode(key(i), b"x" * 100, 0.0, None))
    back.stuck = {str(key(2))}
    report = maintenance.prune(cache, older_than=0, now=time.time() + 1)
    assert report.removed == 2 and [k for k, _ in report.failed] == [str(key(2))], report

    class Rewritten(MemoryBackend):  # a writer puts the key again right after prune's delete
        def delete(self, key_: str) -> bool:
            gone = super().delete(key_)
            if key_ == str(key(0)):
                time.sleep(0.002)
                self.set(key_, cache._encode(key(0), b"y" * 100, 0.0, None))
            return gone

    cache = rc.Cache(Rewritten(), strict=True)
    for i in range(3):
        cache.put(key(i), b"x" * 100)
    report = maintenance.prune(cache, max_size=0)
    assert report.removed == 3 and not report.stuck and not report.failed, report
    assert report.remaining == 1 and report.over_cap == report.remaining_bytes

    backend = MemoryBackend()
    cache = rc.Cache(backend, strict=True)
    cache.put(key(0), b"x" * 100)
    backend.set(str(key(1)), b"not an entry")
    report = maintenance.prune(cache, max_size=0)  # told, and weighed as any other
    assert [k for k, _ in report.corrupt] == [str(key(1))] and report.removed == 2
    assert report.remaining == 0 and not list(backend.keys())


def _iter_keys(n: int) -> Iterator[rc.CacheKey]:
    return (key(i) for i in range(n))


def test_hits_of_values_read_ahead_are_counted_when_used() -> None:
    """get_many_views(defer_hits=...) counts no hit; count_hits() counts those used."""
    cache = rc.Cache(MemoryBackend())
    keys = [rc.make_key(module_id="m", runtime="r", purpose="p", i=i) for i in range(3)]
    for i, k in enumerate(keys):
        cache.put(k, bytes([i]) * 100, build_seconds=2.0)
    tally: dict[str, tuple[int, float]] = {}
    missing = rc.make_key(module_id="m", runtime="r", purpose="p", i=9)
    views = cache.get_many_views([*keys, missing], count_misses=False, defer_hits=tally)
    assert sorted(views) == sorted(tally) == sorted(map(str, keys))
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.bytes_read, stats.seconds_saved) == (0, 0, 0, 0.0)
    cache.count_hits([tally[str(keys[0])], tally[str(keys[2])]])
    stats = cache.stats()
    assert (stats.hits, stats.seconds_saved) == (2, 4.0)
    assert stats.bytes_read == tally[str(keys[0])][0] + tally[str(keys[2])][0] > 200


def test_get_many_and_put_many() -> None:
    cache = rc.Cache(MemoryBackend())
    assert cache.put_many({k: b"v" for k in _iter_keys(10)})
    found = cache.get_many([*_iter_keys(12)])
    assert len(found) == 10 and cache.stats().misses == 2


def test_prune_weighs_unreadable_entries_of_unknown_age_first_for_size() -> None:
    """A store that keeps no last use (Redis): an entry prune cannot read goes first for
    size, and is never removed for its age."""
    from runtime_cache import maintenance

    class Untimed(MemoryBackend):
        def scan(self, prefix: str = "") -> Iterator[StoredItem]:
            return (StoredItem(item.key, item.size) for item in super().scan(prefix))

    backend = Untimed()
    cache = rc.Cache(backend)
    backend.set(str(key(9)), b"junk" * 50)
    report = maintenance.prune(cache, older_than=0, now=time.time() + 1)
    assert report.removed == 0 and backend.get(str(key(9))) is not None
    assert [k for k, _ in report.corrupt] == [str(key(9))] and not report.skipped
    for i in range(3):
        cache.put(key(i), b"x" * 100)
    size = next(item.size for item in backend.scan() if item.key == str(key(0)))
    report = maintenance.prune(cache, max_size=3 * size)
    assert report.removed == 1 and report.freed == 200 and backend.get(str(key(9))) is None
    assert all(cache.get(key(i)) == b"x" * 100 for i in range(3))
    assert report.remaining_bytes == 3 * size


def test_prune_stops_when_a_corrupt_entry_cannot_go() -> None:
    """A corrupt entry whose removal fails counts as one that cannot go: where it alone is
    over the cap, no good entry is removed in its place."""
    from runtime_cache import maintenance

    class Immutable(MemoryBackend):
        def delete(self, key_: str) -> bool:
            if key_ == str(key(9)):
                raise BackendError("an immutable file")
            return super().delete(key_)

    backend = Immutable()
    cache = rc.Cache(backend)
    for i in range(3):
        cache.put(key(i), b"x" * 100)
    backend.set(str(key(9)), b"junk" * 500)
    report = maintenance.prune(cache, max_size=1000)
    assert report.removed == 0 and report.failed and report.stuck == 1
    assert all(cache.get(key(i)) == b"x" * 100 for i in range(3))
    assert [k for k, _ in report.corrupt] == [str(key(9))]


def test_prune_never_removes_good_entries_for_junk_planted_again() -> None:
    """The second review of prune: junk swapped for other junk while prune removed it was
    taken for an entry written again, so every good entry went in its place."""
    from runtime_cache import maintenance

    planted = str(key(99))

    class Replanted(MemoryBackend):
        def delete(self, key_: str) -> bool:
            gone = super().delete(key_)
            if key_ == planted:
                self.set(key_, b"junk" * 5000)  # another writer, at once
            return gone

    backend = Replanted()
    cache = rc.Cache(backend)
    for i in range(5):
        cache.put(key(i), b"x" * 100)
    backend.set(planted, b"junk" * 5000)
    size = next(item.size for item in backend.scan() if item.key == str(key(0)))
    report = maintenance.prune(cache, max_size=10 * size)
    assert all(cache.get(key(i)) == b"x" * 100 for i in range(5))
    assert [k for k, _ in report.failed] == [planted] and report.over_cap > 0


def test_prune_counts_what_a_tier_it_could_not_list_kept() -> None:
    """The second review of prune: with the slow tier of a store of tiers down mid-prune,
    the entries it kept were neither listed again nor counted, so the report said they
    were removed and the cap met. Then (helper-77) they were counted as kept for a reason
    that was untrue ("an immutable file"), and as not removed, though gone from the tiers
    that could be reached. Now: removed from those, and named as perhaps living on in the
    tier that was down."""
    from runtime_cache import maintenance
    from runtime_cache.backends.tiered import TieredBackend
    from runtime_cache.errors import BackendUnavailableError

    class Pausable(MemoryBackend):
        down = False

        def _fail_if_down(self) -> None:
            if self.down:
                raise BackendUnavailableError("paused")

        def delete(self, key_: str) -> bool:
            self._fail_if_down()
            return super().delete(key_)

        def scan(self, prefix: str = "") -> Iterator[StoredItem]:
            self._fail_if_down()
            return super().scan(prefix)

    slow = Pausable()
    cache = rc.Cache(TieredBackend([MemoryBackend(), slow]), strict=True)
    for i in range(6):
        cache.put(key(i), b"x" * 100)
        time.sleep(0.002)
    size = next(iter(slow.scan())).size

    def pause(done: int, _total: int) -> None:
        slow.down = done >= 2

    report = maintenance.prune(cache, max_size=3 * size, on_progress=pause)
    slow.down = False
    assert len(list(slow.keys())) == 5 and report.removed == 3
    assert report.remaining == 3 and report.stuck == len(report.failed) == 0
    assert len(report.elsewhere) == 2 and report.over_cap == 0
    assert all("MemoryBackend" in tiers for _, tiers in report.elsewhere)


def test_prune_names_a_tier_that_refused_a_removal_as_not_removed() -> None:
    """The review of the fix (helper-78): any tier's failure made the delete a partial one,
    so an entry an immutable file kept in a reachable tier was reported "removed" (and
    "may live on" in that tier) while it stayed, and prune stopped short of the cap. Only a
    tier that is down makes a partial delete; a refusal is a failure, kept and counted."""
    from runtime_cache import maintenance
    from runtime_cache.backends.tiered import TieredBackend
    from runtime_cache.errors import BackendError

    class Stubborn(MemoryBackend):
        def delete(self, key_: str) -> bool:
            raise BackendError("Operation not permitted")

    cache = rc.Cache(TieredBackend([MemoryBackend(), Stubborn()]), strict=True)
    for i in range(3):
        cache.put(key(i), b"x" * 100)
    report = maintenance.prune(cache, older_than=0.0, now=time.time() + 10)
    assert report.elsewhere == [] and report.removed == 0 and len(report.failed) == 3
    assert "not permitted" in report.failed[0][1]


def test_a_hit_taken_back_after_a_reset_leaves_no_counter_below_zero() -> None:
    """The review of took_back: a hit counted before reset_stats() and taken back after it
    left hits at -1 and seconds_saved at -5.0."""
    cache = rc.Cache(rc.open_backend("memory://"))
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    cache.put(key, b"record", build_seconds=5.0)
    assert cache.get(key) == b"record"
    cache.reset_stats()
    cache.took_back(key, b"record")
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.corrupt, stats.seconds_saved) == (0, 1, 1, 0.0)


def test_a_muted_block_inside_another_keeps_the_outer_ones_names() -> None:
    """The second re-attack: the inner block's end unmuted the outer one's names."""
    from runtime_cache.stats import Counters

    counters = Counters()
    with counters.muted("misses"):
        with counters.muted("rejected"):
            counters.add(misses=1, rejected=1, errors=1)
        counters.add(misses=1, rejected=1)
    counters.add(misses=1)
    got = counters.snapshot()
    assert (got.misses, got.rejected, got.errors) == (1, 1, 1), got
