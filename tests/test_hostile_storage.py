"""Hostile and broken storage: read-only and full file systems, files deleted or re-permissioned
underneath, a cache folder another user can reach, planted symlinks, and hostile keys.

Read-only and full disks are real: a small tmpfs mounted for the test (``mount``
needs root; the test skips without it). A second full-disk test injects ENOSPC
through a wrapper around ``os.write``, so it also runs where ``mount`` is denied.
Other users are real too: children switch to user ``nobody`` with ``os.setuid``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from conftest import tmpfs
from runtime_cache.api import MAX_TEXT_KEY
from runtime_cache.backends import directory
from runtime_cache.backends.callback import CallbackBackend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import BackendError, InvalidKeyError, ReadOnlyBackendError
from runtime_cache.maintenance import verify

NOBODY = 65534


def key(i: int = 0) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="hostile", purpose="test", device={"d": 1})


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted afterwards."""
    with tmpfs(tmp_path / "mnt", "1m", mode="0700") as mnt:
        yield mnt


def _as_nobody(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a child as another user")
    # Import first: the interpreter's own files may not be readable by nobody.
    prelude = (
        "import logging, os, sys\nimport runtime_cache as rc\n"
        "from runtime_cache.backends.directory import DirectoryBackend\n"
        "for name in rc.__all__:\n    getattr(rc, name)\n"  # names load on first use
        "os.setgid(65534); os.setuid(65534)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": "/tmp"},
    )


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A folder under /tmp that user nobody can traverse."""
    base = Path(tempfile.mkdtemp(prefix="rc-hostile-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------ read-only and full
def test_read_only_mount_serves_reads_and_logs_once(
    small_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = rc.Cache(DirectoryBackend(small_tmpfs))
    for i in range(3):
        assert cache.put(key(i), f"value {i}".encode())
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    caplog.set_level(logging.WARNING, logger="runtime_cache")
    cache = rc.Cache(DirectoryBackend(small_tmpfs))
    for _ in range(5):
        assert [cache.get(key(i)) for i in range(3)] == [b"value 0", b"value 1", b"value 2"]
        assert cache.put(key(9), b"new") is False
    stats = cache.stats()
    assert (stats.hits, stats.stores, stats.errors) == (15, 0, 5)
    assert cache.get_or_build(key(8), lambda: b"built") == b"built"  # a lease it cannot take
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # One line, that says what goes on: it said "read-only" twice (the backend, then the
    # front), the second time as an outage ("carrying on without the cache until it
    # recovers"), while reads went on.
    assert len(warnings) == 1, warnings
    assert "is read-only here" in warnings[0] and "serving reads, skipping writes" in warnings[0]
    with pytest.raises(ReadOnlyBackendError):
        DirectoryBackend(small_tmpfs).set("a/b", b"x")
    with pytest.raises(ReadOnlyBackendError):  # a delete there says read-only too
        DirectoryBackend(small_tmpfs).delete(str(key(0)))


def test_one_immutable_folder_among_good_ones_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator review of session 40: with one fan-out folder immutable, every write
    there said the store was read-only and the next good write said writes worked again,
    two warnings a call. Now a side failing again within a minute of its last warning is
    told at debug level."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    cache = rc.Cache(DirectoryBackend(tmp_path / "c"))
    cache.put(key(0), b"x")
    folder = os.path.dirname(cache.backend.root / cache.backend._rel(str(key(0))))  # type: ignore[attr-defined]
    if subprocess.run(["chattr", "+i", folder]).returncode:
        pytest.skip("chattr +i refused on this file system")
    try:
        caplog.set_level(logging.WARNING, logger="runtime_cache")
        there = [
            k for k in (key(i) for i in range(1, 3000)) if str(k)[-32:-30] == str(key(0))[-32:-30]
        ]
        assert len(there) >= 5
        for i, k in enumerate(there[:10]):
            assert cache.get_or_build(k, lambda: b"A") == b"A"
            assert cache.get_or_build(key(5000 + i), lambda: b"B") == b"B"
            assert cache.get(key(5000 + i)) == b"B"  # the other folders are written
    finally:
        subprocess.run(["chattr", "-i", folder], check=True)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) <= 2, warnings  # the first outage, and its end
    # One folder is no read-only store (session 40's note: it said "read-only here;
    # serving reads, skipping writes", while the other folders' writes went on).
    assert warnings and not any("read-only" in w for w in warnings), warnings
    assert "no permission for this entry" in warnings[0], warnings


def test_full_disk_skips_stores_keeps_entries_and_recovers(
    small_tmpfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="runtime_cache")
    cache = rc.Cache(DirectoryBackend(small_tmpfs, max_size=None))
    stored = []
    for i in range(30):  # 30 x 100 KB into 1 MiB
        if cache.put(key(i), bytes([i]) * 100_000):
            stored.append(i)
    assert 3 <= len(stored) < 30
    assert cache.stats().errors == 30 - len(stored)
    assert not list(small_tmpfs.rglob(".tmp-*"))  # no partial file left behind
    report = verify(cache)
    assert report.ok and report.checked == len(stored)
    assert all(cache.get(key(i)) == bytes([i]) * 100_000 for i in stored)
    full = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(full) == 1 and "disk full" in full[0].getMessage()
    for i in stored[:4]:
        assert cache.delete(key(i))
    assert cache.put(key(99), b"fits again")
    assert cache.get(key(99)) == b"fits again"
    assert any("work again" in r.getMessage() for r in caplog.records)


def test_injected_enospc_leaves_the_old_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = rc.Cache(DirectoryBackend(tmp_path))
    assert cache.put(key(), b"old value")
    real_write = os.write

    def full_disk(fd: int, data: bytes | memoryview) -> int:
        if ".tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(directory.os, "write", full_disk)
    assert cache.put(key(), b"new value that does not fit") is False
    monkeypatch.setattr(directory.os, "write", real_write)
    assert cache.get(key()) == b"old value"
    assert not list(tmp_path.rglob(".tmp-*"))
    assert cache.stats().errors == 1


# ------------------------------------------------------------ changes underneath
def test_files_and_folders_deleted_while_read(tmp_path: Path) -> None:
    values = {i: bytes([i]) * random.Random(i).randint(1, 2 << 20) for i in range(8)}
    cache = rc.Cache(DirectoryBackend(tmp_path))
    for i, value in values.items():
        cache.put(key(i), value)
    wrong: list[int] = []
    errors: list[BaseException] = []
    reads = 0

    def reader() -> None:
        nonlocal reads
        try:
            for n in range(400):
                i = n % len(values)
                got = cache.get(key(i))
                reads += 1
                if got is not None and got != values[i]:
                    wrong.append(i)
        except BaseException as exc:
            errors.append(exc)

    def vandal() -> None:
        rng = random.Random(3)
        for n in range(150):
            if n % 50 == 49:
                shutil.rmtree(tmp_path / "hostile", ignore_errors=True)
            else:
                for path in list(tmp_path.rglob("*.rce"))[: rng.randint(0, 3)]:
                    path.unlink(missing_ok=True)
            i = rng.randrange(len(values))
            cache.put(key(i), values[i])

    threads = [threading.Thread(target=reader), threading.Thread(target=vandal)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not wrong
    stats = cache.stats()
    assert stats.hits + stats.misses == reads
    assert stats.corrupt == 0
    assert cache.put(key(0), values[0]) and cache.get(key(0)) == values[0]


def test_store_into_a_folder_removed_underneath_succeeds(tmp_path: Path) -> None:
    # Found by the campaign: after an rm -rf of the cache's folders the next put
    # failed once (the backend remembered the folder); it now recreates it.
    cache = rc.Cache(DirectoryBackend(tmp_path))
    assert cache.put(key(1), b"one")
    shutil.rmtree(tmp_path / "hostile")
    assert cache.put(key(1), b"again")
    assert cache.get(key(1)) == b"again" and cache.stats().errors == 0


PERMISSIONS_CHILD = """
import logging, os, sys
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
logging.disable(logging.CRITICAL)
root = sys.argv[1]
k = lambda i: rc.make_key(module_id=f"m{i}", runtime="hostile", purpose="test", device=None)
cache = rc.Cache(DirectoryBackend(root))
for i in range(3):
    assert cache.put(k(i), b"v%d" % i)
