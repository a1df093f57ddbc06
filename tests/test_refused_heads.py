"""Entries refused by their head are not read whole again (runtime_cache.refused_heads).

Carried over from the session-37 attacker review: a writer of a shared folder without the
secret planted entries with a well-formed header (the magic, lengths that add up) and a
large value. They are refused and kept, as a fleet member's entries must be, and every get
of the key read them whole again: up to the entry limit, 1 GiB by default on dir://. Now a
head that alone says "refused" (a newer format, no signature where one is required, over
this reader's limits) is read alone, and one refused once read whole (a wrong signature)
is remembered, so that the same file is not read whole again by this cache.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forged_entries import forge

import runtime_cache as rc
from runtime_cache.api import SPAN_HEAD, HeadOnly
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.backends.tiered import TieredBackend
from runtime_cache.codec import Limits
from runtime_cache.refused_heads import REMEMBERED, RefusedHeads

SIZE = 48 << 20  # a value this large, read whole, shows in the peak (a head is 4 KiB)
SMALL_PEAK = 8 << 20


def _key(name: str = "m") -> rc.CacheKey:
    return rc.make_key(module_id=name, runtime="r", purpose="p")


def _peak(call: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _path_of(folder: Path, cache: rc.Cache, key: rc.CacheKey) -> Path:
    before = set(folder.rglob("*.rce"))
    assert cache.put(key, b"good")
    (path,) = set(folder.rglob("*.rce")) - before
    return path


def _plant(path: Path, blob: bytes) -> None:
    fresh = path.with_name(path.name + ".planted")
    fresh.write_bytes(blob)
    fresh.replace(path)


def test_a_forged_signature_is_read_whole_once_then_refused_by_its_head(tmp_path: Path) -> None:
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    key = _key()
    path = _path_of(tmp_path, writer, key)
    _plant(path, forge(key, bytes(SIZE), signature=bytes(32)))  # signed, wrongly
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    found, peak = _peak(lambda: cache.get(key))
    assert found is None and cache.stats().rejected == 1 and peak > SIZE  # read whole once
    found, peak = _peak(lambda: [cache.get(key) for _ in range(3)])
    assert found == [None] * 3 and peak < SMALL_PEAK, peak
    views, peak = _peak(lambda: cache.get_many_views([key]))
    assert views == {} and peak < SMALL_PEAK, peak
    stats = cache.stats()
    assert (stats.rejected, stats.misses, stats.corrupt) == (5, 5, 0)
    assert path.stat().st_size > SIZE  # kept: a fleet member with another secret owns it
    # Another cache (another process) reads it whole once too: what is remembered is its own.
    other = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    _, peak = _peak(lambda: other.get(key))
    assert peak > SIZE
    # A store replaces it, and the new entry, whose head differs, is served.
    assert cache.put(key, b"good") and cache.get(key) == b"good"


def test_heads_that_say_refused_are_never_read_whole(tmp_path: Path) -> None:
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    unsigned, newer = _key("unsigned"), _key("newer")
    _plant(_path_of(tmp_path, writer, unsigned), forge(unsigned, bytes(SIZE)))
    blob = bytearray(forge(newer, bytes(SIZE), signature=bytes(32)))
    blob[4] = 2  # a format version newer than this reader's
    newer_path = _path_of(tmp_path, writer, newer)
    _plant(newer_path, bytes(blob))
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    found, peak = _peak(lambda: [cache.get(unsigned), cache.get(newer)])
    assert found == [None, None] and peak < SMALL_PEAK, peak
    views, peak = _peak(lambda: cache.get_many_views([unsigned, newer]))
    assert views == {} and peak < SMALL_PEAK, peak
    stats = cache.stats()
    assert (stats.rejected, stats.misses, stats.corrupt) == (2, 4, 0)  # the newer: a miss only
    assert newer_path.stat().st_size == len(blob)  # kept for the newer readers
    # A reader with a secret refuses the unsigned one by its head; one without reads it.
    plain = rc.Cache(DirectoryBackend(tmp_path, shared=True), insecure=True)
    assert plain.get(unsigned) == bytes(SIZE)


def test_an_entry_over_the_readers_limits_is_refused_by_its_head(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    key = _key()
    assert rc.Cache(backend).put(key, bytes(SIZE))
    small = rc.Cache(DirectoryBackend(tmp_path), limits=Limits(max_value_size=1 << 20))
    found, peak = _peak(lambda: small.get(key))
    assert found is None and small.stats().rejected == 1 and peak < SMALL_PEAK, peak
    small.limits = Limits()  # the limits the front checks against, changed: its span's too
    assert small.get(key) == bytes(SIZE)


def test_an_entry_moved_under_another_key_does_not_hide_the_good_one(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend)
    good, moved = _key("good"), _key("moved")
    assert cache.put(good, bytes(SIZE))
    (good_path,) = tmp_path.rglob("*.rce")
    _plant(_path_of(tmp_path, cache, moved), good_path.read_bytes())
    reader = rc.Cache(DirectoryBackend(tmp_path))
    assert reader.get(moved) is None and reader.stats().rejected == 1  # its key says "good"
    assert reader.get(good) == bytes(SIZE)  # not remembered: the good entry stays served


def test_a_head_copied_from_a_good_entry_is_refused_until_this_cache_stores_it() -> None:
    heads = RefusedHeads(signed=True, limits=Limits())
    key = _key()
    blob = forge(key, bytes(SIZE // 8), signature=bytes(32))
    head = blob[:SPAN_HEAD]
    assert heads.kept_head(head) is None and type(heads.span(head)) is tuple
    heads.remember(str(_key("another")), blob)  # rejected under a key its head does not name
    assert len(heads) == 0
    heads.remember(str(key), blob)
    assert heads.kept_head(head) == "rejected" and type(heads.span(head)) is HeadOnly
    assert heads.kept_head(blob) is None  # a whole blob is checked, never judged by its head
    heads.forget([blob])
    assert heads.kept_head(head) is None and len(heads) == 0
    for i in range(REMEMBERED + 5):
        other = _key(f"k{i}")
        heads.remember(str(other), forge(other, bytes(SPAN_HEAD), signature=bytes(32)))
    assert len(heads) == REMEMBERED  # the oldest forgotten first


def test_a_head_alone_from_a_lower_tier_is_never_copied_up(tmp_path: Path) -> None:
    shared = DirectoryBackend(tmp_path, shared=True)
    key = _key()
    _plant(_path_of(tmp_path, rc.Cache(shared, secret="s"), key), forge(key, bytes(SIZE)))
    top = MemoryBackend()
    cache = rc.Cache(TieredBackend([top, shared]), secret="s")
    found, peak = _peak(lambda: [cache.get(key), cache.get_many_views([key])])
    assert found == [None, {}] and peak < SMALL_PEAK, peak
    assert cache.stats().rejected == 2 and top.get(str(key)) is None
    assert cache.put(key, b"good") and cache.get(key) == b"good"
