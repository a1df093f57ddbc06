"""The front's read path (issue 16, item 5): large values read in pieces without a copy,
the key bound by one byte comparison, the nesting walk skipped only where it cannot fail.
Every check stays: these tests damage, forge and cut entries on the fast paths."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.api import framing_span
from runtime_cache.backends.bounded_reads import PARTS_FROM, Junk, read_parts
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.check import check_entry
from runtime_cache.errors import CorruptEntryError, KeyMismatchError
from runtime_cache.stats import Counters

BIG = PARTS_FROM + 12_345


def _key(i: int = 0) -> rc.CacheKey:
    return rc.make_key(module_id="m@1", runtime="t", purpose="front", device={"d": [1, 2]}, i=i)


def _file(backend: DirectoryBackend, key: rc.CacheKey) -> Path:
    return backend.root / str(key).rsplit("/", 1)[0] / str(key)[-32:][:2] / f"{str(key)[-32:]}.rce"


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_a_large_value_is_read_in_pieces_and_served_as_read(
    tmp_path: Path, secret: str | None
) -> None:
    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend, secret=secret)
    value = os.urandom(BIG)
    assert cache.put(_key(), value)
    pieces = backend.get_parts(str(_key()), codec.entry_span)
    assert pieces is not None and len(pieces) == 3
    _, middle, tail = pieces
    assert middle == value and len(tail) == (32 if secret else 0)
    assert b"".join(pieces) == backend.get(str(_key()))
    assert cache.get(_key()) == value
    entry = cache.get_entry(_key())
    assert entry is not None and entry.value == value and entry.signed == bool(secret)
    stats = cache.stats()
    assert stats.hits == 2 and stats.bytes_read == 2 * len(b"".join(pieces))


def test_a_small_value_is_read_whole(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path, max_size=None)
    rc.Cache(backend).put(_key(), b"small")
    pieces = backend.get_parts(str(_key()), codec.entry_span)
    assert pieces is not None and len(pieces) == 1


@pytest.mark.parametrize("where", ["value", "metadata", "signature"])
def test_damage_read_in_pieces_is_caught(tmp_path: Path, where: str) -> None:
    backend = DirectoryBackend(tmp_path, max_size=None)
    rc.Cache(backend, secret="s3cret").put(_key(), os.urandom(BIG))
    cache = rc.Cache(backend, secret="s3cret")  # reads it whole (see test_front_rereads)
    path = _file(backend, _key())
    data = bytearray(path.read_bytes())
    at = {"value": len(data) // 2, "metadata": codec.HEADER_SIZE + 5, "signature": len(data) - 3}
    data[at[where]] ^= 0x40
    path.write_bytes(bytes(data))
    assert cache.get(_key()) is None
    stats = cache.stats()
    if where == "signature":  # a forgery is rejected and kept
        assert stats.rejected == 1 and path.exists()
    else:  # damage is corrupt, and exactly those bytes are removed
        assert stats.corrupt == 1 and not path.exists()


@pytest.mark.parametrize("secret", [None, b"s3cret"])
def test_a_file_that_changed_size_is_read_whole(tmp_path: Path, secret: bytes | None) -> None:
    path = tmp_path / "f"
    data = codec.encode_entry("t/x/" + "0" * 32, {}, os.urandom(BIG), created_at=1.0, secret=secret)
    path.write_bytes(data + b"grown")
    fd = os.open(path, os.O_RDONLY)
    try:
        # fstat said len(data): the file grew since, so the pieces are not trusted.
        assert read_parts(fd, len(data), 1 << 30, codec.entry_span) == (data + b"grown",)
        # A span out of range, backwards, or none at all: the whole file.
        for span in (
            lambda h: (5, 1 << 40),
            lambda h: (9000, 9001),
            lambda h: (-1, 10),
            lambda h: (100, 50),
            lambda h: None,
        ):
            assert read_parts(fd, len(data) + 5, 1 << 30, span) == (data + b"grown",)
        # The front's span frames its entries: no entry in the head, or one that ends past
        # the file or far before its end, is junk, not read on (session 37: a sparse gigabyte
        # planted in a shared folder was read whole). Another span's None asks for it all.
        for span in (lambda h: None, lambda h: (5, 1 << 40), lambda h: (9000, 9001)):
            with pytest.raises(Junk, match=r"no entry header|another size"):
                read_parts(fd, len(data) + 5, 1 << 30, framing_span(span))
        # The size fstat gave: the pieces, the value on its own (read from a fresh open).
        os.lseek(fd, 0, os.SEEK_SET)
        start, end = codec.entry_span(data) or (0, 0)
        pieces = read_parts(fd, len(data) + 5, 1 << 30, lambda h: (start, end))
        assert pieces == (data[:start], data[start:end], data[end:] + b"grown")
    finally:
        os.close(fd)


def test_a_span_needs_a_whole_header() -> None:
    blob = codec.encode_entry("t/x/" + "0" * 32, {}, b"v", created_at=1.0)
    assert codec.entry_span(blob) == (len(blob) - 1, len(blob))
    assert codec.entry_span(blob[: codec.HEADER_SIZE - 1]) is None
    assert codec.entry_span(b"RCB\x01" + blob[4:]) is None


@given(cuts=st.lists(st.integers(0, 600), min_size=2, max_size=2), signed=st.booleans())
def test_pieces_cut_anywhere_decode_as_the_whole_blob(cuts: list[int], signed: bool) -> None:
    secret = (b"k",) if signed else None
    blob = codec.encode_entry(
        str(_key()), _key().parts, bytes(range(256)) * 2, created_at=1.0, secret=secret
    )
    a, b = sorted(cuts)
    pieces = (blob[:a], blob[a:b], blob[b:])
    meta, value, was_signed = codec.decode_view(pieces, secret=secret)
    assert bytes(value) == bytes(range(256)) * 2 and was_signed == signed
    assert meta == codec.decode_view(blob, secret=secret)[0]
    damaged = bytearray(blob)
    damaged[len(blob) - 40] ^= 1
    with pytest.raises(CorruptEntryError):
        codec.decode_view((bytes(damaged[:a]), bytes(damaged[a:b]), bytes(damaged[b:])))


def test_pieces_that_are_not_bytes_are_corrupt() -> None:
    with pytest.raises(CorruptEntryError):
        codec.decode_view((b"RCE\x01", 5, b""))  # type: ignore[arg-type]


def test_the_key_is_bound_by_its_bytes_and_a_transplant_still_is_not() -> None:
    key, other = _key(1), _key(2)
    blob = codec.encode_entry(str(key), key.parts, b"v", created_at=1.0)
    head = codec.meta_head(str(key), key.packed_parts)
    assert codec.verify_entry(blob, head=head)[3]
    assert bytes(check_entry(str(key), blob, key=key).value) == b"v"
    # key 1's parts under key 2's name, checksums fixed: the bytes differ, the full check refuses.
    moved = codec.encode_entry(str(other), key.parts, b"v", created_at=1.0)
    assert not codec.verify_entry(moved, head=codec.meta_head(str(other), other.packed_parts))[3]
    with pytest.raises(KeyMismatchError):
        check_entry(str(other), moved, key=other)
    # The same parts written in another order are still the key's: the slow check says so.
    shuffled = dict(reversed(list(key.parts.items())))
    reordered = codec.encode_entry(str(key), shuffled, b"v", created_at=1.0)
    assert not codec.verify_entry(reordered, head=head)[3]
    assert bytes(check_entry(str(key), reordered, key=key).value) == b"v"


@pytest.mark.parametrize("size", [0, 1, 31, 32, 255, 256, 1024])
def test_meta_head_is_what_msgpack_writes(size: int) -> None:
    name = "k" * size
    expected = b"\xa1k" + msgpack.packb(name, use_bin_type=True) + b"\xa1p" + b"\x80"
    assert codec.meta_head(name, b"\x80") == expected
    meta = msgpack.packb({"k": name, "p": {}, "c": 1.0}, use_bin_type=True)
    assert meta[1:].startswith(codec.meta_head(name, b"\x80"))


@pytest.mark.parametrize("depth", range(26, 36))
def test_nesting_is_limited_with_or_without_the_walk(depth: int) -> None:
    nested: object = 1
    for _ in range(depth):
        nested = [nested]
    blob = codec.encode_entry("t/x/" + "0" * 32, {}, b"v", created_at=1.0, extra={"n": nested})
    # The metadata map holds "x", which holds the list: the deepest list sits at level depth + 1.
    if depth + 1 > codec.DEFAULT_LIMITS.max_depth:
        with pytest.raises(CorruptEntryError, match="nested deeper"):
            codec.decode_view(blob)
    else:
        assert bytes(codec.decode_view(blob)[1]) == b"v"


# Bytes and floats hold bytes that look like openers: the shortcut only ever over-counts.
SCALARS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.binary(max_size=9), st.floats())


@given(extra=st.recursive(SCALARS, lambda c: st.lists(c, max_size=3), max_leaves=60))
def test_the_nesting_shortcut_agrees_with_the_walk(extra: object) -> None:
    limits = codec.Limits(max_depth=4)
    blob = codec.encode_entry("t/x/" + "0" * 32, {}, b"v", created_at=1.0, extra={"e": extra})

    def depth(value: object) -> int:
        return 1 + max(map(depth, value), default=0) if isinstance(value, list) else 0

    too_deep = 2 + depth(extra) - 1 > limits.max_depth  # meta (0), "x" map (1), then the lists
    if too_deep:
        with pytest.raises(CorruptEntryError, match="nested deeper"):
            codec.decode_view(blob, limits=limits)
    else:
        codec.decode_view(blob, limits=limits)


def test_counters_hit_is_add() -> None:
    counters = Counters()
    counters.hit(10, 1.5)
    counters.add(hits=1, bytes_read=10, seconds_saved=1.5)
    stats = counters.snapshot()
    assert (stats.hits, stats.bytes_read, stats.seconds_saved) == (2, 20, 3.0)
    # A few counters read together agree with the snapshot, queued hits included.
    counters.hit(4, 0.5)
    assert counters.values("hits", "bytes_read", "misses") == (3, 24, 0)


def test_hits_counted_from_many_threads_are_all_there() -> None:
    # Hits go to a queue without the lock, and join the counters in batches: none is lost,
    # and a snapshot or a reset sees the ones still queued.
    counters = Counters()
    counters.hit(5, 0.25)
    assert counters.snapshot().hits == 1  # below a batch: a snapshot folds it in
    counters.reset()
    assert counters.snapshot().hits == 0
    counters.hit(5, 0.25)
    counters.reset()  # a queued hit is cleared with the rest
    assert counters.snapshot().hits == 0

    def count(n: int) -> None:
        for i in range(n):
            counters.hit(i % 7, 0.5)
            if i % 97 == 0:
                counters.add(misses=1)

    threads = [threading.Thread(target=count, args=(5_000,)) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        for t in threads:
            t.start()
        seen = [counters.snapshot().hits for _ in range(50)]  # snapshots while they count
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    stats = counters.snapshot()
    per_thread = sum(i % 7 for i in range(5_000))
    assert (stats.hits, stats.bytes_read, stats.seconds_saved) == (40_000, 8 * per_thread, 20_000.0)
    assert stats.misses == 8 * len(range(0, 5_000, 97))
    assert seen == sorted(seen) and seen[-1] <= 40_000


def test_get_returns_bytes_from_every_backend() -> None:
    cache = rc.Cache(MemoryBackend())
    cache.put(_key(), b"value")
    got = cache.get(_key())
    assert type(got) is bytes and got == b"value"


def test_a_copied_entry_is_named_by_both_whole_keys() -> None:
    """The operator review: both keys were cut to 12 characters ("stored under
    'opencl/progr...' holds key 'opencl/progr...'"), which named neither."""
    key = rc.make_key(module_id="a", runtime="opencl", purpose="program-binary")
    other = rc.make_key(module_id="b", runtime="opencl", purpose="program-binary")
    blob = codec.encode_entry(str(key), key.parts, b"v", created_at=1.0)
    with pytest.raises(KeyMismatchError) as caught:
        check_entry(str(other), blob)
    assert str(key) in str(caught.value) and str(other) in str(caught.value)
    long = "x" * 5000  # a planted key is still cut, keeping its end
    long_blob = codec.encode_entry(long + "tail", {}, b"v", created_at=1.0)
    with pytest.raises(KeyMismatchError) as caught:
        check_entry(str(other), long_blob)
    assert len(str(caught.value)) < 300 and "tail" in str(caught.value)


@pytest.mark.parametrize("tiers", [False, True], ids=["dir", "memory,dir"])
def test_a_key_the_store_cannot_hold_is_a_miss_and_the_rest_of_its_batch_are_served(
    tmp_path: Path, tiers: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator review (helper-77): one key a directory cannot hold (``..``) in a
    ``get_many`` made every key of the batch a miss, and was logged as an outage of the
    store ("carrying on without the cache until it recovers")."""
    url = f"dir://{tmp_path}" if not tiers else f"memory://,dir://{tmp_path}"
    keys = [_key(i) for i in range(3)]
    rc.Cache(rc.open_backend(url)).put_many({k: b"v" * 10 for k in keys})
    reader = rc.Cache(rc.open_backend(url))
    found = reader.get_many([*keys, "opencl/../x"])
    assert sorted(found) == sorted(str(k) for k in keys)
    assert reader.get("opencl/../x") is None
    stats = reader.stats()
    assert (stats.hits, stats.misses) == (3, 2)
    assert "until it recovers" not in caplog.text
    # Refused where no tier can hold it (said once); memory:// above can: a plain miss.
    assert ("'..'" in caplog.text) is not tiers
    assert reader.get(keys[0]) == b"v" * 10


def test_a_bad_key_beside_an_unreadable_entry_loses_no_other_hit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the fix (helper-78): read a key at a time, one unreadable entry (a
    socket at its name here; another user's file in a shared folder) was taken for an
    outage, and every key after it was a miss."""
    import socket

    url = f"dir://{tmp_path}"
    keys = [_key(i) for i in range(4)]
    rc.Cache(rc.open_backend(url)).put_many({k: b"v" * 10 for k in keys})
    reader = rc.Cache(rc.open_backend(url))
    assert len(reader.get_many(keys)) == 4
    entry = next(p for p in tmp_path.rglob("*.rce"))
    entry.unlink()
    monkeypatch.chdir(entry.parent)  # (a socket's path is short: bound where it lies)
    with socket.socket(socket.AF_UNIX) as planted:
        planted.bind(entry.name)
        fresh = rc.Cache(rc.open_backend(url))
        assert len(fresh.get_many(["opencl/../x", *keys])) == 3