path = os.path.join(root, "hostile", "test", str(k(0)).split("/")[-1][:2])
entry = next(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".rce"))
os.chmod(entry, 0)
out = [cache.get(k(0)), cache.get(k(1))]
os.chmod(entry, 0o600)
out.append(cache.get(k(0)))
os.chmod(os.path.join(root, "hostile", "test"), 0o500)
out.append(cache.put(k(5), b"new"))
out.append(cache.get(k(2)))
print(repr(out), cache.stats().errors)
"""


def test_permissions_changed_underneath(shared_base: Path) -> None:
    root = shared_base / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    out = _as_nobody(PERMISSIONS_CHILD, str(root))
    assert out.returncode == 0, out.stderr
    served, errors = out.stdout.rsplit(" ", 1)
    # unreadable -> miss; others still served; readable again -> hit; write refused -> skipped
    assert served == repr([None, b"v1", b"v0", False, b"v2"])
    assert int(errors) == 2


# --------------------------------------------------------------- two users
OTHER_USER_CHILD = """
import logging, sys
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.errors import ReadOnlyBackendError
logging.disable(logging.CRITICAL)
try:  # refused at the open (session 41): O_PATH had opened it, and each call then failed
    DirectoryBackend(sys.argv[1])
except ReadOnlyBackendError as exc:
    print("refused" if "no permission to enter it" in str(exc) else exc)
