"""A lease holder's note that the store did not keep its entry: left, read, expired, and
never taken from what someone without the secret (or a link, or junk) put at its name."""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.backends import dir_notes
from runtime_cache.backends.dir_lease import DirLease
from runtime_cache.backends.dir_notes import ASIDE_SUFFIX, MAX_NOTE_SECONDS, NEW_SUFFIX
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.backends.tiered import TieredBackend
from runtime_cache.errors import BackendError
from runtime_cache.lease import Lease

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

KEY = "fleet/test/00112233445566778899aabbccddeeff"


def _lease(backend: rc.Backend, key: str = KEY) -> Lease:
    lease = backend.lease(key, 30.0)
    assert lease is not None
    return lease


def test_a_lease_with_no_place_for_notes_keeps_none() -> None:
    lease = _lease(MemoryBackend())
    assert lease.acquire()
    lease.note_unstored(60.0)  # nothing to keep it in: no error, no note
    assert not lease.unstored()
    lease.release()


def _noted_for_half_a_second(backend: rc.Backend) -> tuple[Lease, Lease]:
    """A holder that leaves a note good for 0.5 s, and another lease that sees it."""
    holder, other = _lease(backend), _lease(backend)
    assert not other.unstored()
    assert holder.acquire()
    holder.note_unstored(0.5)
    holder.release()
    assert other.unstored()
    return holder, other


def test_directory_note_is_seen_by_other_leases_until_it_runs_out(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    holder, other = _noted_for_half_a_second(backend)
    assert not _lease(backend, "fleet/test/" + "1" * 32).unstored()  # another key's: none
    time.sleep(0.6)
    assert not other.unstored()  # ran out
    assert isinstance(holder, DirLease)
    note = tmp_path / ".locks" / holder.note_name
    assert stat.S_ISREG(note.lstat().st_mode) and note.stat().st_size == 0
    assert backend.vacuum() >= 1  # a note past its time is removed
    assert not note.exists()


def _expired_note(tmp_path: Path) -> tuple[DirectoryBackend, DirLease, Path]:
    """A holder's note past its time, as a vacuum would find it."""
    backend = DirectoryBackend(tmp_path)
    lease = _lease(backend)
    assert isinstance(lease, DirLease) and lease.acquire()
    lease.note_unstored(60.0)
    note = tmp_path / ".locks" / lease.note_name
    os.utime(note, (time.time() - 5, time.time() - 5))
    assert not lease.unstored()
    return backend, lease, note


def _asides(note: Path) -> list[str]:
    """What vacuums left set aside beside ``note``."""
    return [p.name for p in note.parent.iterdir() if p.name.endswith(ASIDE_SUFFIX)]


@pytest.mark.parametrize("planted", ["spent note", "symlink", "fifo"])
def test_a_note_renewed_while_a_vacuum_looks_at_it_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    backend, lease, note = _expired_note(tmp_path)
    if planted != "spent note":  # junk at the name, which the holder's note replaces
        note.unlink()
        if planted == "symlink":
            note.symlink_to(tmp_path / "elsewhere")
        else:
            os.mkfifo(note)
    rename = os.rename

    def renew_first(src: str, dst: str, **kw: int) -> None:
        if str(dst).endswith(ASIDE_SUFFIX) and not lease.unstored():
            lease.note_unstored(60.0)  # the holder's time lands after the vacuum's look
        rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", renew_first)
    backend.vacuum()
    assert lease.unstored() and stat.S_ISREG(note.lstat().st_mode)
    assert _asides(note) == []
    lease.release()


def test_a_note_made_while_a_vacuum_removes_the_old_one_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, lease, note = _expired_note(tmp_path)
    utime = os.utime
    vacuumed: list[int] = []

    def vacuum_first(path: object, *args: object, **kw: object) -> None:
        if isinstance(path, int) and not vacuumed:  # the holder's new note, not yet timed
            vacuumed.append(-1)  # (the vacuum's own touches pass through)
            vacuumed[0] = backend.vacuum()  # removes the old note, keeps the new one
        utime(path, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "utime", vacuum_first)
    lease.note_unstored(60.0)
    assert vacuumed and vacuumed[0] >= 1  # the old note went
    assert lease.unstored() and stat.S_ISREG(note.lstat().st_mode)
    lease.release()


def test_vacuum_puts_back_what_a_killed_vacuum_set_aside_and_removes_leftovers(
    tmp_path: Path,
) -> None:
    backend, lease, note = _expired_note(tmp_path)
    lease.note_unstored(60.0)
    kept = note.with_name(note.name + ".0badc0de" + ASIDE_SUFFIX)
    note.rename(kept)  # a good note set aside by a vacuum killed before it looked again
    spent = note.with_name(note.name + ".1badc0de" + ASIDE_SUFFIX)
    spent.touch()
    os.utime(spent, (time.time() - 5, time.time() - 5))
    other = note.with_name("0" * 40 + ".x" + ASIDE_SUFFIX)  # no note's: junk, however timed
    other.touch()
    os.utime(other, (time.time() + 30, time.time() + 30))
    assert backend.vacuum() >= 2
    assert lease.unstored() and note.stat().st_nlink == 1
    assert not kept.exists() and not spent.exists() and not other.exists()
    lease.release()


def test_a_half_made_note_goes_five_minutes_after_its_holder_last_touched_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, lease, note = _expired_note(tmp_path)
    half = note.with_name(note.name + ".2badc0de" + NEW_SUFFIX)  # a holder killed...
    half.touch()
    os.utime(half, (time.time() + 3000, time.time() + 3000))  # ...after timing it
    assert backend.vacuum() >= 1 and half.exists()  # (the spent note went)
    clock = time.time
    monkeypatch.setattr(dir_notes, "time", SimpleNamespace(time=lambda: clock() + 301))
    assert backend.vacuum() >= 1 and not half.exists()
    lease.release()


@pytest.mark.parametrize("first, then", [(1.0, 60.0), (60.0, 1.0)])
def test_a_note_put_back_leaves_the_later_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: float, then: float
) -> None:
    backend, lease, note = _expired_note(tmp_path)
    rename = os.rename

    def two_writes(src: str, dst: str, **kw: int) -> None:
        if not str(dst).endswith(ASIDE_SUFFIX):
            rename(src, dst, **kw)
            return
        lease.note_unstored(first)  # after the vacuum's look: set aside, to be put back
        rename(src, dst, **kw)
        lease.note_unstored(then)  # at the name meanwhile

    monkeypatch.setattr(os, "rename", two_writes)
    backend.vacuum()
    assert note.stat().st_mtime > time.time() + 30 and lease.unstored()
    assert _asides(note) == []
    lease.release()


