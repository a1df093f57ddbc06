"""A value read again (issue 16, item 5): a cache that checked (or wrote) an entry reads it
again without its header, with ``Backend.get_range``, and checks the value (its length, its
checksum, and the signature when a secret is set) against the header it remembers. These
tests change the entry on disk between reads: nothing but the bytes it checked is served,
and anything else is read whole and judged as before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend

SIZE = 70_000
Range = tuple[bytes, bytes] | None


def _key(i: int = 0) -> rc.CacheKey:
    return rc.make_key(module_id="m@1", runtime="t", purpose="again", i=i)


class Counting(DirectoryBackend):
    """A directory backend that counts its whole reads, its reads of a part, and its reads that
    count no use."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, max_size=None)
        self.calls: dict[str, int] = {"get_parts": 0, "get_range": 0, "peek": 0}

    def peek(self, key: str) -> bytes | None:
        self.calls["peek"] += 1
        return super().peek(key)

    def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
        self.calls["get_parts"] += 1
        return super().get_parts(key, span)

    def get_range(self, key: str, start: int, end: int, size: int) -> Range:
        self.calls["get_range"] += 1
        return super().get_range(key, start, end, size)


def _path(backend: DirectoryBackend, key: rc.CacheKey) -> Path:
    digest = str(key)[-32:]
    return backend.root / str(key).rsplit("/", 1)[0] / digest[:2] / f"{digest}.rce"


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))  # in place: the same file, the same size


def _filled(tmp_path: Path, secret: str | None = None) -> tuple[Counting, rc.Cache, bytes]:
    """A counting backend, a cache over it, and the value it stored under ``_key()``."""
    backend = Counting(tmp_path)
    cache = rc.Cache(backend, secret=secret)
    value = os.urandom(SIZE)
    assert cache.put(_key(), value)
    return backend, cache, value


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_a_value_read_again_skips_its_header_and_counts_one_hit(
    tmp_path: Path, secret: str | None
) -> None:
    backend, cache, value = _filled(tmp_path, secret)
    blob = backend.get(str(_key()))
    assert blob is not None
    for _ in range(3):
        got = cache.get(_key())
        assert got == value and type(got) is bytes
    assert backend.calls == {"get_parts": 0, "get_range": 3, "peek": 0}
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.bytes_read) == (3, 0, 3 * len(blob))
    # A cache that has not checked it reads it whole first, then its value alone.
    other = rc.Cache(backend, secret=secret)
    assert other.get(_key()) == value and other.get(_key()) == value
    assert backend.calls == {"get_parts": 1, "get_range": 4, "peek": 0}


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_a_value_changed_in_place_is_read_whole_and_judged(
    tmp_path: Path, secret: str | None
) -> None:
    backend, cache, _ = _filled(tmp_path, secret)
    path = _path(backend, _key())
    _flip(path, path.stat().st_size - 100 - (32 if secret else 0))
    assert cache.get(_key()) is None
    # (its use counted by the peek; then one read past it, in parts since session 38, finds
    # it removed)
    assert backend.calls == {"get_parts": 1, "get_range": 1, "peek": 1}
    stats = cache.stats()
    assert (stats.corrupt, stats.misses, stats.hits) == (1, 1, 0)
    assert not path.exists()  # exactly the damaged bytes are removed


def test_a_forged_signature_is_never_served(tmp_path: Path) -> None:
    backend, cache, _ = _filled(tmp_path, "s3cret")
    path = _path(backend, _key())
    _flip(path, path.stat().st_size - 3)
    assert cache.get(_key()) is None
    assert cache.stats().rejected == 1 and path.exists()  # a forgery is kept, as before


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_a_header_damaged_under_a_checked_value_serves_that_value_alone(
    tmp_path: Path, secret: str | None
) -> None:
    # The value and its signature are the bytes this cache checked: it serves them. A cache
    # that has not checked the entry reads the header, and finds it damaged.
    backend, cache, value = _filled(tmp_path, secret)
    path = _path(backend, _key())
    _flip(path, codec.HEADER_SIZE + 5)
    assert cache.get(_key()) == value
    fresh = rc.Cache(backend, secret=secret)
    assert fresh.get(_key()) is None and fresh.stats().corrupt == 1
    assert not path.exists()
    assert cache.get(_key()) is None


@pytest.mark.parametrize("secret", [None, "s3cret"])
def test_an_entry_written_again_by_another_is_served_as_written(
    tmp_path: Path, secret: str | None
) -> None:
    backend, cache, _ = _filled(tmp_path, secret)
    other = rc.Cache(DirectoryBackend(tmp_path, max_size=None), secret=secret)
    for new in (os.urandom(SIZE), os.urandom(SIZE + 1), os.urandom(SIZE - 1)):
        assert other.put(_key(), new, build_seconds=2.5)
        assert cache.get(_key()) == new
        assert cache.get(_key()) == new  # and then read alone, as checked now
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (6, 0) and stats.seconds_saved == 6 * 2.5
    assert backend.calls == {"get_parts": 2, "get_range": 6, "peek": 1}


