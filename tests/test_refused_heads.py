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
    key, other = _key(), _key("another")
    blob = forge(key, bytes(SIZE // 8), signature=bytes(32))
    head = blob[:SPAN_HEAD]
    assert type(heads.span(head)) is tuple
    heads.remember(str(other), blob)  # rejected under another key (moved there)
    assert type(heads.span(head)) is HeadOnly and len(heads) == 1
    assert heads.kept_head((head, b"")) == "rejected"  # as dir:// hands a head back alone
    assert not heads.whole_again(str(other), (head, b""))  # refused there
    assert heads.whole_again(str(key), (head, b""))  # but read whole under its own key
    heads.remember(str(key), blob)
    assert not heads.whole_again(str(key), (head, b""))
    assert heads.kept_head((head,)) is None and heads.kept_head((blob,)) is None  # checked
    heads.forget([blob])
    assert type(heads.span(head)) is tuple and len(heads) == 0
    for i in range(REMEMBERED + 5):
        k = _key(f"k{i}")
        heads.remember(str(k), forge(k, bytes(SPAN_HEAD), signature=bytes(32)))
    assert len(heads) == REMEMBERED  # the least recently refused forgotten first


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


# ----------------------------------------------------------------- attack review, session 38
def test_a_forgery_in_the_readers_own_format_is_read_whole_once(tmp_path: Path) -> None:
    """A 48 MiB entry written by a Cache with another secret (the victim's producer, a
    wrong signature: what a fleet member with a rotated secret writes) was read whole by
    every get(CacheKey): the quick path for the cache's own entries kept its header and
    read the value again, then the whole file."""
    key = _key()
    rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="other").put(key, bytes(SIZE))
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    assert cache.get(key) is None
    found, peak = _peak(lambda: [cache.get(key), cache.get(key), key in cache])
    assert found == [None, None, False] and peak < SMALL_PEAK, peak
    assert cache.get_or_build(key, lambda: b"built") == b"built"
    assert cache.get(key) == b"built"


def test_a_refused_head_in_a_tier_does_not_hide_the_good_copy_below(tmp_path: Path) -> None:
    """The same user's cache without a secret wrote an unsigned entry into the machine's
    own tier; the shared tier below holds the signed one. Reading past a refused entry
    into the tier below must go on when the refusal came from its head alone."""
    key = _key()
    rc.Cache(DirectoryBackend(tmp_path / "own")).put(key, b"u" * (64 << 10))
    rc.Cache(DirectoryBackend(tmp_path / "shared", shared=True), secret="s").put(key, b"good")
    tiers = [DirectoryBackend(tmp_path / "own"), DirectoryBackend(tmp_path / "shared", shared=True)]
    cache = rc.Cache(TieredBackend(tiers), secret="s")
    assert cache.get_many([key]) == {str(key): b"good"}  # read past it, and copied up
    assert cache.get(key) == b"good" and key in cache
    fresh = rc.Cache(
        TieredBackend([DirectoryBackend(tmp_path / "shared", shared=True)]), secret="s"
    )
    assert fresh.get(key) == b"good"


def test_an_entry_whose_parts_name_another_key_is_not_remembered_for_it(tmp_path: Path) -> None:
    """A good entry whose key parts hold a dependency's key, copied over that dependency's
    file, was remembered (its head held the dependency's key as text) and then hid the good
    entry under its own key."""
    dep = _key("dep")
    link = rc.make_key(module_id="link", runtime="r", purpose="p", inputs=[str(dep)])
    cache = rc.Cache(DirectoryBackend(tmp_path))
    assert cache.put(link, bytes(SIZE // 8))
    (link_path,) = tmp_path.rglob("*.rce")
    _plant(_path_of(tmp_path, cache, dep), link_path.read_bytes())
    reader = rc.Cache(DirectoryBackend(tmp_path))
    assert reader.get(dep) is None and reader.stats().rejected == 1
    assert reader.get_many([link]) == {str(link): bytes(SIZE // 8)} and link in reader


def test_get_or_build_reads_a_refused_entry_by_its_head(tmp_path: Path) -> None:
    """get_or_build read the store again after its miss with a plain get (once a poll while
    another process held the build lease): a forgery refused by its head was read whole."""
    key = _key()
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    _plant(_path_of(tmp_path, writer, key), forge(key, bytes(SIZE)))  # unsigned
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    value, peak = _peak(lambda: cache.get_or_build(key, lambda: b"built"))
    assert value == b"built" and peak < SMALL_PEAK, peak


def test_a_4096_byte_file_is_checked_whole_and_junk_is_removed(tmp_path: Path) -> None:
    """A file of exactly the head's size whose header claims more is junk (corrupt), not a
    head some store cut: it was kept, and counted rejected."""
    from runtime_cache.codec import encode_entry

    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend, secret="s")
    key = _key()
    blob = encode_entry(str(key), key.parts, bytes(SIZE // 8), created_at=0.0)
    for store in (backend, MemoryBackend()):
        store.set(str(key), blob[:SPAN_HEAD])
        reader = rc.Cache(store, secret="s") if store is not backend else cache
        assert reader.get(key) is None and reader.stats().corrupt >= 1
        assert store.get(str(key)) is None  # removed


def test_forgeries_read_in_turn_are_each_read_whole_once(tmp_path: Path) -> None:
    """The heads remembered are many (4,096) and the least recently refused go first: 65
    forged keys read in turn were read whole on every round with 64 remembered in order."""
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    keys = [_key(f"f{i}") for i in range(80)]
    for k in keys:
        _plant(_path_of(tmp_path, writer, k), forge(k, bytes(64 << 10), signature=bytes(32)))
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    assert [cache.get(k) for k in keys] == [None] * 80
    _, peak = _peak(lambda: [cache.get(k) for k in keys * 2])
    assert peak < (64 << 10) * 4, peak  # each read a head, not 64 KiB
    assert cache.stats().rejected == 80 * 3


def test_a_store_that_returns_bytearray_is_served(tmp_path: Path) -> None:
    class Arrays(MemoryBackend):
        def get(self, key: str) -> bytes | None:
            value = super().get(key)
            return None if value is None else bytearray(value)  # type: ignore[return-value]

    backend = Arrays()
    cache = rc.Cache(backend, secret="s")
    forged = _key("forged")
    blob = forge(forged, bytes(SPAN_HEAD * 2), signature=bytes(32))
    backend.set(str(forged), blob)
    assert cache.get(forged) is None and cache.get(forged) is None
    key = _key()
    assert cache.put(key, b"v" * SPAN_HEAD) and cache.get(key) == b"v" * SPAN_HEAD
    assert cache.get_many([key, forged]) == {str(key): b"v" * SPAN_HEAD}


# ------------------------------------------------------------- re-attack review, session 38
def test_a_forgery_naming_another_key_is_read_whole_once(tmp_path: Path) -> None:
    """Its metadata named another key, so its head was not remembered: read whole on every
    get (48 MiB, 140 ms and 192 MiB a get). Remembered under the key it was read under."""
    key, other = _key(), _key("other")
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    _plant(_path_of(tmp_path, writer, key), forge(other, bytes(SIZE), signature=bytes(32)))
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    assert cache.get(key) is None
    found, peak = _peak(lambda: [cache.get(key), cache.get_many([key]), key in cache])
    assert found == [None, {}, False] and peak < SMALL_PEAK, peak


def test_a_wrong_signature_over_metadata_that_does_not_parse_is_remembered(
    tmp_path: Path,
) -> None:
    """The signature is checked before the metadata is decoded, and the head was only
    remembered once its metadata decoded: never, so it was read whole on every get."""
    import struct

    import xxhash

    key = _key()
    meta = b"\xc1"  # never a msgpack value; its checksum is right
    value = bytes(SIZE)
    header = struct.pack(
        "<4sBBHIQQQ",
        b"RCE\x01",
        1,
        1,
        0,
        len(meta),
        len(value),
        xxhash.xxh3_64_intdigest(meta),
        xxhash.xxh3_64_intdigest(value),
    )
    writer = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    _plant(_path_of(tmp_path, writer, key), header + meta + value + bytes(32))
    cache = rc.Cache(DirectoryBackend(tmp_path, shared=True), secret="s")
    assert cache.get(key) is None
    found, peak = _peak(lambda: [cache.get(key), cache.get(key)])
    assert found == [None, None] and peak < SMALL_PEAK, peak
    assert cache.stats().corrupt == 0


def test_a_store_whose_read_past_takes_no_span_keeps_the_whole_reads(tmp_path: Path) -> None:
    """A backend written to the earlier guide (a get_many_past without span) read past the
    head it was handed, not the forgery, so the good copy in its lower store was never
    found. Such a backend's reads are not cut: as before, the forgery is read whole."""
    from runtime_cache.api import Backend

    class TwoStores(Backend):
        shared = True

        def __init__(self, top: DirectoryBackend, low: DirectoryBackend) -> None:
            self.stores = (top, low)

        def get(self, key: str) -> bytes | None:
            return self.stores[0].get(key) or self.stores[1].get(key)

        def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
            found = self.stores[0].get_parts(key, span)
            return found if found is not None else self.stores[1].get_parts(key, span)

        def set(self, key: str, value: bytes) -> None:
            for store in self.stores:
                store.set(key, value)

        def delete(self, key: str) -> bool:
            return any([store.delete(key) for store in self.stores])

        def scan(self, prefix: str = "") -> Any:
            return self.stores[0].scan(prefix)

        def keys(self, prefix: str = "") -> Any:
            return self.stores[0].keys(prefix)

        def get_many_past(self, bad: Any) -> dict[str, bytes]:  # (no span)
            out = {}
            for key, blob in bad.items():
                for store in self.stores:
                    value = store.get(key)
                    if value is not None and value != bytes(blob):
                        out[key] = value
                        break
            return out

    key = _key()
    top, low = DirectoryBackend(tmp_path / "a", shared=True), DirectoryBackend(tmp_path / "b")
    rc.Cache(low, secret="s").put(key, b"good" * 20000)
    _plant(_path_of(tmp_path / "a", rc.Cache(top, secret="s"), key), forge(key, bytes(SIZE)))
    cache = rc.Cache(TwoStores(top, low), secret="s")
    assert [cache.get(key) for _ in range(3)] == [b"good" * 20000] * 3
    assert cache.get_many([key]) == {str(key): b"good" * 20000}


def test_a_value_in_two_pieces_the_second_empty_is_served() -> None:
    """A store that cuts a value in two at its end hands back an empty second piece for an
    entry with no signature: it was taken for a head cut alone, and never served."""

    class TwoPieces(MemoryBackend):
        def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
            value = self.get(key)
            if value is None:
                return None
            _, end = span(value[:SPAN_HEAD]) or (0, len(value))
            return value[:end], value[end:]

    cache = rc.Cache(TwoPieces())
    keys = [_key(f"v{i}") for i in range(3)]
    for size, k in zip((100, SPAN_HEAD - 40, SIZE // 16), keys, strict=True):
        assert cache.put(k, b"v" * size)
        assert cache.get(k) == b"v" * size
    assert cache.stats().rejected == 0
