"""The front's own entries (issue 16, item 5): written from each key's remembered bytes,
byte for byte what the codec writes, and checked by a quick form that accepts only what
the full check accepts, with the same value and build seconds."""

from __future__ import annotations

import os
import random
from pathlib import Path

import msgpack
import pytest
from fuzz.targets import mutate, rechecksum
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.check import check_entry
from runtime_cache.entry_meta import pack_meta
from runtime_cache.errors import CorruptEntryError
from runtime_cache.own_entries import OwnEntries

LIMITS = codec.DEFAULT_LIMITS
NAMES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
PLAIN = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), NAMES, st.binary()),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(NAMES, c, max_size=3)),
    max_leaves=12,
)


def _key(i: object = 0, **more: object) -> rc.CacheKey:
    return rc.make_key(module_id="m@1", runtime="t", purpose="own", device={"d": "x"}, i=i, **more)


def _pieces(blob: bytes, split: bool) -> tuple[bytes, ...]:
    if not split:
        return (blob,)
    span = codec.entry_span(blob)
    assert span is not None
    start, end = span
    return blob[:start], blob[start:end], blob[end:]


def _full(key: rc.CacheKey, pieces: tuple[bytes, ...], secret: object = None) -> object:
    try:
        checked = check_entry(str(key), pieces, secret=secret, key=key)  # type: ignore[arg-type]
    except CorruptEntryError:
        return None
    return bytes(checked.value), checked.meta["b"]


def _quick(
    own: OwnEntries, key: rc.CacheKey, pieces: tuple[bytes, ...], secret: object = None
) -> object:
    found = own.match(key, str(key), pieces, secret, "p 1", LIMITS)  # type: ignore[arg-type]
    if found is None:
        return None
    value, built, size = found
    assert size == sum(map(len, pieces))
    return bytes(value), built


@settings(max_examples=200)
@given(
    extra_parts=st.dictionaries(st.sampled_from(["a", "b", "options"]), PLAIN, max_size=3),
    value=st.binary(max_size=300),
    created=st.floats(0, 2**33),
    built=st.floats(0, 1e8),
    producer=NAMES,
    extra=st.none() | st.dictionaries(NAMES, PLAIN, max_size=2),
    signed=st.booleans(),
)
def test_an_own_entry_is_what_the_codec_writes(
    extra_parts: dict[str, object],
    value: bytes,
    created: float,
    built: float,
    producer: str,
    extra: dict[str, object] | None,
    signed: bool,
) -> None:
    key = _key(**extra_parts)
    secret = (b"k",) if signed else None
    made = OwnEntries().encode(key, value, created, built, extra, producer, secret)
    expected = codec.encode_entry(
        str(key), key.parts, value, created_at=created, build_seconds=built, producer=producer,
        secret=secret, extra=extra,
    )  # fmt: skip
    assert made == expected
    meta = {"k": str(key), "p": key.parts, "c": created, "b": built, "v": producer, "n": len(value)}
    if extra:
        meta["x"] = extra
    packed = pack_meta(str(key), key.packed_parts, created, built, producer, len(value), extra)
    assert packed == msgpack.packb(meta, use_bin_type=True)


@settings(max_examples=300)
@given(
    rng=st.randoms(use_true_random=False),
    fix_sums=st.booleans(),
    split=st.booleans(),
    size=st.sampled_from([0, 5, 300]),
)
def test_the_quick_check_accepts_only_what_the_full_check_accepts(
    rng: random.Random, fix_sums: bool, split: bool, size: int
) -> None:
    own = OwnEntries()
    key = _key(rng.randrange(3))
    value = bytes(rng.randrange(256) for _ in range(size))
    good = own.encode(key, value, 1.5, 2.5, None, "p 1", None)
    assert _quick(own, key, _pieces(good, split)) == (value, 2.5) == _full(key, (good,))
    bad = mutate(good, rng)
    if fix_sums:
        bad = rechecksum(bad)
    try:
        pieces = _pieces(bad, split)
    except AssertionError:  # not the start of an entry: no span to cut at
        pieces = (bad,)
    quick = _quick(own, key, pieces)
    if quick is not None:
        assert quick == _full(key, (bad,)) == _full(key, pieces)
    # Another key's entry, or another key asked for: never served for it.
    other = _key("other")
    assert _quick(own, other, pieces) is None