try:
    rc.open_backend(f"dir://{sys.argv[1]}")
except ReadOnlyBackendError:
    print("refused")
"""


def test_another_user_can_neither_read_nor_plant(shared_base: Path) -> None:
    root = shared_base / "cache"
    cache = rc.Cache(DirectoryBackend(root))
    assert cache.put(key(0), b"private")
    assert (root.stat().st_mode & 0o777) == 0o700
    out = _as_nobody(OTHER_USER_CHILD, str(root))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["refused", "refused"], out.stderr
    assert cache.get(key(0)) == b"private"


def test_a_root_someone_else_can_write_is_refused(shared_base: Path) -> None:
    # Found in review: a /tmp/cache made first by another user was used as is, so
    # that user could plant entries. Such a root is now refused unless shared=1.
    theirs = shared_base / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    anyones = shared_base / "anyones"
    anyones.mkdir()
    anyones.chmod(0o1777)
    for root in (theirs, anyones):
        with pytest.raises(BackendError, match="shared=1"):
            DirectoryBackend(root)
        with pytest.raises(BackendError):
            rc.open_backend(f"dir://{root}")
        assert DirectoryBackend(root, shared=True).root == root
        assert rc.open_backend(f"dir://{root}?shared=1") is not None


def test_provider_falls_back_to_no_cache_on_a_refused_root(
    shared_base: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    anyones = shared_base / "anyones"
    anyones.mkdir()
    anyones.chmod(0o777)
    monkeypatch.setenv("RUNTIME_CACHE", f"dir://{anyones}")
    rc.reset_cache_provider()
    cache = rc.get_cache()
    assert not cache.enabled
    assert cache.get_or_build(key(), lambda: b"built") == b"built"
    assert any("caching is off" in r.getMessage() for r in caplog.records)


def test_provider_log_hides_passwords(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Found in review: the provider logged the whole RUNTIME_CACHE URL, password included.
    monkeypatch.setenv("RUNTIME_CACHE", "redis://app:hunter2@127.0.0.1:1/0?bogus=1")
    rc.reset_cache_provider()
    assert not rc.get_cache().enabled
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "caching is off" in text and "hunter2" not in text


def test_symlink_planted_at_the_next_temp_name_is_not_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Temp names are random now (mkstemp-like); here the "random" name is made
    # known, and a link planted at it: O_EXCL|O_NOFOLLOW refuses it, a new name is drawn.
    root = tmp_path / "cache"
    cache = rc.Cache(DirectoryBackend(root))
    assert cache.put(key(0), b"first")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (root / f".tmp-{bytes(8).hex()}").symlink_to(victim)
    real = os.urandom
    draws = iter([bytes(8)])
    monkeypatch.setattr(os, "urandom", lambda n: next(draws, None) or real(n))
    assert cache.put(key(0), b"second")
    monkeypatch.setattr(os, "urandom", real)
    assert victim.read_bytes() == b"precious"
    assert cache.get(key(0)) == b"second"


def test_symlink_planted_at_an_entry_is_replaced_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache = rc.Cache(DirectoryBackend(root))
    cache.put(key(0), b"first")
    (entry,) = root.rglob("*.rce")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    entry.unlink()
    entry.symlink_to(victim)
    assert cache.get(key(0)) is None
    assert cache.put(key(0), b"second")
    assert victim.read_bytes() == b"precious" and not entry.is_symlink()


# ------------------------------------------------------------------ hostile keys
HOSTILE_KEYS = [
    "..",
    "../escape",
    "a/../../escape",
    "/etc/passwd",
    "a//b",
    "nul\x00byte",
    "x" * 5000,
    "\udcff",
    "",
    "a/" * 40 + "b",
]


def _backends(tmp_path: Path) -> dict[str, rc.Backend]:
    store: dict[str, bytes] = {}
    return {
        "memory": MemoryBackend(),
        "dir": DirectoryBackend(tmp_path / "root" / "cache"),
        "callback": CallbackBackend(store.get, store.__setitem__),
    }


@pytest.mark.parametrize("name", ["memory", "dir", "callback"])
def test_hostile_keys_are_rejected_or_kept_apart(tmp_path: Path, name: str) -> None:
    backend = _backends(tmp_path)[name]
    before = sorted(p for p in tmp_path.rglob("*"))
    for bad in [*HOSTILE_KEYS, None, b"bytes", 7]:
        try:
            backend.set(bad, b"v")  # type: ignore[arg-type]
        except (InvalidKeyError, TypeError):
            with pytest.raises((InvalidKeyError, TypeError)):
                backend.get(bad)  # type: ignore[arg-type]
            continue
        assert backend.get(bad) == b"v"  # type: ignore[arg-type]
    after = sorted(p for p in tmp_path.rglob("*") if p not in before)
    # Nothing was created outside the backend's own folder.
    assert all(str(p).startswith(str(tmp_path / "root" / "cache")) for p in after)


def test_hostile_keys_on_redis(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from redis_servers import require_redis, running_server

    require_redis("redis-server")
    with running_server() as server:
        backend = rc.open_backend(server.url + "?prefix=hostile:")
        for bad in [*HOSTILE_KEYS, None, b"bytes", 7]:
            try:
                backend.set(bad, b"v")  # type: ignore[arg-type]
            except InvalidKeyError:
                # Found by the campaign: a lone surrogate raised UnicodeEncodeError.
                with pytest.raises(InvalidKeyError):
                    backend.get(bad)  # type: ignore[arg-type]
                continue
            assert backend.get(bad) == b"v"  # type: ignore[arg-type]
        # Binary-safe keys under our prefix: nothing else in the database was touched.
        stored = [k for k in HOSTILE_KEYS if k and k != "\udcff" and len(k) <= MAX_TEXT_KEY]
        assert sorted(backend.keys()) == sorted(stored)
        backend.close()


def test_import_onto_a_full_disk_keeps_the_entries_that_fit(
    small_tmpfs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle whose first entry does not fit: the smaller ones after it are still written
    (the import used to stop at the first failed write, with 0 written)."""
    from runtime_cache.cli import main

    source = rc.Cache(rc.open_backend("memory://?max_size=64MB"))
    source.put(rc.make_key(module_id="big", runtime="r", purpose="p"), os.urandom(2 << 20))
    small = [rc.make_key(module_id=f"s{i}", runtime="r", purpose="p") for i in range(5)]
    for k in small:
        source.put(k, os.urandom(1000))
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    url = f"dir://{small_tmpfs / 'c'}?max_size=none"
    capsys.readouterr()
    assert main(["--cache", url, "import", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "imported 5 of 6 entries" in out and "not written: 1 entry" in out
    target = rc.Cache(rc.open_backend(url))
    assert all(target.get(k) is not None for k in small)
    assert main(["--cache", url, "import", "--json", str(bundle)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["not_written"] == 1 and "full" in report["write_errors"][0]
    assert report["accepted"] == 5 and report["kept_existing"] == 0  # each entry once


def test_a_sparse_gigabyte_at_an_entry_name_is_not_read(tmp_path: Path) -> None:
    """Attacker review, session 37: a member of a shared folder put a 1 GiB sparse file (no
    disk blocks, under the entry limit) at an entry's name; every get read it whole (4.9 s,
    3 GiB of memory) to find it corrupt, and the eviction read it again to compare. A file
    whose head holds no entry is junk now: its first 4 KiB are read, and it is removed."""
    import tracemalloc

    backend = DirectoryBackend(tmp_path, shared=True)
    cache = rc.Cache(backend, secret="s")
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.put(key, b"good")
    path = next(p for p in tmp_path.rglob("*.rce"))
    with open(path, "r+b") as planted:
        planted.truncate(1 << 30)  # its head stays the entry's: a gigabyte after its end
    other = rc.make_key(module_id="n", runtime="r", purpose="p")
    assert cache.put(other, b"good")
    other_path = next(p for p in tmp_path.rglob("*.rce") if p != path)
    other_path.unlink()
    with open(other_path, "wb") as planted:
        planted.truncate(1 << 30)  # all zeros: no entry header at all
    tracemalloc.start()
    try:
        assert cache.get(key) is None and cache.get(other) is None
        assert not backend.delete_if(str(key), b"another size")  # compared by size first
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert backend.junk == 2 and not path.exists() and not other_path.exists()
    assert cache.put(key, b"good") and cache.get(key) == b"good"
    # A batch read (build_all's, the read-ahead's) takes the same rule: three planted at
    # once were held whole together (re-attack review: 4.1 GiB, 11.9 s).
    many = [rc.make_key(module_id=f"b{i}", runtime="r", purpose="p") for i in range(3)]
    for k in many:
        assert cache.put(k, b"good")
    for planted_path in [p for p in tmp_path.rglob("*.rce") if p != path]:
        planted_path.unlink()
        with open(planted_path, "wb") as planted:
            planted.truncate(1 << 30)
    tracemalloc.start()
    try:
        assert set(cache.get_many_views([*many, key])) == {str(key)}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert backend.junk == 2 + 3 and not [p for p in tmp_path.rglob("*.rce") if p != path]


def test_junk_is_removed_only_while_it_is_the_file_that_was_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of the session-37 junk rule: a file with no entry header was removed by name,
    so a good entry another process put in its place between the look and the removal was
    removed too (the compare-and-delete it replaced kept it). And ``get_parts`` of another
    caller's span that answers ``None`` still reads the value whole, and removes nothing."""
    import runtime_cache.backends.bounded_reads as bounded_reads

    backend = DirectoryBackend(tmp_path)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    writer = rc.Cache(DirectoryBackend(tmp_path))
    backend.set(str(key), bytes(64 << 10))  # zeros: no entry header
    real = bounded_reads.read_parts

    def read_then_a_good_entry_lands(*args: Any) -> Any:
        try:
            return real(*args)
        finally:
            assert writer.put(key, b"good")  # os.replace: a new file at the name

    monkeypatch.setattr(bounded_reads, "read_parts", read_then_a_good_entry_lands)
    assert rc.Cache(backend).get(key) is None and backend.junk == 1
    monkeypatch.undo()
    assert writer.get(key) == b"good"  # the entry written since stays
    backend.set("raw/value", bytes(40_000))
    assert backend.get_parts("raw/value", lambda head: None) == (bytes(40_000),)
    assert backend.get("raw/value") == bytes(40_000)  # not junk to a caller of its own


def test_a_header_that_lies_about_an_over_limit_size_is_corrupt_and_removed(
    tmp_path: Path,
) -> None:
    """A planted file whose header claims a 2 GiB value, over the reader's limits, was a
    "rejected" miss: kept, and read whole again on every get (421 MiB RSS each time in the
    attacker review, with a 400 MiB file). Lengths that do not add up to the file are
    corruption: it is read once, and removed; since session 37 dir:// finds that from the
    file's head alone (junk: an entry of another size than its header says)."""
    import struct

    from runtime_cache.codec import Limits

    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend, limits=Limits(max_value_size=1 << 20))
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    header = struct.pack("<4sBBHIQQQ", b"RCE\x01", 1, 1, 0, 10, 2 << 30, 0, 0)
    backend.set(str(key), header + b"\xa5" * (2 << 20))
    assert cache.get(key) is None
    assert cache.stats().rejected == 0 and backend.junk == 1
    assert backend.get(str(key)) is None  # removed: the next get reads nothing
    # An entry whose lengths add up, over this reader's limits, is another reader's: kept.
    big = rc.Cache(backend)
    big.put(key, b"v" * (2 << 20))
    assert cache.get(key) is None and cache.stats().rejected == 1
    assert big.get(key) == b"v" * (2 << 20)


@pytest.mark.parametrize("setting", ["secret", "missing file", "empty file"])
def test_a_bad_secret_with_the_default_cache_turns_caching_off(
    setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The new-user review: with RUNTIME_CACHE unset, a bad secret setting made get_cache()
    raise InvalidSecretError (the app crashed), after a warning blaming the home folder."""
    monkeypatch.delenv("RUNTIME_CACHE", raising=False)
    monkeypatch.delenv("RUNTIME_CACHE_SECRET", raising=False)
    monkeypatch.delenv("RUNTIME_CACHE_SECRET_FILE", raising=False)
    if setting == "secret":
        monkeypatch.setenv("RUNTIME_CACHE_SECRET", "new,old")  # keys of a list too short
    else:
        path = tmp_path / "secret"
        if setting == "empty file":
            path.write_text("")
        monkeypatch.setenv("RUNTIME_CACHE_SECRET_FILE", str(path))
    rc.reset_cache_provider()
    try:
        cache = rc.get_cache()
        assert not cache.enabled
        assert cache.get_or_build(key(), lambda: b"built") == b"built"
        text = " ".join(r.getMessage() for r in caplog.records)
        assert "caching is off" in text and "home" not in text, text
    finally:
        rc.reset_cache_provider()


def test_a_sparse_gigabyte_in_a_shared_tier_is_not_read(tmp_path: Path) -> None:
    """Re-attack review, session 37: under a tiered front (the fleet's layout: a machine's
    own tier over a shared folder) each tier was read whole, so the junk rule of a dir://
    tier never ran: a planted sparse gigabyte cost each get 3 s and 2 GiB."""
    import tracemalloc

    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.backends.tiered import TieredBackend

    shared = DirectoryBackend(tmp_path / "shared", shared=True)
    keys = [rc.make_key(module_id=f"t{i}", runtime="r", purpose="p") for i in range(3)]
    rc.Cache(shared, secret="s").put(keys[0], b"good")
    for k in keys[1:]:
        rc.Cache(shared, secret="s").put(k, b"good")
    for path in (tmp_path / "shared").rglob("*.rce"):
        path.unlink()
        with open(path, "wb") as planted:
            planted.truncate(1 << 30)
    cache = rc.Cache(TieredBackend([MemoryBackend(), shared]), secret="s")
    tracemalloc.start()
    try:
        assert cache.get(keys[0]) is None
        assert cache.get_many_views(keys[1:]) == {}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert shared.junk == 3 and not list((tmp_path / "shared").rglob("*.rce"))
    assert cache.put(keys[0], b"good") and cache.get(keys[0]) == b"good"


@pytest.mark.parametrize("secret", [None, "s3cret"])
@pytest.mark.parametrize("change", [1, -1, 4000])
def test_an_entry_of_another_size_than_its_header_says_is_junk_unread(
    tmp_path: Path, secret: str | None, change: int
) -> None:
    """Session 39's attack review: a sparse file with a forged entry's head, a byte longer
    than the entry (or a signature's length off, or 4,000 bytes on), was read whole, and
    one get peaked at four times the value it claimed (4 GiB for 1 GiB). The head says
    exactly how long the entry is: another size is junk, and no byte past the head is
    read. A newer format's tail is not this reader's to judge: that entry is kept."""
    import tracemalloc

    from runtime_cache.codec import encode_packed

    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend, secret=secret)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    blob = encode_packed(
        str(key), key.packed_parts, bytes(64 << 20), created_at=1e9, secret=b"wrong"
    )
    path = tmp_path / "r" / "p" / str(key)[-32:][:2] / f"{str(key)[-32:]}.rce"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as planted:
        planted.write(blob[:4096])
        planted.truncate(len(blob) + change)  # sparse: 8 KiB on disk
    tracemalloc.start()
    try:
        assert cache.get(key) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert backend.junk == 1 and not path.exists() and cache.stats().misses == 1
    assert cache.put(key, b"good") and cache.get(key) == b"good"
    newer = bytearray(blob[:4096])
    newer[4] = 2  # a later format version, whose framing this reader does not know
    with open(path, "wb") as kept:
        kept.write(newer)
        kept.truncate(len(blob) + 100)
    assert cache.get(key) is None and path.exists() and backend.junk == 1


def test_a_socket_at_an_entrys_name_is_junk(tmp_path: Path) -> None:
    """Session 39's attack review: a Unix socket bound at an entry's name (any member of a
    shared folder's group can) failed every get as a backend error (``ENXIO``), and was
    never removed; strict caches raised. It is junk now, as a FIFO is."""
    import socket

    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend, strict=True)
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.put(key, b"v" * 50_000) and cache.get(key) == b"v" * 50_000
    path = next(tmp_path.rglob("*.rce"))
    path.unlink()
    with socket.socket(socket.AF_UNIX) as planted:
        planted.bind(str(path))
        assert cache.get(key) is None  # the remembered header's read, then the whole one
        assert backend.junk == 1 and not path.exists()
        assert cache.stats().errors == 0 and cache.stats().misses == 1
    assert cache.put(key, b"w" * 50_000) and cache.get(key) == b"w" * 50_000
