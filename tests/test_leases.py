"""Build leases of each backend: taken once, renewed, released, expired, broken when stale."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import runtime_cache as rc
from conftest import holding
from runtime_cache.backends.callback import CallbackBackend
from runtime_cache.backends.dir_lease import DirLease
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.backends.tiered import TieredBackend

pytest_plugins = ["redis_servers"]

KEY = "fleet/test/00112233445566778899aabbccddeeff"

HOLDER = textwrap.dedent(
    """
    import sys, time
    import runtime_cache as rc
    lease = rc.open_backend(sys.argv[1]).lease(sys.argv[2], float(sys.argv[3]))
    assert lease is not None and lease.acquire()
    print("held", flush=True)
    time.sleep(60)
    """
)


@contextmanager
def hung_holder(url: str, ttl: float, cwd: Path, key: str = KEY) -> Iterator[None]:
    """A process that takes the lease on ``key``, then hangs (SIGSTOP): it stops renewing."""
    with holding([sys.executable, "-c", HOLDER, url, key, str(ttl)], cwd) as proc:
        proc.send_signal(signal.SIGSTOP)
        yield


def _exclusive(backend: rc.Backend) -> None:
    first, second = backend.lease(KEY, 5.0), backend.lease(KEY, 5.0)
    assert first is not None and second is not None
    assert first.acquire() and first.held
    assert not second.acquire() and not second.held
    assert first.renew()
    first.release()
    assert not first.held
    with second:
        assert second.acquire()
    assert not second.held
    assert first.acquire()  # free again after the context manager released it
    first.release()


def test_memory_lease_is_local() -> None:
    backend = MemoryBackend()
    _exclusive(backend)
    lease = backend.lease(KEY, 1.0)
    assert lease is not None and lease.local


def test_directory_lease(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    _exclusive(backend)
    assert list(backend.keys()) == []  # lock files are never keys
    with pytest.raises(rc.errors.InvalidKeyError):
        backend.lease("../escape", 1.0)


def test_directory_lease_of_a_hung_holder_goes_stale(tmp_path: Path) -> None:
    # A ttl of 1 s, not less: under a loaded CI box a 0.3 s ttl ran out between the
    # holder's last touch and the first look (the test failed once that way).
    with hung_holder(f"dir://{tmp_path}", 1.0, tmp_path):
        backend = DirectoryBackend(tmp_path)  # kept: its root descriptor closes with it
        root = backend.root_fd
        other = DirLease(root, KEY, 1.0)
        assert not other.acquire()  # held, and touched just now
        time.sleep(2.2)
        assert other.acquire()  # the untouched lock file was stale: broken and taken
        assert other.held and other.renew()
        third = DirLease(root, KEY, 1.0)
        assert not third.acquire()
        other.release()
        assert third.acquire()
        third.release()


def test_directory_lease_refuses_a_symlink(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)  # kept: its root descriptor closes with it
    lease = DirLease(backend.root_fd, KEY, 1.0)
    os.makedirs(tmp_path / ".locks")
    os.symlink(tmp_path / "elsewhere", tmp_path / lease.path)
    with pytest.raises(rc.errors.BackendError):
        lease.acquire()
    assert not (tmp_path / "elsewhere").exists()


@contextmanager
def _plant(kind: str, at: Path, elsewhere: Path) -> Iterator[None]:
    """A ``kind`` of thing at ``at`` while the block runs (a symbolic link to ``elsewhere``)."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            here = os.getcwd()
            os.chdir(at.parent)  # (a socket's path holds at most 107 bytes)
            try:
                sock.bind(at.name)
            finally:
                os.chdir(here)
            yield
        return
    if kind == "folder":
        at.mkdir()
        (at / "theirs").write_bytes(b"kept")
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.symlink_to(elsewhere)
    yield