def test_a_note_is_renewed_in_place_when_no_file_can_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, lease, note = _expired_note(tmp_path)
    real_open = os.open

    def no_inodes(path: str, flags: int, *args: Any, **kw: Any) -> int:
        if str(path).endswith(NEW_SUFFIX):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", no_inodes)
    lease.note_unstored(60.0)
    assert lease.unstored() and note.stat().st_mtime > time.time() + 30
    lease.release()


def _renew_and_look(root: str, tries: int, lost: Any) -> None:
    backend = DirectoryBackend(root)
    lease = _lease(backend)
    assert isinstance(lease, DirLease) and lease.acquire()
    note = Path(root) / ".locks" / lease.note_name
    for _ in range(tries):
        with contextlib.suppress(FileNotFoundError):
            os.utime(note, (time.time() - 5, time.time() - 5))  # run out
        lease.note_unstored(60.0)
        if not lease.unstored():
            time.sleep(0.1)  # (a vacuum may hold it aside for a moment)
            lost.value += not lease.unstored()
    lease.release()


def test_a_note_renewed_over_and_over_under_a_vacuuming_process_is_never_lost(
    tmp_path: Path,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    lost = ctx.Value("i", 0)
    holder = ctx.Process(target=_renew_and_look, args=(str(tmp_path), 3000, lost))
    holder.start()
    backend = DirectoryBackend(tmp_path)
    while holder.is_alive():
        backend.vacuum()
    holder.join()
    assert holder.exitcode == 0 and lost.value == 0


def test_directory_note_takes_no_link_no_fifo_and_no_far_future(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    lease = _lease(backend)
    assert isinstance(lease, DirLease)
    locks = tmp_path / ".locks"
    locks.mkdir(exist_ok=True)
    note = locks / lease.note_name
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    future = time.time() + 60
    os.utime(victim, (future, future))
    note.symlink_to(victim)  # a link to a file whose time would make a good note
    assert not lease.unstored()
    assert lease.acquire()
    lease.note_unstored(60.0)  # the link is replaced by a note of our own, never followed
    assert victim.read_bytes() == b"keep" and victim.stat().st_mtime == pytest.approx(future)
    assert stat.S_ISREG(note.lstat().st_mode) and lease.unstored()
    note.unlink()
    os.mkfifo(note)  # opening a FIFO to write would block without O_NONBLOCK: replaced
    lease.note_unstored(60.0)
    assert stat.S_ISREG(note.lstat().st_mode) and lease.unstored()
    far = time.time() + MAX_NOTE_SECONDS + 600
    os.utime(note, (far, far))  # a note set for far ahead is no holder's
    assert not lease.unstored()
    assert backend.vacuum() >= 1 and not note.exists()
    lease.release()


def test_directory_note_that_cannot_be_written_is_skipped(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    lease = _lease(backend)
    assert isinstance(lease, DirLease) and lease.acquire()
    folder = tmp_path / ".locks" / lease.note_name
    (folder / "inside").mkdir(parents=True)  # junk this process will not remove for a note
    lease.note_unstored(60.0)  # never raises: the waiters take the lease in turn, as before
    assert not lease.unstored() and (folder / "inside").is_dir()
    lease.release()


def test_tiered_note_is_the_shared_tiers(tmp_path: Path) -> None:
    shared = DirectoryBackend(tmp_path / "shared")
    tiered = TieredBackend([MemoryBackend(), shared])
    lease = _lease(tiered)
    assert lease.acquire()
    lease.note_unstored(60.0)
    lease.release()
    assert _lease(shared).unstored() and _lease(tiered).unstored()
    tiered.close()


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[str]:
    fixture = "redis_server" if request.param == "redis" else "redis_cluster"
    server: RedisProcess | RedisCluster = request.getfixturevalue(fixture)
    yield f"{server.url}?prefix={unique_prefix}"


def test_redis_note_is_seen_until_it_runs_out_and_never_listed(redis_url: str) -> None:
    backend = rc.open_backend(redis_url)
    _, other = _noted_for_half_a_second(backend)
    assert list(backend.keys()) == [] and list(backend.scan()) == []  # not an entry
    time.sleep(0.7)
    assert not other.unstored()
    backend.close()


def test_with_a_secret_only_a_signed_note_counts(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    import redis

    url = f"{redis_server.url}?prefix={unique_prefix}"
    cache = rc.Cache(rc.open_backend(url), secret="fleet-secret")
    lease = _lease(cache.backend)
    assert lease.acquire()
    lease_name = f"{unique_prefix}lease:{KEY}"
    note_name = lease_name.encode() + b"\xffunstored"
    direct = redis.Redis(port=redis_server.port)
    token = direct.get(lease_name)
    assert token  # the holder's signed lease token
    for planted in (b"unstored", b"", b"x" * 4096, token):  # a lease's token is no note's
        direct.set(note_name, planted, px=60_000)
        assert not lease.unstored(), planted[:20]
    lease.note_unstored(60.0)
    assert lease.unstored()
    rotated = rc.Cache(rc.open_backend(url), secret=["new-secret", "fleet-secret"])
    assert _lease(rotated.backend).unstored()  # an older key of the secret verifies it
    stranger = rc.Cache(rc.open_backend(url), secret="another-secret")
    assert not _lease(stranger.backend).unstored()
    lease.release()
    direct.delete(note_name)
    direct.close()
    for opened in (cache, rotated, stranger):
        opened.close()


def test_tiered_lease_knows_whether_the_shared_tier_refused_the_write(
    redis_server: RedisProcess, unique_prefix: str, tmp_path: Path
) -> None:
    shared = rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1000")
    tiered = TieredBackend([MemoryBackend(), shared], queue_bytes=2000)
    lease = _lease(tiered)
    assert lease.acquire()
    tiered.set(KEY, b"x" * 500)
    assert not lease.refused()  # queued, then written
    tiered.set(KEY, b"x" * 1500)  # refused by the shared tier for its size, in the background
    assert lease.refused()
    tiered.set(KEY, b"y" * 10)
    assert not lease.refused()
    tiered.set(KEY, b"x" * 3000)  # dropped: larger than the whole queue, so it never fits
    assert lease.refused()
    lease.release()
    tiered.close()
    # A shared tier that writes at once: its refusal is known when set returns.
    folder = DirectoryBackend(tmp_path / "shared", max_size="64KB")
    tiered = TieredBackend([MemoryBackend(), folder])
    lease = _lease(tiered)
    assert lease.acquire()
    tiered.set(KEY, b"x" * 100_000)  # kept by the memory tier, refused by the folder
    assert lease.refused()
    tiered.set(KEY, b"x" * 100)
    assert not lease.refused()
    lease.release()


def _key(n: int = 0) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{n}", runtime="fleet", purpose="notes", device=None)


def test_get_or_build_notes_a_refusal_for_size_and_nothing_else(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path, max_size="64KB")
    cache = rc.Cache(backend)
    big, failed = _key(1), _key(2)
    assert cache.get_or_build(big, lambda: b"x" * 100_000) == b"x" * 100_000
    assert cache.refused(big) and _lease(backend, str(big)).unstored()
    # A write that fails for another reason (a full disk, a timeout) may land next time.
    real_set = backend.set

    def failing_set(key: str, value: bytes) -> None:
        raise BackendError("disk full")

    backend.set = failing_set  # type: ignore[method-assign]
    assert cache.get_or_build(failed, lambda: b"small") == b"small"
    assert not cache.refused(failed) and not _lease(backend, str(failed)).unstored()
    assert not cache.put(big, b"y" * 10) and not cache.refused(big)  # the latest store's say
    assert not cache.put(big, b"x" * 100_000) and not cache.refused(big)  # failed, not refused
    backend.set = real_set  # type: ignore[method-assign]
    assert not cache.put(big, b"x" * 100_000) and cache.refused(big)
    assert cache.put(big, b"fits") and not cache.refused(big)


def test_directory_note_never_takes_a_hard_link(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    cache = rc.Cache(backend)
    cache.put(_key(3), b"an entry")
    entry = next(p for p in tmp_path.rglob("*") if p.is_file() and ".locks" not in p.parts)
    lease = _lease(backend)
    assert isinstance(lease, DirLease)
    (tmp_path / ".locks").mkdir(exist_ok=True)
    note = tmp_path / ".locks" / lease.note_name
    os.link(entry, note)  # an entry hard-linked at the note's name
    future = time.time() + 60
    os.utime(entry, (future, future))
    assert not lease.unstored()  # two links: no note
    assert lease.acquire()
    lease.note_unstored(60.0)  # a fresh note of its own; the entry's time stays
    assert entry.stat().st_mtime == pytest.approx(future) and entry.stat().st_nlink == 1
    assert lease.unstored() and note.stat().st_nlink == 1
    lease.release()


def test_redis_note_that_never_expires_or_is_no_string_is_no_note(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    import redis

    backend = rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}")
    lease = _lease(backend)
    note_name = f"{unique_prefix}lease:{KEY}".encode() + b"\xffunstored"
    direct = redis.Redis(port=redis_server.port)
    direct.set(note_name, b"unstored")  # no expiry: planted, not a holder's
    assert not lease.unstored()
    direct.delete(note_name)
    direct.rpush(note_name, *range(1000))  # another type at the name
    assert not lease.unstored()
    assert lease.acquire()
    lease.note_unstored(60.0)  # replaces it
    assert lease.unstored() and direct.type(note_name) == b"string"
    assert 0 < direct.pttl(note_name) <= 60_000
    lease.release()
    direct.delete(note_name)
    direct.close()
    backend.close()


def test_a_tiered_holder_waits_for_its_queue_once_per_holding() -> None:
    """Over a slow shared tier, asking whether the write was refused waited up to ttl for
    the queue, and the release waited up to ttl again: the lease was kept up to 2 x ttl.
    The two waits share ttl now; a new holding has its own."""
    from runtime_cache.backends.write_behind import FlushingLease

    waits: list[float] = []

    def slow_flush(timeout: float) -> bool:  # a queue that never drains in time
        waits.append(timeout)
        time.sleep(timeout)
        return False

    lease = FlushingLease(MemoryBackend().lease(KEY, 0.3), slow_flush)
    for _ in range(2):
        assert lease.acquire()
        assert not lease.refused()
        lease.release()
    assert waits[0] == waits[2] == pytest.approx(0.3)
    assert waits[1] < 0.1 and waits[3] < 0.1