@pytest.mark.parametrize("split", [False, True])
def test_the_quick_check_refuses_what_it_does_not_know_and_the_full_one_judges(
    split: bool,
) -> None:
    own = OwnEntries()
    key = _key()
    base = {"created_at": 1.0, "build_seconds": 0.5}
    mine = codec.encode_entry(str(key), key.parts, b"v", producer="p 1", **base)
    assert _quick(own, key, _pieces(mine, split)) == (b"v", 0.5)
    cases = {
        "another producer": codec.encode_entry(str(key), key.parts, b"v", producer="q", **base),
        "extras": codec.encode_entry(
            str(key), key.parts, b"v", producer="p 1", extra={"f": 1}, **base
        ),
        "parts in another order": codec.encode_entry(
            str(key), dict(reversed(list(key.parts.items()))), b"v", producer="p 1", **base
        ),
    }
    for name, blob in cases.items():
        assert _quick(own, key, _pieces(blob, split)) is None, name
        assert _full(key, (blob,)) == (b"v", 0.5), name  # the full check still serves it
    # Times out of range, with sums fixed: the full check refuses them too.
    for created, built in ((-1.0, 0.0), (float("nan"), 0.0), (1.0, 1e9), (2.0**34, 0.0)):
        times = codec.encode_entry(str(key), key.parts, b"v", producer="p 1", created_at=0.0)
        at = times.index(b"\xa1c\xcb") + 3
        raw = bytearray(times)
        raw[at : at + 19] = msgpack.packb(created)[1:] + b"\xa1b\xcb" + msgpack.packb(built)[1:]
        forged = rechecksum(bytes(raw))
        assert _quick(own, key, _pieces(forged, split)) is None
        assert _full(key, (forged,)) is None


def test_signatures_are_checked_on_the_quick_path() -> None:
    own = OwnEntries()
    key = _key()
    signed = own.encode(key, b"v" * 100, 1.0, 0.0, None, "p 1", (b"k",))
    unsigned = own.encode(key, b"v" * 100, 1.0, 0.0, None, "p 1", None)
    for split in (False, True):
        assert _quick(own, key, _pieces(signed, split), (b"k",)) == (b"v" * 100, 0.0)
        assert _quick(own, key, _pieces(signed, split), (b"x", b"k")) == (b"v" * 100, 0.0)
        assert _quick(own, key, _pieces(signed, split), (b"other",)) is None
        assert _quick(own, key, _pieces(unsigned, split), (b"k",)) is None
        assert _quick(own, key, _pieces(signed, split)) == (b"v" * 100, 0.0)  # no secret: no check


@pytest.mark.parametrize("depth", range(28, 32))
def test_the_nesting_limit_holds_on_the_quick_path(depth: int) -> None:
    nested: object = "x"
    for _ in range(depth):
        nested = {"n": nested}
    key = _key(nested=nested)
    for limits in (
        LIMITS,
        *(codec.Limits(max_depth=depth + d) for d in (-1, 0, 1)),
        codec.Limits(max_depth=3),
    ):
        own = OwnEntries()
        blob = own.encode(key, b"v", 1.0, 0.0, None, "p 1", None)
        found = own.match(key, str(key), (blob,), None, "p 1", limits)
        try:
            full = check_entry(str(key), blob, limits=limits, key=key)
        except CorruptEntryError:
            assert found is None
        else:
            assert found is not None and bytes(found[0]) == bytes(full.value)


def test_new_limits_or_producer_are_noticed(tmp_path: Path) -> None:
    cache = rc.Cache(DirectoryBackend(tmp_path, max_size=None))
    key = _key(deep={"a": {"b": {"c": 1}}})
    assert cache.put(key, b"v") and cache.get(key) == b"v"
    cache.producer = "another 2"
    assert cache.get(key) == b"v"  # the full check: the entry is as good as it was
    cache.limits = codec.Limits(max_depth=2)
    assert cache.get(key) is None  # too deep now: refused, as the full check refuses it
    assert cache.stats().corrupt == 1


@pytest.mark.parametrize("backend", ["memory", "dir"])
@pytest.mark.parametrize("size", [0, 1000, 40_000, 200_000])
def test_a_front_hit_counts_and_returns_bytes(tmp_path: Path, backend: str, size: int) -> None:
    store = MemoryBackend() if backend == "memory" else DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(store, secret="s3cret" if size % 2 else None)
    key, value = _key(size), os.urandom(size)
    assert cache.put(key, value, 1.25)
    got = cache.get(key)
    assert type(got) is bytes and got == value
    assert cache.get(str(key)) == value  # a str key: the full check
    stats = cache.stats()
    stored = store.get(str(key))
    assert stored is not None
    assert (stats.hits, stats.bytes_read, stats.seconds_saved) == (2, 2 * len(stored), 2.5)


@settings(max_examples=300)
@given(
    rng=st.randoms(use_true_random=False),
    split=st.booleans(),
    signed=st.booleans(),
    fix_sums=st.booleans(),
    size=st.sampled_from([0, 7, 300]),
)
def test_a_remembered_header_checks_the_value_and_signature_still(
    rng: random.Random, split: bool, signed: bool, fix_sums: bool, size: int
) -> None:
    # A header read once is remembered per key: the same bytes again skip the header's
    # checks, never the value's checksum, length or signature, nor the key's binding.
    own = OwnEntries()
    secret = (b"k",) if signed else None
    key = _key(rng.randrange(3))
    value = bytes(rng.randrange(256) for _ in range(size))
    good = own.encode(key, value, 1.5, 2.5, None, "p 1", secret)
    fresh = OwnEntries()
    assert _quick(fresh, key, _pieces(good, split), secret) == (value, 2.5)  # now remembered
    assert _quick(own, key, _pieces(good, split), secret) == (value, 2.5)  # remembered at put
    bad = mutate(good, rng)
    if fix_sums:
        bad = rechecksum(bad)
    pieces = _pieces(bad, split) if codec.entry_span(bad) is not None else (bad,)
    for reader in (own, fresh, OwnEntries()):
        quick = _quick(reader, key, pieces, secret)
        if quick is not None:
            assert quick == _full(key, (bad,), secret) == _full(key, pieces, secret)
        assert _quick(reader, _key("other"), pieces, secret) is None