@pytest.mark.parametrize("kind", ["socket", "folder", "symlink", "fifo"])
def test_a_non_file_at_a_keys_lock_name_means_no_lease_never_an_error(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Session 42's closing note: a socket or a folder planted at a key's lock name made
    taking the lease raise ``BackendError`` (said as a store that fails, at WARNING, once a
    process: a later real failure went unsaid). It is bad input: that key has no lease
    (``lease()`` answers ``None``, and the caller builds at once), counted as junk, said
    once, and the thing is left as it is, never followed. A FIFO there is removed and a
    lock made, as before."""
    root, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    backend = DirectoryBackend(root)
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="fleet", purpose="test", device=None)
    lock = root / DirLease(-1, str(key), 1.0).path
    with _plant(kind, lock, elsewhere):
        caplog.set_level(logging.DEBUG, logger="runtime_cache")
        assert cache.get_or_build(key, lambda: b"built") == b"built"
        if kind == "fifo":
            assert cache.stats().leases_won == 1 and not lock.exists()  # (released)
            return
        assert cache.stats().leases_won == 0 and cache.get(key) == b"built"
        assert backend.lease(str(key), 1.0) is None  # again: no lease, no error
        assert backend.junk == 2
        said = [r for r in caplog.records if "lock" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, said
        assert "cannot take a build lease" not in caplog.text
        assert not elsewhere.exists()
        if kind == "folder":
            assert (lock / "theirs").read_bytes() == b"kept"
        else:
            assert stat.S_ISSOCK(lock.lstat().st_mode) or lock.is_symlink()


def test_junk_at_one_keys_lock_leaves_the_others_shared(tmp_path: Path) -> None:
    """Re-attack of session 42: the OpenCL module asked its first program's key alone
    whether the store shares builds; junk at that key's lock name (now no lease) turned
    sharing off for every program of the module."""
    from runtime_cache.opencl.sharing import shares_builds

    root = tmp_path / "cache"
    cache = rc.Cache(DirectoryBackend(root))
    keys = [
        str(rc.make_key(module_id=f"m{i}", runtime="fleet", purpose="t", device=None))
        for i in range(3)
    ]
    lock = root / DirLease(-1, keys[0], 1.0).path
    with _plant("socket", lock, tmp_path / "elsewhere"):
        assert cache.backend.lease(keys[0], 1.0) is None
        assert shares_builds(cache, keys)  # the second key's lease answers
        assert not shares_builds(cache, keys[:1])
    assert not shares_builds(rc.Cache(rc.open_backend("memory://")), keys)  # local leases


def test_directory_lease_never_writes_through_a_planted_locks_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    (root / ".locks").symlink_to(victim)
    lease = backend.lease(KEY, 1.0)
    assert lease is not None and lease.acquire()  # the link removed, never followed
    lease.release()
    assert list(victim.iterdir()) == [] and not (root / ".locks").is_symlink()
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="fleet", purpose="test", device=None)
    assert cache.get_or_build(key, lambda: b"built") == b"built"
    assert list(victim.iterdir()) == []


def test_redis_lease_expires_unless_renewed(redis_server: object, tmp_path: Path) -> None:
    url = f"{redis_server.url}?prefix=lease-{tmp_path.name}:"  # type: ignore[attr-defined]
    backend = rc.open_backend(url)
    _exclusive(backend)
    holder = backend.lease(KEY, 0.3)
    assert holder is not None and holder.acquire()
    time.sleep(0.7)  # the renewal thread keeps it
    other = backend.lease(KEY, 0.3)
    assert other is not None and not other.acquire()
    holder.release()
    with hung_holder(url, 0.3, tmp_path):
        assert not other.acquire()
        time.sleep(0.6)
        assert other.acquire()  # the hung holder stopped renewing: its lease expired
    assert other.held and other.renew()
    other.release()
    assert list(backend.keys()) == []  # leases live outside the entry prefix
    backend.close()


def test_tiered_lease_is_the_shared_tiers(tmp_path: Path) -> None:
    shared = DirectoryBackend(tmp_path)
    tiered = TieredBackend([MemoryBackend(), shared])
    lease = tiered.lease(KEY, 5.0)
    assert lease is not None and lease.acquire()
    direct = shared.lease(KEY, 5.0)
    assert direct is not None and not direct.acquire()
    lease.release()
    assert direct.acquire()
    direct.release()
    assert TieredBackend([shared, MemoryBackend()]).lease(KEY, 1.0) is not None


def test_callback_backend_has_no_lease() -> None:
    backend = CallbackBackend(lambda k: None, lambda k, v: None)
    assert backend.lease(KEY, 1.0) is None


def test_memory_cache_takes_no_lease() -> None:
    cache = rc.Cache(MemoryBackend())
    key = rc.make_key(module_id="m", runtime="fleet", purpose="test", device=None)
    assert cache.get_or_build(key, lambda: b"v") == b"v"
    stats = cache.stats()
    assert (stats.builds, stats.leases_won, stats.lease_waits) == (1, 0, 0)


def test_bad_ttl_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        DirectoryBackend(tmp_path).lease(KEY, 0)


def test_waiter_builds_after_the_deadline_of_a_hung_holder(tmp_path: Path) -> None:
    from runtime_cache.fleet import LeasePolicy

    url = f"dir://{tmp_path}"
    key = rc.make_key(module_id="m", runtime="fleet", purpose="test", device=None)
    cache = rc.Cache(rc.open_backend(url), secret="test-secret")
    cache.fleet.policy = LeasePolicy(ttl=60.0, default_expected=0.5)  # deadline 3.5 s
    with hung_holder(url, 60.0, tmp_path, str(key)):
        started = time.monotonic()
        assert cache.get_or_build(key, lambda: b"built here") == b"built here"
        took = time.monotonic() - started
    stats = cache.stats()
    assert (stats.lease_waits, stats.takeovers, stats.builds) == (1, 1, 1)
    assert 3.5 <= took < 3.5 + 2.0
    assert 3.5 <= stats.wait_seconds < took + 0.01


def test_get_or_build_does_not_wait_on_a_dead_store(redis_process: object) -> None:
    url = f"{redis_process.url}?prefix=dead:"  # type: ignore[attr-defined]
    cache = rc.Cache(rc.open_backend(url), secret="test-secret")
    redis_process.kill()  # type: ignore[attr-defined]
    key = rc.make_key(module_id="m", runtime="fleet", purpose="test", device=None)
    started = time.monotonic()
    assert cache.get_or_build(key, lambda: b"v") == b"v"
    assert time.monotonic() - started < 5.0
    assert cache.stats().lease_waits == 0


def test_vacuum_removes_lease_files_left_unheld(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    held = DirLease(backend.root_fd, KEY, 30.0)
    assert held.acquire()
    left = DirLease(backend.root_fd, "opencl/program-binary/" + "5" * 32, 30.0)
    assert left.acquire()
    assert left._fd is not None
    os.close(left._fd)  # as if its holder were killed: the file stays, locked by no one
    left._fd = None
    locks = tmp_path / ".locks"
    old = time.time() - 3600
    for path in locks.iterdir():
        os.utime(path, (old, old))
    assert backend.vacuum() >= 1
    # The held one stays (and the folder's lock for unlinking, a fixture of it).
    assert sorted(p.name for p in locks.iterdir()) == [".unlinking", held.name]
    held.release()
    assert [p.name for p in locks.iterdir()] == [".unlinking"]


def test_a_stale_break_never_unlinks_the_file_another_taker_just_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale break looked at the lock file's name, then unlinked it: another taker could
    break it and lock a fresh file at the name in between, and the unlink removed that live
    holder's file, so both held the lease. Here taker A is paused between its look and its
    unlink while taker B breaks; every unlink of a lock file now holds the folder's
    ``.unlinking`` lock around its look, so B waits (and gives up), and one holds it."""
    import threading

    with hung_holder(f"dir://{tmp_path}", 1.0, tmp_path):
        time.sleep(2.2)  # the hung holder's lock file is stale now
        backend = DirectoryBackend(tmp_path)
        a, b = DirLease(backend.root_fd, KEY, 1.0), DirLease(backend.root_fd, KEY, 1.0)
        looked, b_done = threading.Event(), threading.Event()
        real_stat = os.stat

        def paused_stat(*args: object, **kwargs: object) -> os.stat_result:
            found = real_stat(*args, **kwargs)  # type: ignore[arg-type]
            if threading.current_thread().name == "A" and args[0] == a.name and not looked.is_set():
                looked.set()  # A has looked at the name: B breaks now
                b_done.wait(5)
            return found

        monkeypatch.setattr(os, "stat", paused_stat)
        won: list[bool] = []
        taker = threading.Thread(target=lambda: won.append(a.acquire()), name="A")
        taker.start()
        assert looked.wait(10)
        b_won = b.acquire()
        b_done.set()
        taker.join(10)
        monkeypatch.setattr(os, "stat", real_stat)
        holders = [lease for lease, took in ((a, won[0]), (b, b_won)) if took and lease.renew()]
        assert won[0] + b_won == 1 and len(holders) == 1, (won, b_won)
        for lease in (a, b):
            lease.release()


def test_the_unlinking_lock_is_shared_and_a_planted_one_stops_no_break(tmp_path: Path) -> None:
    """The fifth review: ``.unlinking`` was made 0600, so in a ``shared=1`` cache the other
    members could not open it and never broke a hung member's stale lease; a folder planted
    at the name stopped every break too. It is made with the cache's modes, and where it
    cannot be had, the look and the unlink go unlocked, as before it."""
    shared = rc.open_backend(f"dir://{tmp_path / 'shared'}?shared=1")
    lease = shared.lease(KEY, 5.0)
    assert lease is not None and lease.acquire()
    lease.release()
    mode = (tmp_path / "shared" / ".locks" / ".unlinking").stat().st_mode
    assert mode & 0o060 == 0o060  # the group reads and writes it
    (tmp_path / "plain" / ".locks").mkdir(parents=True)
    (tmp_path / "plain" / ".locks" / ".unlinking").mkdir()  # planted: not a file
    with hung_holder(f"dir://{tmp_path / 'plain'}", 1.0, tmp_path):
        backend = DirectoryBackend(tmp_path / "plain")
        other = DirLease(backend.root_fd, KEY, 1.0)
        time.sleep(2.2)
        assert other.acquire()  # the stale lock was broken all the same
        other.release()