def test_another_keys_entry_of_the_same_size_is_refused(tmp_path: Path) -> None:
    backend = Counting(tmp_path)
    cache = rc.Cache(backend)
    assert cache.put(_key(0), os.urandom(SIZE))
    assert cache.put(_key(1), os.urandom(SIZE))
    mine, theirs = _path(backend, _key(0)), _path(backend, _key(1))
    mine.write_bytes(theirs.read_bytes())  # the same size: only the key tells them apart
    assert cache.get(_key(0)) is None
    assert cache.stats().misses == 1 and cache.get(_key(1)) is not None


def test_a_changed_producer_or_limits_reads_whole(tmp_path: Path) -> None:
    backend, cache, value = _filled(tmp_path)
    cache.producer = "someone else"
    assert cache.get(_key()) == value
    cache.limits = codec.Limits(max_value_size=SIZE - 1)
    assert cache.get(_key()) is None  # over the new limit: its head says so (session 38)
    # (then the read past it, which finds its head again: no tier below holds another)
    assert backend.calls == {"get_parts": 3, "get_range": 0, "peek": 0}


def test_a_failed_read_again_fails_as_the_whole_read_does(tmp_path: Path) -> None:
    class Failing(Counting):
        def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
            return super().get_parts(key, span)

        def get_range(self, key: str, start: int, end: int, size: int) -> Range:
            super().get_range(key, start, end, size)
            raise OSError("the disk went away")

    backend = Failing(tmp_path)
    cache = rc.Cache(backend)
    value = os.urandom(SIZE)
    assert cache.put(_key(), value)
    assert cache.get(_key()) == value  # the whole read still works
    assert backend.calls == {"get_parts": 1, "get_range": 1, "peek": 0}
    assert cache.stats().errors == 0


def test_a_subclass_that_changes_the_whole_read_alone_sees_every_read(tmp_path: Path) -> None:
    """The first review: a subclass whose get_parts refuses a key still had its value served,
    by the get_range it inherited, after the first read."""

    class Refusing(DirectoryBackend):
        refused = False

        def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
            return None if self.refused else super().get_parts(key, span)

    backend = Refusing(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    assert cache.put(_key(), b"v" * SIZE) and cache.get(_key()) == b"v" * SIZE
    backend.refused = True
    assert cache.get(_key()) is None and _key() not in cache


def test_a_whole_read_set_on_the_instance_sees_every_read(tmp_path: Path) -> None:
    """The second review: a get_parts set on the backend after the Cache was made over it
    (a test's fault, a wrapper) was passed by the read alone."""
    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    assert cache.put(_key(), b"v" * SIZE) and cache.get(_key()) == b"v" * SIZE
    calls: list[str] = []

    def refuse(key: str, span: Any) -> None:
        calls.append(key)

    backend.get_parts = refuse  # type: ignore[method-assign]
    assert cache.get(_key()) is None and calls == [str(_key())]


def test_a_backend_of_its_own_with_a_part_read_is_read_in_part() -> None:
    """The second review: a Backend that defines get_range but inherits the default get_parts
    (built on its get) had its get_range never called."""

    class Parts(MemoryBackend):
        ranges = 0

        def get_range(self, key: str, start: int, end: int, size: int) -> Range:
            value = self.get(key)
            if value is None or len(value) != size or not 0 <= start <= end <= size:
                return None
            self.ranges += 1
            return value[start:end], value[end:]

    backend = Parts()
    cache = rc.Cache(backend)
    assert cache.put(_key(), b"v" * SIZE)
    assert cache.get(_key()) == b"v" * SIZE and backend.ranges == 1


def test_one_get_counts_one_use(tmp_path: Path) -> None:
    """The first review: a value read alone that then failed its check counted a use, and the
    whole read after it a second one (the hits journal, `ls`, the time saved)."""
    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend, secret="s3cret")
    assert cache.put(_key(), os.urandom(SIZE))
    other = rc.Cache(DirectoryBackend(tmp_path, max_size=None), secret="s3cret")
    assert other.put(_key(), os.urandom(SIZE))  # the same size, another header and value
    for expected in (1, 2):  # the first read alone fails its check; the second is read whole
        assert cache.get(_key()) is not None
        backend.flush_hits()
        assert [item.hits for item in backend.scan(str(_key()))] == [expected]