def _flip(blob: bytes, at: int) -> bytes:
    return blob[:at] + bytes([blob[at] ^ 1]) + blob[at + 1 :]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("signed", [False, True])
def test_damage_after_a_remembered_header_is_refused(split: bool, signed: bool) -> None:
    own = OwnEntries()
    secret = (b"k",) if signed else None
    key = _key()
    value = os.urandom(500)
    good = own.encode(key, value, 1.0, 0.5, None, "p 1", secret)
    assert _quick(own, key, _pieces(good, split), secret) == (value, 0.5)
    start = (codec.entry_span(good) or (0, 0))[0]
    cases = {
        "a flipped bit in the value": _flip(good, start),
        "the last byte cut": good[:-1],
        "a byte more": good + b"\x00",
        "a flipped bit in the times": _flip(good, start - 30),  # the creation time's first byte
    }
    if signed:
        cases["a flipped bit in the signature"] = _flip(good, len(good) - 1)
        unsigned = own.encode(key, value, 1.0, 0.5, None, "p 1", None)
        cases["the same entry unsigned"] = unsigned
    for name, bad in cases.items():
        pieces = _pieces(bad, split) if len(bad) == len(good) else (bad,)
        assert _quick(own, key, pieces, secret) is None, name
        assert _full(key, (bad,), secret) is None, name
    # Another key's entry with the same header shape: never served for this key.
    other = _key("other")
    transplanted = OwnEntries().encode(other, value, 1.0, 0.5, None, "p 1", secret)
    assert _quick(own, key, _pieces(transplanted, split), secret) is None
    assert _quick(own, key, _pieces(good, split), secret) == (value, 0.5)  # still good


def test_a_new_value_length_for_a_key_is_checked_afresh() -> None:
    own = OwnEntries()
    key = _key()
    for size in (10, 300, 70_000, 10):
        value = os.urandom(size)
        blob = own.encode(key, value, 1.0, 0.0, None, "p 1", None)
        reader = OwnEntries()
        for split in (False, True):
            assert _quick(own, key, _pieces(blob, split)) == (value, 0.0)
            assert _quick(reader, key, _pieces(blob, split)) == (value, 0.0)


def test_pieces_of_other_types_go_to_the_full_check() -> None:
    own = OwnEntries()
    key = _key()
    blob = own.encode(key, b"v" * 100, 1.0, 0.0, None, "p 1", None)
    head, value, sig = _pieces(blob, True)
    for pieces in (
        (memoryview(blob),),
        (bytearray(blob),),
        (head, bytearray(value), sig),
        (head, memoryview(value), sig),
        (head, value),
        (head, value, sig, b""),
    ):
        assert own.match(key, str(key), pieces, None, "p 1", LIMITS) is None  # type: ignore[arg-type]
    assert _quick(own, key, (head, value, sig)) == (b"v" * 100, 0.0)


@settings(max_examples=200)
@given(
    extra_parts=st.dictionaries(st.sampled_from(["a", "b", "options"]), PLAIN, max_size=3),
    size=st.sampled_from([0, 5, 300, 70_000]),
    created=st.floats(0, 2**33),
    built=st.floats(0, 1e8),
    signed=st.booleans(),
    limits=st.sampled_from(
        [
            LIMITS,
            codec.Limits(max_depth=2),
            codec.Limits(max_meta_size=150),
            codec.Limits(max_value_size=100),
        ]
    ),
)
def test_a_put_remembers_what_reading_its_bytes_would(
    extra_parts: dict[str, object],
    size: int,
    created: float,
    built: float,
    signed: bool,
    limits: codec.Limits,
) -> None:
    # A put remembers its entry's header without reading it back: exactly what the quick
    # check would remember after reading those bytes, and nothing where it would refuse them.
    key = _key(**extra_parts)
    secret = (b"k",) if signed else None
    writer = OwnEntries()
    writer.match(key, str(key), (b"",), None, "p 1", limits)  # (nothing:) sets its limits
    blob = writer.encode(key, b"v" * size, created, built, None, "p 1", secret)
    reader = OwnEntries()
    reader.match(key, str(key), (b"",), None, "p 1", limits)
    start = (codec.entry_span(blob) or (0, 0))[0]
    assert writer._seen.get(str(key)) == reader._check_head(key, str(key), blob[:start], limits)
    for split in (False, True):
        found = writer.match(key, str(key), _pieces(blob, split), secret, "p 1", limits)
        if found is not None:  # then the full check under those limits agrees
            checked = check_entry(str(key), blob, secret=secret, limits=limits, key=key)
            assert (bytes(found[0]), found[1]) == (bytes(checked.value), checked.meta["b"])
