"""TuningCache: one record per symbol, isolation, bundles, bad input, concurrency."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import pytest

import runtime_cache as rc
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import InvalidBundleError, InvalidRecordError
from runtime_cache.tuning import TuningCache

GPU_A = {"vendor": "V", "name": "A", "driver": "1.0"}
GPU_B = {"vendor": "V", "name": "B", "driver": "1.0"}


@pytest.fixture
def cache() -> rc.Cache:
    return rc.Cache(MemoryBackend())


def tuner(cache: rc.Cache, device: Any = GPU_A, module: str = "net@1") -> TuningCache:
    return TuningCache(module, "opencl", device, cache=cache)


def test_put_then_get_round_trips_the_record(cache: rc.Cache) -> None:
    t = tuner(cache)
    assert t.get("conv1") is None
    assert t.put("conv1", {"local_size": (8, 8), "tile": 4, "ms": 0.41})
    assert t.get("conv1") == {"local_size": [8, 8], "tile": 4, "ms": 0.41}
    assert t.symbols() == ["conv1"]


def test_records_of_another_device_are_never_returned(cache: rc.Cache) -> None:
    a, b = tuner(cache, GPU_A), tuner(cache, GPU_B)
    a.put("conv1", {"tile": 4})
    b.put("conv2", {"tile": 2})
    assert b.get("conv1") is None
    assert a.get("conv2") is None
    assert a.symbols() == ["conv1"]
    assert b.symbols() == ["conv2"]
    # A new driver version is another device.
    newer = tuner(cache, {**GPU_A, "driver": "1.1"})
    assert newer.get("conv1") is None
    assert newer.symbols() == []


def test_records_of_another_module_are_never_returned(cache: rc.Cache) -> None:
    one, two = tuner(cache, module="net@1"), tuner(cache, module="net@2")
    one.put("conv1", {"tile": 4})
    assert two.get("conv1") is None
    assert two.symbols() == []
    other_runtime = TuningCache("net@1", "clml", GPU_A, cache=cache)
    assert other_runtime.get("conv1") is None


def test_retune_replaces_and_never_duplicates(cache: rc.Cache) -> None:
    t = tuner(cache)
    for tile in (1, 2, 4, 8):
        t.put("conv1", {"tile": tile})
    assert t.get("conv1") == {"tile": 8}
    assert t.symbols() == ["conv1"]
    assert len(list(cache.entries("opencl", "tuning", "net@1"))) == 1


def test_dumps_loads_round_trip(cache: rc.Cache) -> None:
    t = tuner(cache)
    records = {f"layer{i}": {"tile": i, "local_size": [i, 1], "ms": i / 10} for i in range(1, 6)}
    for symbol, record in records.items():
        t.put(symbol, record)
    tuner(cache, GPU_B).put("layer1", {"tile": 99})
    blob = t.dumps()

    fresh = rc.Cache(MemoryBackend())
    target = tuner(fresh)
    assert target.loads(blob) == 5
    assert target.records() == records
    # Loading twice replaces; it never duplicates.
    assert target.loads(blob) == 5
    assert len(list(fresh.entries())) == 5


def test_a_signed_tuning_cache_refuses_a_bundle_not_signed_with_its_secret() -> None:
    """TuningCache.loads read the bundle without its secret: an unsigned bundle, or one
    whose HMAC is wrong, was taken (each record's own signature still checked), where
    Cache.loads refuses it as a whole."""
    signed = tuner(rc.Cache(MemoryBackend(), secret="s"))
    signed.put("conv1", {"tile": 4})
    good = signed.dumps()
    unsigned = tuner(rc.Cache(MemoryBackend())).dumps()
    forged = good[:-1] + bytes([good[-1] ^ 1])  # the bundle's HMAC, last
    target = tuner(rc.Cache(MemoryBackend(), secret="s"))
    for blob in (unsigned, forged):
        with pytest.raises(InvalidBundleError):
            target.loads(blob)
    assert target.loads(good) == 1


def test_loads_accepts_only_this_module_and_device(cache: rc.Cache) -> None:
    t = tuner(cache)
    t.put("conv1", {"tile": 4})
    blob = t.dumps()
    fresh = rc.Cache(MemoryBackend())
    assert tuner(fresh, GPU_B).loads(blob) == 0
    assert tuner(fresh, module="net@2").loads(blob) == 0
    assert list(fresh.entries()) == []


@pytest.mark.parametrize(
    "damage",
    [
        lambda b: b[:-1],
        lambda b: b[:10],
        lambda b: b"",
        lambda b: b"not a bundle at all",
        lambda b: b[:20] + bytes([b[20] ^ 0xFF]) + b[21:],
        lambda b: b + b"\x00",
    ],
)
def test_a_corrupt_blob_raises_a_typed_error(cache: rc.Cache, damage: Any) -> None:
    t = tuner(cache)
    t.put("conv1", {"tile": 4})
    t.put("conv2", {"tile": 2})
    with pytest.raises(InvalidBundleError):
        tuner(rc.Cache(MemoryBackend())).loads(damage(t.dumps()))


def test_loads_rejects_a_non_bytes_blob(cache: rc.Cache) -> None:
    with pytest.raises(InvalidBundleError):
        tuner(cache).loads("text")  # type: ignore[arg-type]


def test_concurrent_get_or_tune_tunes_once(cache: rc.Cache) -> None:
    t = tuner(cache)
    calls: list[int] = []
    start = threading.Barrier(4)
    release = threading.Event()
    results: list[dict[str, Any]] = []

    def tune() -> dict[str, Any]:
        calls.append(1)
        release.wait(5)  # hold the tune open so the other threads pile up behind it
        return {"tile": 4, "local_size": [8, 8]}

    def worker() -> None:
        start.wait()
        results.append(t.get_or_tune("conv1", tune))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # let the followers reach the in-flight tune (not a timed assertion)
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1
    assert results == [{"tile": 4, "local_size": [8, 8]}] * 4
    assert cache.stats().builds == 1


def test_get_or_tune_uses_the_stored_record(cache: rc.Cache) -> None:
    t = tuner(cache)
    first = t.get_or_tune("conv1", lambda: {"tile": 4})
    again = t.get_or_tune("conv1", lambda: pytest.fail("tuned twice"))
    assert first == again == {"tile": 4}


def test_a_failing_tune_stores_nothing(cache: rc.Cache) -> None:
    t = tuner(cache)

    def broken() -> dict[str, Any]:
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        t.get_or_tune("conv1", broken)
    assert t.symbols() == []


@pytest.mark.parametrize(
    "record",
    [
        [1, 2, 3],
        "tile=4",
        {1: "int key"},
        {"nested": {2: "int key"}},
        {"obj": object()},
        {"big": "x" * (70 * 1024)},
        {"deep": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]},
    ],
)
def test_a_bad_record_is_a_typed_error(cache: rc.Cache, record: Any) -> None:
    t = tuner(cache)
    with pytest.raises(InvalidRecordError):
        t.put("conv1", record)
    with pytest.raises(InvalidRecordError):
        t.get_or_tune("conv2", lambda: record)
    assert t.symbols() == []


@pytest.mark.parametrize("symbol", ["", "x" * 300, None, 7])
def test_a_bad_symbol_is_a_typed_error(cache: rc.Cache, symbol: Any) -> None:
    with pytest.raises(InvalidRecordError):
        tuner(cache).get(symbol)


def test_a_bad_stored_record_is_a_miss_and_is_retuned(cache: rc.Cache) -> None:
    t = tuner(cache)
    cache.put(t.key("conv1"), b"\xc1 not msgpack")
    assert t.get("conv1") is None
    assert t.key("conv1") not in cache  # deleted
    cache.put(t.key("conv1"), b"\x93\x01\x02\x03")  # a valid msgpack list, not a map
    assert t.get_or_tune("conv1", lambda: {"tile": 2}) == {"tile": 2}
    assert t.get("conv1") == {"tile": 2}


def test_a_record_the_reader_cannot_use_is_counted_as_a_miss_not_a_hit() -> None:
    """Review: a bad stored record (and one over the reader's limit) counted as a hit, with
    its writer's tuning time as time saved, though the reader tuned again."""
    cache = rc.Cache(MemoryBackend())
    t = tuner(cache)
    cache.put(t.key("conv1"), b"\x93\x01\x02\x03", build_seconds=50)  # a list, not a map
    assert t.get("conv1") is None
    got = cache.stats()
    assert (got.hits, got.misses, got.corrupt, got.seconds_saved) == (0, 1, 1, 0.0)
    small = TuningCache("net@1", "opencl", GPU_A, cache=cache, max_record_size=1024)
    assert t.put("conv2", {"table": list(range(2000))}, tune_seconds=30)
    for _ in range(3):
        assert small.get_or_tune("conv2", lambda: {"tile": 4}) == {"tile": 4}
    assert small.get("conv2") == {"tile": 4}
    got = cache.stats()
    assert (got.hits, got.misses, got.corrupt, got.seconds_saved) == (0, 5, 1, 0.0)
    assert t.get("conv2") == {"table": list(range(2000))}
    assert cache.stats().hits == 1 and cache.stats().seconds_saved == 30


def test_one_get_or_tune_counts_one_lookup() -> None:
    """The attack review: a cold ``get_or_tune`` counted two misses (its own read, then
    ``get_or_build``'s), and a bad record two rejections; ``get_or_build`` counts one."""
    cache = rc.Cache(MemoryBackend())
    t = tuner(cache)

    def counts() -> tuple[int, int, int, int]:
        got = cache.stats()
        cache.reset_stats()
        return got.hits, got.misses, got.corrupt, got.builds

    assert t.get_or_tune("conv1", lambda: {"tile": 4}) == {"tile": 4}
    assert counts() == (0, 1, 0, 1)
    assert t.get_or_tune("conv1", lambda: {"tile": 8}) == {"tile": 4}
    assert counts() == (1, 0, 0, 0)
    cache.put(t.key("conv2"), b"\x93\x01\x02\x03")  # a list, not a map
    cache.reset_stats()
    assert t.get_or_tune("conv2", lambda: {"tile": 2}) == {"tile": 2}
    assert counts() == (0, 1, 1, 1)
    gate = threading.Event()

    def slow() -> dict[str, int]:
        gate.wait(10)
        return {"tile": 16}

    threads = [threading.Thread(target=t.get_or_tune, args=("conv3", slow)) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # (both in: one tunes, one waits for it)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert counts() == (1, 1, 0, 1)


def test_one_get_or_tune_counts_one_rejection_and_one_miss() -> None:
    """The re-attack: a record planted unsigned in a signed cache counted two rejections
    for one ``get_or_tune`` (its read, then ``get_or_build``'s); and a strict cache whose
    store failed at the second read counted two misses."""
    from runtime_cache.backends.callback import CallbackBackend

    backend = MemoryBackend()
    t = tuner(rc.Cache(backend))  # (unsigned: what a writer without the secret stores)
    t.put("conv1", {"tile": 1})
    signed = rc.Cache(backend, secret="a-long-enough-secret-for-tests")
    assert tuner(signed).get_or_tune("conv1", lambda: {"tile": 4}) == {"tile": 4}
    got = signed.stats()
    assert (got.hits, got.misses, got.rejected, got.builds) == (0, 1, 1, 1), got
    calls = []

    def load(key: str) -> bytes | None:
        calls.append(key)
        if len(calls) > 1:
            raise OSError("the store went away")
        return None

    strict = rc.Cache(CallbackBackend(load=load, store=lambda k, v: None), strict=True)
    with pytest.raises(rc.errors.BackendError):
        tuner(strict).get_or_tune("conv1", lambda: {"tile": 4})
    assert strict.stats().misses == 1, strict.stats()


def test_a_miss_taken_back_after_a_reset_leaves_none_below_zero() -> None:
    """The re-attack: ``count_hits(..., missed_before=True)`` after ``reset_stats()`` (the
    OpenCL loader's path) left misses at -1, as a shared build's wait did."""
    cache = rc.Cache(MemoryBackend())
    cache.reset_stats()
    cache.count_hits([(10, 0.0)], missed_before=True)
    got = cache.stats()
    assert (got.hits, got.misses) == (1, 0), got


def test_a_bad_record_that_cannot_be_removed_is_no_hit_either() -> None:
    """The re-attack: on a read-only store the bad record stayed, ``get_or_build`` read it
    again, and that read counted a hit with its tuning time saved."""

    from runtime_cache.errors import ReadOnlyBackendError

    class ReadOnly(MemoryBackend):
        sealed = False

        def set(self, key: str, value: bytes) -> None:
            if self.sealed:
                raise ReadOnlyBackendError("read-only")
            super().set(key, value)

        def delete(self, key: str) -> bool:
            raise ReadOnlyBackendError("read-only")

        def delete_if(self, key: str, expected: bytes) -> bool:
            raise ReadOnlyBackendError("read-only")

    backend = ReadOnly()
    cache = rc.Cache(backend)
    t = tuner(cache)
    cache.put(t.key("conv1"), b"\x93\x01\x02\x03", build_seconds=100)  # a list, not a map
    backend.sealed = True
    cache.reset_stats()
    for _ in range(3):
        assert t.get_or_tune("conv1", lambda: {"tile": 4}) == {"tile": 4}
    got = cache.stats()
    assert got.hits == 0 and got.seconds_saved == 0.0, got


def test_signed_cache_round_trip_and_foreign_secret() -> None:
    signed = rc.Cache(MemoryBackend(), secret="s3cret")
    t = tuner(signed)
    t.put("conv1", {"tile": 4})
    blob = t.dumps()
    assert tuner(rc.Cache(MemoryBackend(), secret="s3cret")).loads(blob) == 1
    # A cache with another secret refuses the bundle as a whole, as Cache.loads does.
    with pytest.raises(InvalidBundleError, match="signature"):
        tuner(rc.Cache(MemoryBackend(), secret="other")).loads(blob)


def test_unsigned_records_are_not_written_to_a_shared_store() -> None:
    t = tuner(rc.Cache(MemoryBackend()))
    t.put("conv1", {"tile": 4})
    blob = t.dumps()
    shared = MemoryBackend()
    shared.shared = True
    shared.insecure = True  # a shared store opened with insecure=1
    target = tuner(rc.Cache(shared))
    assert target.loads(blob) == 0
    assert target.symbols() == []
    # A private store still takes them.
    assert tuner(rc.Cache(MemoryBackend())).loads(blob) == 1


def test_default_cache_is_the_provider(tmp_path: Any) -> None:
    with rc.cache_provider(f"dir://{tmp_path}"):
        t = TuningCache("net@1", "opencl", GPU_A)
        t.put("conv1", {"tile": 4})
        assert TuningCache("net@1", "opencl", GPU_A).get("conv1") == {"tile": 4}
        assert t.clear() == 1
        assert t.symbols() == []


def test_disabled_cache_tunes_every_time() -> None:
    t = tuner(rc.Cache(None))
    calls: list[int] = []

    def tune() -> dict[str, Any]:
        calls.append(1)
        return {"tile": 1}

    assert t.get_or_tune("conv1", tune) == {"tile": 1}
    assert t.get_or_tune("conv1", tune) == {"tile": 1}
    assert len(calls) == 2
    assert t.put("conv1", {"tile": 1}) is False


def test_a_bad_record_never_takes_a_good_one_stored_since_with_it(tmp_path: Any) -> None:
    """The attacker review: a bad record was removed with a plain delete, so a good record
    another process stored between this one's read and its removal was lost."""
    from runtime_cache.backends.directory import DirectoryBackend

    device = {"name": "gpu0", "driver": "1.0"}
    mine = rc.Cache(DirectoryBackend(tmp_path))
    other = TuningCache("model@1", "opencl", device, cache=rc.Cache(DirectoryBackend(tmp_path)))
    victim = TuningCache("model@1", "opencl", device, cache=mine)
    mine.put(victim.key("conv1"), msgpack.packb([1, 2, 3]))  # a record that is no dict
    read = mine.get

    def get_then_another_stores(key: Any) -> bytes | None:
        data = read(key)
        other.put("conv1", {"tile": 8, "ms": 0.4})  # between the read and the removal
        return data

    mine.get = get_then_another_stores  # type: ignore[method-assign]
    assert victim.get("conv1") is None
    mine.get = read  # type: ignore[method-assign]
    assert other.get("conv1") == {"tile": 8, "ms": 0.4}
    # Without a store in between, the bad record is removed as before.
    mine.put(victim.key("conv2"), msgpack.packb([1, 2, 3]))
    assert victim.get("conv2") is None and mine.get(victim.key("conv2")) is None


def test_a_record_over_a_readers_limit_is_its_miss_and_stays_for_its_writer(
    cache: rc.Cache,
) -> None:
    """Noted in session 26's closing note: two users of one store with different
    ``max_record_size``; the smaller reader took the larger record for a bad one and removed
    it (a good entry lost), and on ``get_or_tune`` replaced it with its own."""
    writer = TuningCache("net@1", "opencl", GPU_A, cache=cache)
    reader = TuningCache("net@1", "opencl", GPU_A, cache=cache, max_record_size=1024)
    big = {"table": list(range(2000))}
    assert writer.put("conv1", big)
    assert reader.get("conv1") is None
    calls = []
    got = reader.get_or_tune("conv1", lambda: calls.append(1) or {"tile": 4})
    assert got == {"tile": 4} and calls == [1]
    assert writer.get("conv1") == big  # kept, as it was
    # Noted in session 27: the reader tuned again at each call. It keeps what it tuned.
    assert reader.get_or_tune("conv1", lambda: calls.append(2) or {"tile": 8}) == {"tile": 4}
    assert reader.get("conv1") == {"tile": 4} and calls == [1]
    assert writer.get("conv1") == big
    other = TuningCache("net@1", "opencl", GPU_A, cache=cache, max_record_size=1024)
    assert other.get("conv1") is None  # (kept in the reader, not stored)
    assert other.get_or_tune("conv1", lambda: {"tile": 8}) == {"tile": 8}
    assert reader.delete("conv1") and reader.get("conv1") is None


def test_an_empty_ext_type_is_refused_as_any_ext_type(cache: rc.Cache) -> None:
    """Attack review, session 43: ``ExtType(5, b"")`` passed ``max_ext_len=0``, was stored
    and came back as an ``ExtType``; ``ExtType(5, b"x")`` was refused."""
    tuning = TuningCache("m@1", "opencl", {"name": "dev"}, cache=cache)
    for data in (b"", b"x"):
        with pytest.raises(InvalidRecordError):
            tuning.put("s", {"a": msgpack.ExtType(5, data)})
    assert tuning.get("s") is None


def test_a_signed_cache_lists_no_symbol_of_an_unsigned_record() -> None:
    """Attack review, session 43: ``symbols()`` read the entries' heads alone, so a writer
    of a shared store without the secret added any symbol text to the list (records() and
    get() left the record out). In a cache with a secret, listed symbols read back signed;
    ``clear()`` still removes the unsigned ones."""
    from runtime_cache.codec import encode_entry
    from runtime_cache.tuning import encode_record

    backend = MemoryBackend()
    cache = rc.Cache(backend, secret="a-long-enough-secret-for-tests")
    tuning = TuningCache("resnet@1", "opencl", {"name": "Mali"}, cache=cache)
    tuning.put("conv1", {"tile": 4})
    evil = "conv1\x1b[2J\u202e" + "A" * 100
    key = tuning.key(evil)
    record = encode_record({"tile": 9})
    backend.set(str(key), encode_entry(str(key), key.parts, record, created_at=time.time()))
    hits = cache.stats().hits
    assert tuning.symbols() == ["conv1"]
    assert cache.stats().hits == hits  # (re-attack: listing counted a use of each record)
    assert tuning.records() == {"conv1": {"tile": 4}} and tuning.get(evil) is None
    assert tuning.clear() == 2 and backend.get(str(key)) is None


def test_a_signed_cache_lists_symbols_without_reading_planted_values() -> None:
    """Re-attack of session 43: ``symbols()`` read every listed entry whole to check its
    signature; a writer without the secret planted 30 values of 16 MB (457 MiB read). Heads
    that say unsigned, and files larger than a record can be, are never read."""
    from runtime_cache.codec import encode_entry

    backend = MemoryBackend()
    cache = rc.Cache(backend, secret="a-long-enough-secret-for-tests")
    tuning = TuningCache("resnet@1", "opencl", {"name": "Mali"}, cache=cache)
    tuning.put("conv1", {"tile": 4})
    planted = []
    for i in range(3):
        key = tuning.key(f"big{i}")
        backend.set(str(key), encode_entry(str(key), key.parts, bytes(1 << 20), created_at=1.0))
        planted.append(str(key))
    read: list[str] = []
    real = backend.peek_many

    def peek_many(keys: Any) -> dict[str, bytes]:
        keys = list(keys)
        read.extend(keys)
        return real(keys)

    backend.peek_many = peek_many  # type: ignore[method-assign]
    assert tuning.symbols() == ["conv1"]
    assert not set(read) & set(planted), read
    # records() too (the attack review: it read each planted value whole through get(),
    # counting a miss and a rejection for each), in a cache with a secret and without.
    real_get = backend.get_parts

    def get_parts(key: str, span: Any = None) -> Any:
        read.append(key)
        return real_get(key, span)

    backend.get_parts = get_parts  # type: ignore[method-assign]
    cache.reset_stats()
    assert tuning.records() == {"conv1": {"tile": 4}}
    assert not set(read) & set(planted), read
    got = cache.stats()
    assert (got.hits, got.misses, got.rejected, got.corrupt) == (0, 0, 0, 0)
    plain = TuningCache("resnet@1", "opencl", {"name": "Mali"}, cache=rc.Cache(backend))
    assert plain.records() == {"conv1": {"tile": 4}}
    assert not set(read) & set(planted), read