@pytest.mark.parametrize("kind", ["fifo", "link", "folder"])
def test_junk_that_stays_is_counted_once_a_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The first review: junk this process may not remove (another member's, in a shared
    folder) was counted and logged by the read alone, and again by the whole read."""
    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    assert cache.put(_key(), b"v" * SIZE) and cache.get(_key()) == b"v" * SIZE
    import runtime_cache.backends.directory as directory

    not_ours = lambda root_fd, rel: (rel, "", False)  # noqa: E731 - not ours to remove
    monkeypatch.setattr(directory, "clear_way", not_ours)
    path = _path(backend, _key())
    path.unlink()
    {"fifo": os.mkfifo, "link": lambda p: os.symlink("/etc/hostname", p), "folder": os.mkdir}[kind](
        path
    )
    for count in (1, 2):
        assert cache.get(_key()) is None
        assert backend.junk == count and cache.stats().misses == count


@pytest.mark.parametrize("answer", ["three pieces", "bytes", "nones", "forged"])
def test_a_backend_answering_out_of_shape_is_read_whole(tmp_path: Path, answer: str) -> None:
    """The first review: a get_range answering in another shape made a lenient get raise."""

    class OutOfShape(Counting):
        def get_parts(self, key: str, span: Any) -> tuple[bytes, ...] | None:
            return super().get_parts(key, span)

        def get_range(self, key: str, start: int, end: int, size: int) -> Any:
            got = super().get_range(key, start, end, size)
            if got is None:
                return None
            middle, tail = got
            return {
                "three pieces": (b"", middle, tail),
                "bytes": middle + tail,
                "nones": (None, None),
                "forged": (b"x" * len(middle), tail),
            }[answer]

    backend = OutOfShape(tmp_path)
    cache = rc.Cache(backend)
    value = os.urandom(SIZE)
    assert cache.put(_key(), value)
    assert cache.get(_key()) == value  # read whole after the answer failed its check
    assert backend.calls == {"get_parts": 0, "get_range": 1, "peek": 1}
    backend.flush_hits()
    assert [item.hits for item in backend.scan(str(_key()))] == [1]


def test_a_backend_without_a_part_read_reads_whole() -> None:
    backend = MemoryBackend()
    cache = rc.Cache(backend)
    assert cache.put(_key(), b"v" * SIZE) and cache.get(_key()) == b"v" * SIZE
    assert backend.get_range(str(_key()), 0, 1, 1) is None


@pytest.mark.parametrize("change", ["grown", "shrunk", "grown by a byte", "emptied"])
def test_a_file_of_another_size_is_read_whole_and_judged(tmp_path: Path, change: str) -> None:
    """The read alone takes no ``fstat`` (session 39): it reads one byte past the end it
    expects, so a file that grew or shrank since it was checked is read whole and judged."""
    backend, cache, value = _filled(tmp_path)
    assert cache.get(_key()) == value
    path = _path(backend, _key())
    blob = path.read_bytes()
    path.write_bytes(
        {
            "grown": blob + os.urandom(4096),
            "grown by a byte": blob + b"\0",
            "shrunk": blob[:-1],
            "emptied": b"",
        }[change]
    )
    reads = dict(backend.calls)
    assert cache.get(_key()) is None  # never the bytes checked before
    assert backend.calls["get_range"] == reads["get_range"] + 1
    assert backend.calls["get_parts"] > reads["get_parts"]  # read whole, and judged
    assert cache.stats().misses == 1 and cache.stats().hits == 1
    assert cache.get(_key()) is None  # and it stays a miss


def test_the_read_alone_asks_no_fstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the read alone trusts is the size it expects, checked by reading: a regular file's
    ``fstat`` (the whole read's) is not asked, and a value read so counts one use."""
    import runtime_cache.backends.bounded_reads as bounded_reads

    backend, cache, value = _filled(tmp_path)
    assert cache.get(_key()) == value

    def no_fstat(fd: int, limit: int) -> int:
        raise AssertionError("fstat asked")

    monkeypatch.setattr(bounded_reads, "regular_size", no_fstat)
    assert cache.get(_key()) == value and cache.stats().hits == 2
    backend.flush_hits()
    assert [item.hits for item in backend.scan(str(_key()))] == [2]


def test_a_range_of_a_size_past_the_entry_limit_reads_nothing(tmp_path: Path) -> None:
    """``get_range`` is public: a size past ``max_entry_size`` answers ``None`` before any
    read (the whole read refuses such a file too)."""
    backend = DirectoryBackend(tmp_path, max_size=None, max_entry_size=1 << 20)
    backend.set("t/p/k", b"x" * 100)
    assert backend.get_range("t/p/k", 0, 100, 100) == (b"x" * 100, b"")
    assert backend.get_range("t/p/k", 0, 100, (1 << 20) + 1) is None
    assert backend.get_range("t/p/k", 0, 1 << 40, 1 << 40) is None
