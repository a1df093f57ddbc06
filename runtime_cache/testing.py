"""A conformance suite that every backend runs, built-in or third party.

Subclass the mixins in a test module and provide a ``backend`` fixture::

    import pytest
    from runtime_cache.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        @pytest.fixture
        def backend(self, tmp_path):
            b = MyBackend(tmp_path)
            yield b
            b.close()

:class:`BackendConformance` holds the contract every backend must meet;
:class:`CacheConformance` runs the :class:`~runtime_cache.Cache` front over the
backend (corruption, bundles, listing). Requires pytest.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from .api import SPAN_HEAD, Backend, StoredItem
from .cache import Cache
from .errors import InvalidKeyError
from .keys import make_key

__all__ = ["BackendConformance", "CacheConformance"]


def _k(i: int | str, ns: str = "t/conformance") -> str:
    return f"{ns}/{i:0>32}" if isinstance(i, int) else f"{ns}/{i}"


class BackendConformance:
    """The ``Backend`` contract: bytes in, bytes out, ``None`` for a miss."""

    def test_is_backend(self, backend: Backend) -> None:
        assert isinstance(backend, Backend)

    def test_missing_is_none(self, backend: Backend) -> None:
        assert backend.get(_k("missing")) is None

    def test_roundtrip(self, backend: Backend) -> None:
        backend.set(_k(1), b"hello")
        assert backend.get(_k(1)) == b"hello"

    def test_every_byte_value(self, backend: Backend) -> None:
        value = bytes(range(256)) * 4
        backend.set(_k(2), value)
        assert backend.get(_k(2)) == value

    def test_empty_value(self, backend: Backend) -> None:
        backend.set(_k(3), b"")
        assert backend.get(_k(3)) == b""

    def test_large_value(self, backend: Backend) -> None:
        value = os.urandom(1 << 20)
        backend.set(_k(4), value)
        assert backend.get(_k(4)) == value

    def test_overwrite(self, backend: Backend) -> None:
        backend.set(_k(5), b"one")
        backend.set(_k(5), b"two")
        assert backend.get(_k(5)) == b"two"

    def test_add_stores_only_where_nothing_is(self, backend: Backend) -> None:
        assert backend.add(_k("add"), b"first") is True
        assert backend.add(_k("add"), b"second") is False
        assert backend.get(_k("add")) == b"first"
        backend.set(_k("add"), b"third")  # (set replaces, as ever)
        assert backend.get(_k("add")) == b"third"

    def test_delete(self, backend: Backend) -> None:
        backend.set(_k(6), b"x")
        assert backend.delete(_k(6)) is True
        assert backend.get(_k(6)) is None
        assert backend.delete(_k(6)) is False

    def test_delete_if_removes_only_the_expected_bytes(self, backend: Backend) -> None:
        backend.set("cf/cad", b"bad")
        assert backend.delete_if("cf/cad", b"other") is False
        assert backend.get("cf/cad") == b"bad"
        assert backend.delete_if("cf/cad", b"bad") is True
        assert backend.get("cf/cad") is None
        assert backend.delete_if("cf/cad", b"bad") is False

    def test_delete_if_unchanged_keeps_a_value_written_again(self, backend: Backend) -> None:
        key, other = _k("unchanged"), _k("unchanged-too")
        backend.set(key, b"head-one:" + b"x" * 64)
        (listed,) = [item for item in backend.scan(key) if item.key == key]
        backend.set(key, b"head-two:" + b"x" * 64)  # written again: same size, other head
        assert backend.delete_if_unchanged(key, listed, b"head-one:") is False
        assert backend.peek(key) == b"head-two:" + b"x" * 64
        backend.set(other, b"head-three:" + b"y" * 64)
        (listed,) = [item for item in backend.scan(other) if item.key == other]
        assert backend.delete_if_unchanged(other, listed, b"head-four:") is False
        assert backend.delete_if_unchanged(other, listed, b"head-three:") is True
        assert backend.peek(other) is None
        assert backend.delete_if_unchanged(other, listed, b"head-three:") is False

    def test_keys_with_prefix(self, backend: Backend) -> None:
        backend.set(_k(7, "a/one"), b"1")
        backend.set(_k(8, "a/two"), b"2")
        backend.set(_k(9, "b/one"), b"3")
        assert sorted(backend.keys("a/")) == sorted([_k(7, "a/one"), _k(8, "a/two")])
        assert list(backend.keys("a/one/")) == [_k(7, "a/one")]
        assert set(backend.keys()) >= {_k(7, "a/one"), _k(8, "a/two"), _k(9, "b/one")}

    def test_many(self, backend: Backend) -> None:
        items = {_k(i, "m/many"): bytes([i]) * (i + 1) for i in range(20)}
        backend.set_many(items)
        wanted = [*items, _k("absent", "m/many")]
        assert backend.get_many(wanted) == items

    def test_head(self, backend: Backend) -> None:
        backend.set(_k(10), b"0123456789")
        assert backend.head(_k(10), 4) == b"0123"
        assert backend.head(_k("nope"), 4) is None

    def test_get_parts_join_to_get(self, backend: Backend) -> None:
        def span(head: bytes) -> tuple[int, int]:
            assert len(head) >= min(SPAN_HEAD, len(value))
            return 100, len(value) - 7

        for size in (0, 300, 300_000):
            value = os.urandom(size)
            backend.set(_k(f"parts{size}"), value)
            pieces = backend.get_parts(_k(f"parts{size}"), span)
            assert pieces is not None and len(pieces) in (1, 3)
            assert all(type(p) is bytes for p in pieces) and b"".join(pieces) == value
            if len(pieces) == 3:  # cut where span said
                assert len(pieces[0]) == 100 and len(pieces[2]) == 7
        assert backend.get_parts(_k("no-parts"), span) is None

    def test_get_range_reads_a_part_or_nothing(self, backend: Backend) -> None:
        value = os.urandom(300_000)
        backend.set(_k("range"), value)
        size = len(value)
        got = backend.get_range(_k("range"), 100, size - 7, size)
        if got is not None:  # (a backend may read only whole values: None, always)
            assert got == (value[100:-7], value[-7:]) and all(type(p) is bytes for p in got)
            assert backend.get_range(_k("range"), 0, size, size) == (value, b"")
        for start, end, other in ((100, 200, size + 1), (100, 200, size - 1), (5, 4, size)):
            assert backend.get_range(_k("range"), start, end, other) is None
        assert backend.get_range(_k("no-range"), 0, 1, 1) is None

    def test_scan_sizes(self, backend: Backend) -> None:
        backend.set(_k(11, "s/scan"), b"abc")
        backend.set(_k(12, "s/scan"), b"defgh")
        items = {item.key: item for item in backend.scan("s/scan/")}
        assert set(items) == {_k(11, "s/scan"), _k(12, "s/scan")}
        assert all(isinstance(item, StoredItem) for item in items.values())
        sizes = sorted(item.size for item in items.values())
        assert sizes[0] >= 3 and sizes[1] >= 5  # stored sizes may include framing

    def test_stored_size_is_the_size_stored_now(self, backend: Backend) -> None:
        from runtime_cache.stored_sizes import stored_size

        backend.set("conf/size/a", b"x" * 100)
        backend.set("conf/size/a", b"x" * 37)  # (written again: its size now)
        assert 37 <= (stored_size(backend, "conf/size/a") or 0) < 100  # (framing may add)
        assert stored_size(backend, "conf/size/missing") is None

    def test_hostile_keys_rejected_or_safe(self, backend: Backend) -> None:
        hostile = ["../../etc/passwd", "a/../../b", "a\x00b", "/abs/path", "x" * 5000, ".", ""]
        for key in hostile:
            try:
                backend.set(key, b"v")
            except InvalidKeyError:
                continue
            assert backend.get(key) == b"v", key
            backend.delete(key)

    def test_threads_never_tear(self, backend: Backend) -> None:
        key = _k(13)
        values = [bytes([i]) * 50_000 for i in range(8)]
        errors: list[BaseException] = []

        def work(i: int) -> None:
            try:
                for _ in range(20):
                    backend.set(key, values[i])
                    got = backend.get(key)
                    assert got is None or got in values
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(values))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors

    def test_peek_reads_like_get(self, backend: Backend) -> None:
        backend.set(_k(14), b"peeked")
        assert backend.peek(_k(14)) == b"peeked"
        assert backend.peek(_k("absent")) is None
        assert backend.peek_many([_k(14), _k("absent")]) == {_k(14): b"peeked"}

    def test_close_twice(self, backend: Backend) -> None:
        backend.close()
        backend.close()


class CacheConformance:
    """The :class:`Cache` front over the backend: entries, corruption, bundles."""

    @staticmethod
    def _key(i: int) -> Any:
        return make_key(
            module_id=f"mod{i % 3}", runtime="conf", purpose="test", device={"n": 1}, i=i
        )

    @staticmethod
    def _cache(backend: Backend, *, strict: bool = False) -> Cache:
        # A shared store needs a secret (runtime_cache.trust).
        return Cache(backend, strict=strict, secret="conformance" if backend.shared else None)

    def test_put_get_entries(self, backend: Backend) -> None:
        cache = self._cache(backend)
        for i in range(6):
            assert cache.put(self._key(i), b"v%d" % i, build_seconds=0.5)
        assert cache.get(self._key(4)) == b"v4"
        listed = {info.key: info for info in cache.entries(runtime="conf")}
        assert set(listed) == {str(self._key(i)) for i in range(6)}
        assert {info.module_id for info in cache.entries(module_id="mod1")} == {"mod1"}
        assert cache.stats().seconds_saved == pytest.approx(0.5)

    def test_corrupt_entry_is_a_counted_miss(self, backend: Backend) -> None:
        cache = self._cache(backend)
        key = self._key(1)
        cache.put(key, b"good")
        blob = backend.get(str(key))
        assert blob is not None
        backend.set(str(key), blob[:-3])  # truncated: damage, whether signed or not
        # A miss; or, where the store still holds the good entry after the damaged copy
        # was removed (a tier below, a queued write of the damage), the good entry.
        assert cache.get(key) in (None, b"good")
        assert cache.stats().corrupt == 1
        # Only the bytes judged bad are removed: a tier that still holds the good entry
        # (a remote tier whose write of the damaged copy had not landed) may serve it.
        value = cache.get_or_build(key, lambda: b"rebuilt")
        assert value in (b"rebuilt", b"good")
        assert cache.get(key) == value

    def test_bundle_roundtrip(self, backend: Backend) -> None:
        cache = self._cache(backend)
        for i in range(5):
            cache.put(self._key(i), b"b%d" % i)
        data = cache.dumps(runtime="conf")
        for i in range(5):
            cache.delete(self._key(i))
        assert cache.loads(data) == 5
        assert cache.get(self._key(3)) == b"b3"

    def test_strict_cache_roundtrip_and_miss(self, backend: Backend) -> None:
        cache = self._cache(backend, strict=True)
        assert cache.get("conf/test/" + "0" * 32) is None  # a miss is not an error
        cache.put(self._key(7), b"strict")
        assert cache.get(self._key(7)) == b"strict"
        assert cache.stats().errors == 0
