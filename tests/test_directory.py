"""DirectoryBackend: layout, permissions, read-only, symlinks, LRU cap, many processes."""

from __future__ import annotations

import fcntl
import logging
import multiprocessing as mp
import os
import random
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.errors import EntryTooLargeError, InvalidKeyError

KEY = "opencl/program-binary/3f2a" + "0" * 28


def test_layout_and_permissions(tmp_path: Path) -> None:
    root = tmp_path / "c"
    backend = DirectoryBackend(root)
    backend.set(KEY, b"v")
    path = root / "opencl" / "program-binary" / "3f" / ("3f2a" + "0" * 28 + ".rce")
    assert path.read_bytes() == b"v"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for folder in (path.parent, path.parent.parent, path.parent.parent.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(backend.keys()) == [KEY]


@pytest.mark.parametrize(
    "bad",
    [
        "../x",
        "a/../b",
        "a//b",
        "/abs",
        "a/",
        ".hidden",
        "a/.tmp-1",
        "nul\x00",
        "x" * 2000,
        "a/b.rce",
        "a b",
        "opencl\n/driver-cache/k",
        "a/b\n",
    ],
)
def test_hostile_keys_rejected(tmp_path: Path, bad: str) -> None:
    backend = DirectoryBackend(tmp_path)
    with pytest.raises(InvalidKeyError):
        backend.set(bad, b"v")
    with pytest.raises(InvalidKeyError):
        backend.get(bad)


def test_nested_keys_do_not_collide(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    keys = ["a/b", "a/b/c", "a/bc", "a/b/bb", "a/b/c/d"]
    for k in keys:
        backend.set(k, k.encode())
    assert {k: backend.get(k) for k in keys} == {k: k.encode() for k in keys}
    assert sorted(backend.keys()) == sorted(keys)
    assert sorted(backend.keys("a/b/")) == ["a/b/bb", "a/b/c", "a/b/c/d"]


def test_vanished_file_is_a_miss(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"v")
    for path in tmp_path.rglob("*.rce"):
        path.unlink()
    assert backend.get(KEY) is None
    assert backend.delete(KEY) is False


def test_symlink_is_never_followed(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path / "c")
    backend.set(KEY, b"v")
    (path,) = (tmp_path / "c").rglob("*.rce")
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    path.unlink()
    path.symlink_to(target)
    assert backend.get(KEY) is None  # not read through the link
    backend.set(KEY, b"new")  # replaces the link itself
    assert target.read_bytes() == b"precious"
    assert not path.is_symlink() and path.read_bytes() == b"new"


READ_ONLY_CHILD = """
import logging, os, sys
import runtime_cache as rc
for name in rc.__all__:  # its names load on first use: load them while root can read the files
    getattr(rc, name)
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
os.setgid(65534); os.setuid(65534)  # nobody: the permission bits now apply
cache = rc.Cache(rc.open_backend("dir://" + sys.argv[1]))
key = rc.make_key(module_id="m", runtime="r", purpose="p")
for i in range(10):
    assert cache.get(key) == b"good"
    assert not cache.put(rc.make_key(module_id="m", runtime="r", purpose="p", i=i), b"x")
s = cache.stats()
print(s.hits, s.errors)
"""


def test_read_only_directory_serves_reads() -> None:
    base = Path(tempfile.mkdtemp(prefix="rc-ro-", dir="/tmp"))  # a path "nobody" can reach
    base.chmod(0o755)
    root = base / "ro"
    cache = rc.Cache(DirectoryBackend(root))
    cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"good")
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o555)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o444)
    if os.geteuid() != 0:
        pytest.skip("needs root to run the reader as another user")
    out = subprocess.run(
        [sys.executable, "-c", READ_ONLY_CHILD, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/tmp"},
    )
    shutil.rmtree(base, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["10", "10"]
    assert out.stderr.count("WARNING") == 1, out.stderr  # one line: read-only, reads served
    assert "serving reads, skipping writes" in out.stderr


def test_lru_cap(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path, max_size=10 * 4096)  # the cap counts disk blocks
    now = time.time()
    for i in range(8):
        backend.set(f"t/p/k{i}", os.urandom(4096))
    for i, path in enumerate(sorted(tmp_path.rglob("*.rce"))):
        os.utime(path, (now - 1000 + i, now - 1000 + i))
    backend.get("t/p/k0")  # now the most recently used
    for i in range(8, 12):
        backend.set(f"t/p/k{i}", os.urandom(4096))
    assert backend.total_size() <= 10 * 4096
    left = set(backend.keys())
    assert "t/p/k0" in left and "t/p/k1" not in left


def test_a_value_over_the_cap_is_refused_and_the_cache_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One value larger than max_size pushed every other entry out, then itself (20 entries
    to none); one over max_entry_size was written, then taken for junk and removed."""
    backend = DirectoryBackend(tmp_path, max_size=100_000, max_entry_size=60_000)
    for i in range(20):
        backend.set(f"t/p/k{i}", os.urandom(4000))
    for size in (150_000, 70_000):
        with pytest.raises(EntryTooLargeError) as refused:
            backend.set("t/p/big", os.urandom(size))
        assert refused.value.refused == {"t/p/big"}
    assert len(list(backend.keys())) == 20 and backend.get("t/p/big") is None
    assert "not a cache entry" not in caplog.text
    # A batch stores what fits and names what it refused; the front counts both.
    with pytest.raises(EntryTooLargeError) as refused:
        backend.set_many({"t/p/a": b"a", "t/p/huge": bytes(70_000), "t/p/b": b"b"})
    assert refused.value.refused == {"t/p/huge"}
    assert backend.get("t/p/a") == b"a" and backend.get("t/p/b") == b"b"
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.get_or_build(key, lambda: bytes(80_000)) == bytes(80_000)
    assert cache.stats().stores == 0 and cache.stats().errors == 1
    assert cache.get_or_build(key, lambda: b"small") == b"small"  # no outage
    assert cache.stats().stores == 1


def test_hits_shared_across_instances(tmp_path: Path) -> None:
    a = DirectoryBackend(tmp_path)
    a.set(KEY, b"v")
    for _ in range(3):
        a.get(KEY)
    a.close()
    b = DirectoryBackend(tmp_path)
    b.get(KEY)
    (item,) = list(b.scan())
    assert item.hits == 4 and item.last_access is not None


@pytest.mark.parametrize("remove", ["delete", "delete_if"])
def test_a_removed_entrys_hits_do_not_pass_to_the_next_under_its_key(
    tmp_path: Path, remove: str
) -> None:
    a = DirectoryBackend(tmp_path)
    a.set(KEY, b"v")
    for _ in range(3):
        a.get(KEY)
    a.flush_hits()
    b = DirectoryBackend(tmp_path)  # another process, with hits of its own not yet flushed
    b.get(KEY)
    assert b.delete(KEY) if remove == "delete" else b.delete_if(KEY, b"v")
    b.set(KEY, b"w")  # a new entry under the key (an import after `rm`)
    b.get(KEY)
    # Unflushed, the new hit is b's own; the three old ones and b's first are gone.
    assert [next(iter(x.scan())).hits for x in (a, b, DirectoryBackend(tmp_path))] == [0, 1, 0]
    b.flush_hits()
    (item,) = list(DirectoryBackend(tmp_path).scan())
    assert item.hits == 1


def test_stale_temp_files_cleaned(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"v")
    folder = next(tmp_path.rglob("*.rce")).parent
    old = folder / ".tmp-123-1-1"
    old.write_bytes(b"partial")
    fresh = folder / ".tmp-123-1-2"
    fresh.write_bytes(b"in flight")
    os.utime(old, (time.time() - 3600,) * 2)
    assert list(backend.keys()) == [KEY]  # temp files are never keys
    # A live writer holds its temp file's lock (see backends/temp_files.py).
    with open(fresh, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)
        assert backend.vacuum() == 1
    assert not old.exists() and fresh.exists()


def _worker(root: str, seed: int, ops: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    rng = random.Random(seed)
    backend = DirectoryBackend(root, max_size=None)
    bad = 0
    for _ in range(ops):
        k = f"mp/test/k{rng.randrange(20)}"
        op = rng.random()
        if op < 0.5:
            value = backend.get(k)
            # Every value written is its key repeated, then a writer tag: check it is whole.
            if value is not None and not value.startswith(k.encode() * 100):
                bad += 1
        elif op < 0.9:
            backend.set(k, k.encode() * 100 + bytes([seed]) * rng.randrange(1, 50_000))
        else:
            backend.delete(k)
    queue.put(bad)


def test_many_processes_never_tear(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), s, 2000, queue)) for s in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    assert [queue.get(timeout=5) for _ in procs] == [0, 0, 0, 0]
    assert not list(tmp_path.rglob(".tmp-*"))


def test_peek_is_not_a_use(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"v")
    (path,) = tmp_path.rglob("*.rce")
    os.utime(path, (1000.0, 1000.0))
    assert backend.peek(KEY) == b"v" and backend.peek_many([KEY]) == {KEY: b"v"}
    cache = rc.Cache(backend)
    cache.dumps()
    from runtime_cache.maintenance import verify

    assert verify(cache).checked == 1
    (item,) = list(backend.scan())
    assert item.hits == 0 and item.last_access == 1000.0  # export and verify left LRU order alone
    backend.get(KEY)
    (item,) = list(backend.scan())
    assert item.hits == 1 and item.last_access is not None and item.last_access > 1000.0


def test_a_bytes_path_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    where = os.fsencode(tmp_path / "as-bytes")
    with pytest.raises(TypeError, match="must be text"):
        DirectoryBackend(where)  # type: ignore[arg-type]
    assert not os.path.exists(where)


@pytest.mark.parametrize("spelling", ["", "none", "NONE", "0", "0B", "0.0", "00", "0KB"])
def test_every_spelling_of_zero_max_size_means_no_cap(tmp_path: Path, spelling: str) -> None:
    """One meaning for 0 however it is written (a 0-byte cap would keep nothing)."""
    assert DirectoryBackend.from_url(f"dir://{tmp_path}?max_size={spelling}").max_size is None
    if spelling[:1].isdigit():
        assert DirectoryBackend(tmp_path, max_size=spelling).max_size is None


def test_max_files_zero_means_no_cap_on_the_count(tmp_path: Path) -> None:
    """Like max_size=0 (a cap of 0 files kept nothing: each put was evicted at once)."""
    backend = DirectoryBackend.from_url(f"dir://{tmp_path}?max_files=0&max_size=1GB")
    assert backend.max_files is None
    for i in range(3):
        backend.set(f"k/v/{i:032x}", b"x")
    assert len(list(backend.keys())) == 3


@pytest.mark.parametrize("size", ["none", "0", "1GB"])
@pytest.mark.parametrize("files", [1, 2, 3, 10, 100])
def test_the_count_cap_holds_on_every_write_with_or_without_a_size_cap(
    tmp_path: Path, size: str, files: int
) -> None:
    """max_files alone was never enforced, and with a size cap the count was looked at
    only every 256 writes (1,000 puts under max_files=10 left 240 files)."""
    backend = DirectoryBackend.from_url(f"dir://{tmp_path}?max_size={size}&max_files={files}")
    assert backend.max_files == files
    for i in range(300):
        backend.set(f"k/v/{i:032x}", bytes(100))
        assert len(list(backend.keys())) <= files, i
        # The write's own eviction never takes it (max_files=1 evicted to 0 files).
        assert backend.get(f"k/v/{i:032x}") == bytes(100), i
    kept = sorted(backend.keys())
    assert kept[-1] == f"k/v/{299:032x}"  # the latest is kept: least recently used go first
    assert backend.get(kept[-1]) == bytes(100)


def test_a_small_cap_says_at_the_open_which_values_it_keeps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A value must fit under 90% of max_size less a block: 404 bytes at 5 KB."""
    from runtime_cache.errors import EntryTooLargeError

    with caplog.at_level(logging.WARNING):
        backend = DirectoryBackend(tmp_path, max_size="5KB")
    assert "keeps no entry over 404 bytes stored" in caplog.text
    backend.set("k/v/small", bytes(404))
    with pytest.raises(EntryTooLargeError, match="404"):
        backend.set("k/v/large", bytes(405))
    assert list(backend.keys()) == ["k/v/small"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        DirectoryBackend(tmp_path / "big", max_size="1MB")
    assert "keeps no entry" not in caplog.text


def test_max_size_absent_is_the_default_and_a_size_is_kept(tmp_path: Path) -> None:
    from runtime_cache.api import parse_size
    from runtime_cache.backends.directory import DEFAULT_MAX_SIZE

    assert DirectoryBackend.from_url(f"dir://{tmp_path}").max_size == DEFAULT_MAX_SIZE
    assert DirectoryBackend(tmp_path, max_size=0).max_size is None
    url = f"dir://{tmp_path}?max_size=5MB"
    assert DirectoryBackend.from_url(url).max_size == parse_size("5MB")


@pytest.mark.parametrize("name", ["my cache", "50% off?", "a#b", "caf\u00e9", "x\udcffy"])
def test_a_dir_url_names_its_folder_with_escapes_decoded(tmp_path: Path, name: str) -> None:
    """``%XX`` in a ``dir://`` path is an escape, as in a ``file://`` URL; folder_url()
    escapes any folder name so that the URL opens that very folder."""
    from runtime_cache.urls import folder_url

    folder = tmp_path / name
    opened = DirectoryBackend.from_url(folder_url(str(folder)) + "?max_size=none")
    assert opened.root == folder and folder.is_dir()
    opened.set("k/v/" + "0" * 32, b"x")
    assert DirectoryBackend(folder).get("k/v/" + "0" * 32) == b"x"
    opened.close()


def test_folder_url_of_a_tilde_name_is_that_folder_not_a_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime_cache.urls import folder_url

    monkeypatch.chdir(tmp_path)
    opened = DirectoryBackend.from_url(folder_url("~root"))
    assert opened.root == tmp_path / "~root"
    opened.close()
    with pytest.raises(ValueError, match="default"):
        folder_url("")


def test_a_dir_url_is_decoded_once_and_refuses_a_nul(tmp_path: Path) -> None:
    from runtime_cache.errors import InvalidURLError
    from runtime_cache.registry import open_backend

    spaced = open_backend(f"dir://{tmp_path}/my%20cache")
    assert spaced.root == tmp_path / "my cache"  # type: ignore[attr-defined]
    twice = open_backend(f"dir://{tmp_path}/a%2520b")  # %25 is "%": decoded once only
    assert twice.root == tmp_path / "a%20b"  # type: ignore[attr-defined]
    bare = open_backend(f"dir://{tmp_path}/100%")  # a "%" that starts no escape stays
    assert bare.root == tmp_path / "100%"  # type: ignore[attr-defined]
    with pytest.raises(InvalidURLError, match="NUL"):
        open_backend(f"dir://{tmp_path}/x%00y")
    with pytest.raises(InvalidURLError, match="file name"):
        open_backend(f"dir://{tmp_path}/x\ud800y")  # a lone surrogate, given as text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["100%", "a%20b", "my cache"]
