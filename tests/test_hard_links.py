"""Hard links planted at the fixed names of a ``dir://...?shared=1`` folder are never
written through.

The attack review of session 41: a member of the folder's group removed ``.evict.lock``,
``.locks/.unlinking``, a key's ``.locks/<digest>.lock`` and ``.hits`` and hard-linked a
private 0600 file of the victim at each. The victim's ordinary use (puts over the cap, a
``get_or_build``, hits) made those files 0664 (the group's mode, so the member read
them), wrote a lease token over one and appended hit lines to another. ``O_NOFOLLOW``
stops a symbolic link, not a hard link: a hard link *is* the file. Here this process
makes the links itself, standing in for the member (a member may link a file of another
user where ``fs.protected_hardlinks`` is 0, on macOS, on NFS); the victim's file lies
outside the cache, is this process's own (root's, run as root) and has mode 0600.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.dir_lease import LOCKS, UNLINKING, DirLease
from runtime_cache.backends.dir_root import Modes
from runtime_cache.backends.directory import DirectoryBackend

SECRET = "team-secret-0123456789abcdef"
PRIVATE = b"TOPSECRET private key material\n"


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="links", purpose="test", device=None)


def _cache(root: Path, max_size: int | None = None, hits_batch: int = 64) -> rc.Cache:
    backend = DirectoryBackend(root, shared=True, max_size=max_size, hits_batch=hits_batch)
    return rc.Cache(backend, secret=SECRET)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A private file of this process's user, outside the cache (same file system)."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    path = folder / "secret.txt"
    path.write_bytes(PRIVATE)
    path.chmod(0o600)
    old = 1_000_000_000  # a time of its own: a touch through a link would change it
    os.utime(path, (old, old))
    return path


def _plant(victim: Path, at: Path) -> None:
    """The member's move: whatever is at ``at`` goes, a hard link to ``victim`` comes."""
    at.parent.mkdir(parents=True, exist_ok=True)
    if at.exists() or at.is_symlink():
        at.unlink()
    os.link(victim, at)


def _use(cache: rc.Cache, count: int, size: int) -> DirectoryBackend:
    """Put and get ``count`` entries of ``size`` bytes, then write the hits down; the
    cache's folder backend."""
    for i in range(count):
        assert cache.put(_key(i), b"x" * size)
        assert cache.get(_key(i)) == b"x" * size
    backend = cache.backend
    assert isinstance(backend, DirectoryBackend)
    backend.flush_hits()
    return backend


def _untouched(victim: Path) -> None:
    st = victim.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert victim.read_bytes() == PRIVATE and st.st_size == len(PRIVATE)
    assert st.st_mtime == 1_000_000_000


def test_a_hard_link_at_the_eviction_lock_is_broken_not_written(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "cache"
    cache = _cache(root, max_size=64 * 1024)
    _plant(victim, root / ".evict.lock")
    for i in range(40):  # far over the cap: each turn takes the eviction lock
        assert cache.put(_key(i), b"x" * 3000)
    _untouched(victim)
    backend = cache.backend
    assert isinstance(backend, DirectoryBackend)
    assert backend.total_size() <= 64 * 1024  # eviction still ran, under a lock of its own
    lock = (root / ".evict.lock").stat()
    assert lock.st_ino != victim.stat().st_ino and lock.st_nlink == 1
    assert cache.get(_key(39)) == b"x" * 3000


def test_a_hard_link_at_a_keys_lock_is_replaced_and_the_lease_taken(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "cache"
    cache = _cache(root)
    name = DirLease(-1, str(_key(1)), 30.0).name
    _plant(victim, root / LOCKS / name)
    assert cache.get_or_build(_key(1), lambda: b"built") == b"built"
    _untouched(victim)  # no token written over it, not cut, not chmod-ed
    assert cache.stats().leases_won == 1  # the lease worked, on a fresh lock file
    assert not (root / LOCKS / name).exists()  # released: removed, as every lock is
    assert victim.stat().st_nlink == 1  # the link is gone from the cache
    assert cache.get(_key(1)) == b"built"


def test_a_hard_link_at_the_unlinking_lock_is_replaced_not_written(
    tmp_path: Path, victim: Path
) -> None:
    root = tmp_path / "cache"
    cache = _cache(root)
    assert cache.get_or_build(_key(0), lambda: b"first") == b"first"  # the locks folder made
    _plant(victim, root / LOCKS / UNLINKING)
    assert cache.get_or_build(_key(2), lambda: b"second") == b"second"  # its release unlinks
    _untouched(victim)
    unlinking = (root / LOCKS / UNLINKING).stat()
    assert unlinking.st_ino != victim.stat().st_ino and unlinking.st_nlink == 1
    assert not (root / LOCKS / DirLease(-1, str(_key(2)), 30.0).name).exists()
    assert cache.stats().leases_won == 2


def test_a_hard_link_at_the_hits_journal_is_set_aside_not_appended_to(
    tmp_path: Path, victim: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    cache = _cache(root, hits_batch=1)
    backend = cache.backend
    assert isinstance(backend, DirectoryBackend)
    assert cache.put(_key(0), b"v")
    _plant(victim, root / ".hits")
    for _ in range(3):
        assert cache.get(_key(0)) == b"v"
    backend.flush_hits()
    _untouched(victim)
    assert "hard link" in caplog.text
    journal = root / ".hits"  # set aside, and a fresh journal counts again
    assert journal.stat().st_ino != victim.stat().st_ino and journal.stat().st_nlink == 1
    assert str(_key(0)).encode() in journal.read_bytes()


def test_a_hard_link_at_the_vacuum_marker_is_not_touched(tmp_path: Path, victim: Path) -> None:
    root = tmp_path / "cache"
    cache = _cache(root)
    backend = cache.backend
    assert isinstance(backend, DirectoryBackend)
    _plant(victim, root / ".vacuumed")
    assert backend.vacuum() >= 0
    _untouched(victim)  # its time and mode as they were
    DirectoryBackend(root, shared=True).close()  # an open vacuums when the marker is junk
    _untouched(victim)
    assert cache.put(_key(0), b"v") and cache.get(_key(0)) == b"v"


@pytest.mark.parametrize("name", [".evict.lock", ".hits", ".vacuumed"])
def test_a_file_of_one_link_is_used_where_it_is_and_given_the_groups_mode(
    tmp_path: Path, name: str
) -> None:
    """What was there before the fix goes on: a file of ours at a fixed name with one link
    (left by an earlier process, with a mode of its own) is used in place and given the
    group's mode."""
    root = tmp_path / "cache"
    cache = _cache(root, max_size=64 * 1024, hits_batch=1)
    (root / name).write_bytes(b"")
    (root / name).chmod(0o600)
    inode = (root / name).stat().st_ino
    assert _use(cache, 30, 3000).vacuum() >= 0
    assert (root / name).stat().st_ino == inode  # not replaced
    assert stat.S_IMODE((root / name).stat().st_mode) == Modes.for_cache(True).file_chmod
    assert (root / name).stat().st_size > 0 or name != ".hits"  # the hits counted in it


def test_a_fifo_at_a_keys_lock_is_replaced_and_the_lease_taken(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cache = _cache(root)
    lock = root / LOCKS / DirLease(-1, str(_key(1)), 30.0).name
    lock.parent.mkdir()
    os.mkfifo(lock, 0o660)
    assert cache.get_or_build(_key(1), lambda: b"built") == b"built"
    assert cache.stats().leases_won == 1 and not lock.exists()


def test_a_lock_link_that_cannot_be_removed_builds_without_a_lease(
    tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime_cache.backends import dir_lease

    monkeypatch.setattr(dir_lease, "unlink_if_same", lambda *args: False)  # (another's folder)
    root = tmp_path / "cache"
    cache = _cache(root)
    _plant(victim, root / LOCKS / DirLease(-1, str(_key(1)), 30.0).name)
    assert cache.get_or_build(_key(1), lambda: b"built") == b"built"  # no lease, no error
    _untouched(victim)
    assert cache.stats().leases_won == 0 and cache.get(_key(1)) == b"built"


def test_a_live_lock_given_a_second_name_is_not_taken_twice(tmp_path: Path) -> None:
    """The re-attack review of session 41: a hard-link backup of a shared folder (``cp
    -al``) while a lease was held gave its lock file a second name; the next taker took it
    for junk, removed it and locked a fresh file beside the live holder (two holders).
    A lock that is held is left: the taker goes without a lease. The same for the locks
    folder's own lock and the eviction lock."""
    from runtime_cache.backends.eviction import LockStats, eviction_turn
    from runtime_cache.errors import BackendError

    root = tmp_path / "cache"
    first, second = DirectoryBackend(root, shared=True), DirectoryBackend(root, shared=True)
    holder = first.lease(str(_key(1)), 30.0)
    assert holder is not None and holder.acquire()
    lock = root / LOCKS / DirLease(-1, str(_key(1)), 30.0).name
    os.link(lock, tmp_path / "backup.lock")
    taker = second.lease(str(_key(1)), 30.0)
    assert taker is not None
    with pytest.raises(BackendError, match="not a lock file"):
        taker.acquire()
    assert holder.held and lock.stat().st_ino == (tmp_path / "backup.lock").stat().st_ino
    holder.release()
    # The eviction lock, held by an evictor, and given a second name.
    evict = root / ".evict.lock"
    with eviction_turn(first.root_fd, ".evict.lock") as beat:
        assert beat is not None
        os.link(evict, tmp_path / "backup.evict")
        stats = LockStats()
        with eviction_turn(second.root_fd, ".evict.lock", stats=stats) as other:
            assert other is None  # not taken beside the live evictor
        assert (
            stats.broken == 0 and evict.stat().st_ino == (tmp_path / "backup.evict").stat().st_ino
        )


def test_a_planted_link_left_as_its_files_only_name_is_not_chmod_ed(
    tmp_path: Path, victim: Path
) -> None:
    """The re-attack review of session 41: after the victim replaced its file by a rename
    (an editor, a token refresher), the link planted at ``.hits`` was the old file's only
    name: one link, the victim's uid, so it was taken as the cache's own and given the
    group's mode, and the member read the old secret. A file is chmod-ed only when made
    now, or when it has the shared folder's group."""
    root = tmp_path / "cache"
    cache = _cache(root, hits_batch=1)
    os.chown(root, -1, 12345)  # the shared group's (files made in it take it)
    _plant(victim, root / ".hits")
    victim.unlink()  # its owner's rename: the planted name is all that is left of it
    _use(cache, 3, 100)
    assert stat.S_IMODE((root / ".hits").stat().st_mode) == 0o600


def test_a_held_lock_with_a_second_name_untouched_past_its_time_is_broken(
    tmp_path: Path,
) -> None:
    """The last review of session 41: a lock with a second name was left whenever held, so
    a member who linked a file of its own there and held it, untouched, denied the lease
    (and the eviction turn) for good. Held but stale, it is broken, as a lock of one name
    is."""
    import fcntl

    from runtime_cache.backends.eviction import LockStats, eviction_turn

    root = tmp_path / "cache"
    backend = DirectoryBackend(root, shared=True)
    lock = root / LOCKS / DirLease(-1, str(_key(1)), 30.0).name
    evict = root / ".evict.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    holds = []
    for path in (lock, evict):
        path.write_bytes(b"")
        os.link(path, tmp_path / f"{path.name}.second")
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held by a holder that never touches it
        holds.append(fd)
        old = time.time() - 3600
        os.utime(path, (old, old))
    try:
        taker = backend.lease(str(_key(1)), 30.0)
        assert taker is not None and taker.acquire()  # broken: stale, though held
        taker.release()
        stats = LockStats()
        with eviction_turn(backend.root_fd, ".evict.lock", stats=stats) as turn:
            assert turn is not None and stats.broken == 1
    finally:
        for fd in holds:
            os.close(fd)
