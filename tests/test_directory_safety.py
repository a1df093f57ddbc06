"""DirectoryBackend opens nothing it did not mean to: junk at entry names, links, caps, URLs.

One user here; tests/test_hostile_group.py tries the same with two real users.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import system_users

import runtime_cache as rc
from runtime_cache.backends import dir_fs
from runtime_cache.backends.dir_tree import rel_path
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.errors import BackendError, InvalidURLError

KEY = "opencl/program-binary/3f2a" + "0" * 28


def key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="safe", purpose="test")


def path_of(root: Path, k: rc.CacheKey | str) -> Path:
    return root / rel_path(str(k))


def timed(fn, limit: float = 5.0):  # type: ignore[no-untyped-def]
    """Call ``fn`` and fail unless it returns within ``limit`` seconds."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    worker.start()
    worker.join(limit)
    assert not worker.is_alive(), f"{fn} did not return within {limit} s"
    return result[0]


@pytest.fixture(params=["openat2", "walk"])
def resolver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test with openat2 and with the folder-by-folder fallback."""
    if request.param == "walk":
        monkeypatch.setattr(dir_fs, "_openat2", None)
    elif dir_fs._openat2 is None:
        pytest.skip("this kernel has no openat2")
    return str(request.param)


# ------------------------------------------------------------------ junk at entry names
@pytest.mark.parametrize("kind", ["fifo", "folder", "sparse", "link"])
def test_junk_at_an_entry_name_is_a_counted_miss_and_removed(
    tmp_path: Path, kind: str, resolver: str, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    cache = rc.Cache(backend)
    assert cache.put(key(0), b"good")
    target = path_of(root, key(0))
    target.unlink()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
        (target / "inner").write_bytes(b"x")
    elif kind == "sparse":
        with open(target, "wb") as handle:
            handle.truncate(1 << 40)  # 1 TiB, no blocks
    else:
        target.symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert timed(lambda: cache.get(key(0))) is None
    assert backend.junk == 1
    assert not os.path.lexists(target)  # removed: the key is storable again
    assert str(target) in caplog.text and "carrying on without" not in caplog.text
    assert cache.stats().errors == 0
    assert cache.put(key(0), b"again") and cache.get(key(0)) == b"again"
    assert victim.read_bytes() == b"precious"


def test_junk_that_may_not_be_removed_is_a_miss_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-attack of the tiers' copy up: a member's sparse file in his own sticky folder
    at an entry's name; its removal (a rename aside) failed with EPERM, and the raw
    PermissionError escaped from ``get``, ``peek`` and ``head``."""
    from runtime_cache.backends import dir_write

    def refused(*args: object) -> bool:
        raise PermissionError(1, "Operation not permitted")

    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    assert rc.Cache(backend).put(key(0), b"good")
    target = path_of(root, key(0))
    with open(target, "wb") as handle:
        handle.truncate(1 << 40)
    monkeypatch.setattr(dir_write, "delete_if_same", refused)
    for read in (backend.get, backend.peek, lambda k: backend.head(k, 64)):
        assert read(str(key(0))) is None
    assert backend.junk >= 3 and target.exists()


def test_head_and_listing_skip_junk(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"x" * 10)
    target = path_of(tmp_path, KEY)
    target.unlink()
    os.mkfifo(target)
    assert list(backend.keys()) == [] and list(backend.scan()) == []
    assert timed(lambda: backend.head(KEY, 4)) is None
    assert backend.junk == 1 and not os.path.lexists(target)


def test_link_in_place_of_a_folder_cannot_redirect_reads_or_writes(
    tmp_path: Path, resolver: str
) -> None:
    root = tmp_path / "cache"
    cache = rc.Cache(DirectoryBackend(root))
    assert cache.put(key(0), b"first")
    folder = root / "safe"
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)  # renamed out of the cache
    folder.symlink_to(elsewhere)  # and a link in its place
    before = sorted(p.name for p in elsewhere.rglob("*"))
    assert cache.get(key(0)) is None
    assert cache.put(key(1), b"second") and cache.get(key(1)) == b"second"
    assert sorted(p.name for p in elsewhere.rglob("*")) == before
    assert folder.is_dir() and not folder.is_symlink()


def test_root_given_through_a_link_stays_the_folder_it_named(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(mode=0o700)
    second.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(first)
    backend = DirectoryBackend(link)
    link.unlink()
    link.symlink_to(second)  # repointed after open
    backend.set(KEY, b"v")
    assert path_of(first, KEY).is_file() and not list(second.rglob("*.rce"))
    assert backend.get(KEY) == b"v"


def test_planted_links_at_our_own_names_are_never_written_through(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    backend = DirectoryBackend(root, max_size=20_000)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    for name in (".hits", ".vacuumed", ".evict.lock", f".tmp-hits-{os.getpid()}"):
        (root / name).unlink(missing_ok=True)
        (root / name).symlink_to(victim)
    for i in range(20):
        backend.set(f"t/p/k{i:04d}", os.urandom(3000))
        backend.get(f"t/p/k{i:04d}")
    backend.flush_hits()
    timed(backend.enforce_size)
    timed(backend.vacuum)
    assert victim.read_bytes() == b"precious"


# ------------------------------------------------------------------ caps count disk
def test_cap_counts_blocks_and_files(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path, max_size=1_000_000, max_files=50)
    for i in range(80):
        backend.set(f"t/p/k{i:04d}", b"x")  # one byte, a block each
    timed(backend.enforce_size)
    assert len(list(backend.keys())) <= 50
    sparse = path_of(tmp_path, "t/p/zz00")
    sparse.parent.mkdir(parents=True, exist_ok=True)
    with open(sparse, "wb") as handle:
        handle.truncate(1 << 40)
    assert backend.total_size() < 1_000_000  # walking removes it as junk; never counted
    assert not sparse.exists()


def test_eviction_lock_held_elsewhere_never_blocks_a_writer(tmp_path: Path) -> None:
    import fcntl

    backend = DirectoryBackend(tmp_path, max_size=50_000)
    backend.lock_wait = 0.3
    fd = os.open(tmp_path / ".evict.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: a foreign holder
    try:
        start = time.monotonic()
        for i in range(30):
            backend.set(f"t/p/k{i:04d}", os.urandom(8000))
        assert time.monotonic() - start < 30 * 0.3 + 5
        assert backend.lock_stats.skipped >= 1
        os.utime(fd, (time.time() - 3600,) * 2)  # the holder stops touching it: stale
        assert timed(backend.enforce_size) > 0 and backend.lock_stats.broken == 1
        assert backend.total_size() <= 50_000
    finally:
        os.close(fd)


# ------------------------------------------------------------------ compare-and-delete
def test_delete_if_deletes_only_the_expected_bytes(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"old")
    assert backend.delete_if(KEY, b"other") is False and backend.get(KEY) == b"old"
    assert backend.delete_if(KEY, b"old") is True and backend.get(KEY) is None
    assert backend.delete_if(KEY, b"old") is False
    assert not [p for p in tmp_path.rglob(".del-*")]


def test_delete_if_never_removes_a_racing_newer_write(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path, max_size=None)
    for round_no in range(150):
        backend.set(KEY, b"A")
        newer = f"B{round_no}".encode()
        writer = threading.Thread(target=backend.set, args=(KEY, newer))
        writer.start()
        backend.delete_if(KEY, b"A")
        writer.join()
        assert backend.get(KEY) == newer  # the newer write always survives
    assert not [p for p in tmp_path.rglob(".del-*")]


# ------------------------------------------------------------------ shared=1 modes
def test_shared_mode_makes_group_folders_and_files(tmp_path: Path) -> None:
    root = tmp_path / "team"
    old = os.umask(0o022)
    try:
        backend = DirectoryBackend(root, shared=True)
        backend.set(KEY, b"v")
        backend.get(KEY)
        backend.flush_hits()
        backend.enforce_size()
        backend.vacuum()
    finally:
        os.umask(old)
    for name in (".hits", ".evict.lock", ".vacuumed"):  # every member must open these
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o664, name
    folder = path_of(root, KEY).parent
    assert stat.S_IMODE(root.stat().st_mode) == 0o2775
    assert stat.S_IMODE(folder.stat().st_mode) == 0o2775
    assert stat.S_IMODE(path_of(root, KEY).stat().st_mode) == 0o664  # umask 022: others read


def test_group_writable_root_needs_shared(tmp_path: Path) -> None:
    root = tmp_path / "g"
    root.mkdir()
    root.chmod(0o770)
    with pytest.raises(BackendError, match="shared=1"):
        DirectoryBackend(root)
    DirectoryBackend(root, shared=True).set(KEY, b"v")


# ------------------------------------------------------------------ URLs and roots
def test_dir_url_with_a_host_is_refused() -> None:
    with pytest.raises(InvalidURLError, match="takes no host") as info:
        rc.open_backend("dir://user:pw@host/path")
    assert "pw" not in str(info.value)


def test_a_file_as_the_root_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="not a directory"):
        rc.open_backend("dir:///etc/passwd")
    with pytest.raises(BackendError, match="not a directory"):
        DirectoryBackend("/etc/passwd/sub")


def test_a_dangling_link_as_the_root_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "root").symlink_to(tmp_path / "gone")
    with pytest.raises(BackendError, match=r"is a symbolic link to .*gone, which is missing"):
        DirectoryBackend(tmp_path / "root")
    assert not (tmp_path / "gone").exists()  # nothing made through the link


def test_a_forked_child_uses_the_backend(tmp_path: Path) -> None:
    backend = DirectoryBackend(tmp_path)
    backend.set(KEY, b"parent")
    backend.get(KEY)  # a pending hit: the child must not append it again
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ok = backend.get(KEY) == b"parent"
        backend.set("t/p/child", b"child")
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.get("t/p/child") == b"child"


def test_entry_size_bound_covers_the_codecs_largest_entry() -> None:
    from runtime_cache.backends.directory import MAX_ENTRY_SIZE
    from runtime_cache.codec import HEADER_SIZE, SIG_SIZE, Limits

    limits = Limits()
    largest = HEADER_SIZE + limits.max_meta_size + limits.max_value_size + SIG_SIZE
    assert largest <= MAX_ENTRY_SIZE <= 2 * largest


def test_hard_links_to_one_entry_count_once_against_max_files(tmp_path: Path) -> None:
    """Names linked to one entry counted one file each: 5,000 of them pushed the owner's
    recent entries out under max_files (1 of 20 kept in the attacker review)."""
    backend = DirectoryBackend(tmp_path, max_size="10MB", max_files=2000)
    keys = [f"safe/test/{i:032x}" for i in range(20)]
    for k in keys:
        backend.set(k, os.urandom(4000))
    for i in range(2500):
        link = path_of(tmp_path, f"safe/test/{i + 1000:032x}")
        link.parent.mkdir(parents=True, exist_ok=True)
        os.link(path_of(tmp_path, keys[0]), link)
    backend.set("safe/test/" + "f" * 32, b"one more")
    backend.enforce_size()
    assert all(backend.get(k) is not None for k in keys)
    assert backend._upkeep.usage()[1] == 21


def test_a_walk_stops_at_its_deadline_in_folders_that_hold_no_entry(tmp_path: Path) -> None:
    """The deadline was looked at once per entry found (every 1,024th in eviction), so a
    member's 400,000 empty folders made each open, put and vacuum take 6-8 s."""
    from runtime_cache.backends import dir_tree

    backend = DirectoryBackend(tmp_path, max_size="10MB")
    backend.set("safe/test/" + "a" * 32, b"x")
    for i in range(50):
        (tmp_path / "safe" / "zz" / str(i)).mkdir(parents=True)
    past = time.monotonic() - 1
    assert dir_tree.keys_until(backend.root_fd, past) is None
    assert dir_tree.keys_until(backend.root_fd, None) == {"safe/test/" + "a" * 32}
    assert backend._upkeep._candidates(past)[1] is False


def test_a_walk_stops_at_its_deadline_inside_one_large_folder(tmp_path: Path) -> None:
    """With the deadline looked at per folder only, 150,000 files in one shard folder were
    walked whole (1.1 s for keys_until, past a 50 ms deadline, in the review)."""
    from runtime_cache.backends import dir_tree

    backend = DirectoryBackend(tmp_path, max_size=None)
    shard = tmp_path / "r" / "p" / "ab"
    shard.mkdir(parents=True)
    for i in range(600):
        (shard / f"ab{i:030x}.rce").write_bytes(b"")
    past = time.monotonic() - 1
    assert dir_tree.keys_until(backend.root_fd, past) is None
    assert len(dir_tree.keys_until(backend.root_fd, None) or ()) == 600


def test_a_value_the_cap_could_not_keep_is_refused(tmp_path: Path) -> None:
    """A value just under max_size was stored, then pushed the others out and itself
    (eviction brings the disk, in 4 KiB blocks, to 90% of the cap)."""
    from runtime_cache.errors import EntryTooLargeError

    backend = DirectoryBackend(tmp_path, max_size=1_000_000)
    for i in range(50):
        backend.set(f"r/p/small{i:03d}", b"s" * 100)
    with pytest.raises(EntryTooLargeError):
        backend.set("r/p/big", b"x" * (1_000_000 - 10))
    backend.set("r/p/fits", b"x" * 800_000)
    assert backend.get("r/p/fits") is not None


def test_a_planted_vacuum_marker_does_not_make_every_open_vacuum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO at .vacuumed could never be touched, so every open vacuumed."""
    from runtime_cache.backends import dir_upkeep

    DirectoryBackend(tmp_path).close()
    (tmp_path / ".vacuumed").unlink()
    os.mkfifo(tmp_path / ".vacuumed", 0o600)
    runs: list[int] = []
    vacuum = dir_upkeep.Upkeep.vacuum
    monkeypatch.setattr(
        dir_upkeep.Upkeep, "vacuum", lambda self, *a: runs.append(1) or vacuum(self, *a)
    )
    DirectoryBackend(tmp_path).close()
    DirectoryBackend(tmp_path).close()
    assert len(runs) == 1 and stat.S_ISREG((tmp_path / ".vacuumed").lstat().st_mode)


def test_hard_links_to_one_entry_count_its_disk_once(tmp_path: Path) -> None:
    """Someone who can write the folder links one entry under hundreds of names: the names
    cost no disk, so the cap must not evict real entries for them (50 of 50 kept)."""
    backend = DirectoryBackend(tmp_path, max_size="1MB")
    keys = [f"safe/test/{i:032x}" for i in range(50)]
    for k in keys:
        backend.set(k, os.urandom(8000))
    newest = path_of(tmp_path, keys[-1])
    for i in range(600):
        link = path_of(tmp_path, f"safe/test/{i + 1000:032x}")
        link.parent.mkdir(parents=True, exist_ok=True)
        os.link(newest, link)
    backend.enforce_size()
    assert all(backend.get(k) is not None for k in keys)


def _used_in_turn(root: Path, cache: rc.Cache, count: int, value: bytes, now: float) -> None:
    """Put ``count`` entries, then date their last use a minute apart, the first an hour ago."""
    for i in range(count):
        if cache.get(key(i)) is None:
            cache.put(key(i), value)
        os.utime(path_of(root, key(i)), (now - 3600 + i * 60,) * 2)


def test_prune_weighs_entries_it_cannot_read(tmp_path: Path) -> None:
    """prune left corrupt entries out of its total, so junk could hold the folder over
    --max-size for good; they count now, and go first for size (by the file's age for age)."""
    from runtime_cache import maintenance
    from runtime_cache.codec import encode_entry

    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    now = time.time()
    _used_in_turn(tmp_path, cache, 4, b"g" * 1000, now)
    good = path_of(tmp_path, key(0)).stat().st_size
    stale, fresh = str(key(10)), str(key(11))
    backend.set(stale, os.urandom(5000))  # random bytes, untouched for a day
    os.utime(path_of(tmp_path, stale), (now - 86400,) * 2)
    blob = encode_entry(fresh, key(11).parts, b"t" * 1000, created_at=now)
    backend.set(fresh, blob[:60])  # an entry cut within its metadata, used just now

    aged = maintenance.prune(cache, older_than=12 * 3600, now=now)
    assert aged.removed == 1 and not path_of(tmp_path, stale).exists()
    assert {k for k, _ in aged.corrupt} == {stale, fresh} and not aged.skipped

    backend.set(stale, os.urandom(5000))
    os.utime(path_of(tmp_path, stale), (now - 86400,) * 2)
    os.utime(path_of(tmp_path, fresh), (now + 86400,) * 2)  # a time anyone may set
    report = maintenance.prune(cache, max_size=3 * good + 1000, now=now)
    # What cannot be read goes first, whatever its time; then the least recently used.
    assert report.removed == 3 and report.freed == 5060 + good
    assert not path_of(tmp_path, stale).exists() and not path_of(tmp_path, fresh).exists()
    assert cache.get(key(0)) is None
    assert [cache.get(key(i)) for i in (1, 2, 3)] == [b"g" * 1000] * 3
    assert report.remaining == 3 and report.remaining_bytes == 3 * good
    assert report.over_cap == 0


def test_a_shared_roots_members_are_looked_up_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared root's group members were found by listing every user (pwd.getpwall), which
    a directory service (LDAP, SSSD without enumeration) answers without its users: their
    files were left out of the cap. Each file's uid is looked up now."""
    import grp
    import pwd

    from runtime_cache.backends.dir_root import GroupMembers

    me = pwd.getpwuid(os.geteuid())
    original_getpwall = pwd.getpwall
    monkeypatch.setattr(pwd, "getpwall", lambda: [])  # a service that lists no one
    members = GroupMembers(me.pw_gid, -1)
    assert me.pw_uid in members and me.pw_uid in members  # (asked again: kept)
    assert "0" not in members and None not in members
    taken = {user.pw_uid for user in original_getpwall()}
    nobody = next(uid for uid in range(2_000_000, 2_100_000) if uid not in taken)
    with pytest.raises(KeyError):
        pwd.getpwuid(nobody)
    assert nobody not in members
    gids = {group.gr_gid for group in grp.getgrall()}
    other = next(gid for gid in range(2_000_000, 2_100_000) if gid not in gids)
    assert me.pw_uid not in GroupMembers(other, -1)
    assert 12345 in GroupMembers(other, 12345)  # this process's user always counts


def test_prune_leaves_names_it_cannot_judge_out_and_never_over_removes(tmp_path: Path) -> None:
    """The review of prune's junk: a name the store lists but that is no key (a copy beside
    an entry), or an entry whose read failed once, counted as junk and went first, and a
    removal that could not happen let prune remove every good entry; a corrupt entry that
    vanished, or was written again, meanwhile was still counted, and the fresh one removed."""
    from runtime_cache import maintenance
    from runtime_cache.errors import BackendUnavailableError

    class Flaky(DirectoryBackend):
        fail: ClassVar[set[str]] = set()

        def head(self, key_: str, size: int) -> bytes | None:
            if key_ in self.fail:
                self.fail.discard(key_)
                raise BackendUnavailableError("a timeout")
            return super().head(key_, size)

    backend = Flaky(tmp_path, max_size=None)
    cache = rc.Cache(backend, secret="s" * 32)
    now = time.time()
    _used_in_turn(tmp_path, cache, 5, b"x" * 1000, now)
    size = path_of(tmp_path, key(0)).stat().st_size
    (tmp_path / "safe" / "test" / "82").mkdir(exist_ok=True)
    copy = tmp_path / "safe" / "test" / "82" / "82 copy.rce"  # as a file manager names one
    copy.write_bytes(b"j" * 20 * size)  # listed, no key: cannot be read, nor removed
    backend.fail.add(str(key(4)))  # the most recently used: one read of it fails
    report = maintenance.prune(cache, max_size=10 * size, now=now)
    assert report.removed == 0 and len(report.skipped) == 2 and not report.corrupt
    assert all(cache.get(key(i)) == b"x" * 1000 for i in range(5))
    copy.unlink()
    _used_in_turn(tmp_path, cache, 5, b"x" * 1000, now)  # (the gets above used them all)

    # Corrupt entries that another hand removes, or writes again, while prune runs.
    gone, rebuilt = key(20), key(21)
    for k in (gone, rebuilt):
        backend.set(str(k), os.urandom(2 * size))

    def meanwhile(done: int, _total: int) -> None:
        if done == 1:
            backend.delete(str(gone))
            cache.put(rebuilt, b"y" * 1000)

    report = maintenance.prune(cache, max_size=5 * size + 100, now=now, on_progress=meanwhile)
    assert cache.get(rebuilt) == b"y" * 1000  # written again: kept
    assert report.removed == 1 and cache.get(key(0)) is None  # the cap, one good entry
    assert all(cache.get(key(i)) == b"x" * 1000 for i in range(1, 5))
    assert report.freed == size and report.remaining == 5


def test_prune_keeps_entries_of_a_newer_format_where_it_found_them(tmp_path: Path) -> None:
    """An entry in a newer format is another reader's: left out, not the first to go."""
    from runtime_cache import maintenance

    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    now = time.time()
    _used_in_turn(tmp_path, cache, 3, b"x" * 1000, now)
    newer = bytearray(path_of(tmp_path, key(2)).read_bytes())
    newer[4] = 99  # the format's version
    backend.set(str(key(7)), bytes(newer))
    size = path_of(tmp_path, key(0)).stat().st_size
    report = maintenance.prune(cache, max_size=2 * size, now=now)
    assert report.removed == 1 and cache.get(key(0)) is None
    assert path_of(tmp_path, key(7)).exists()
    assert [k for k, _ in report.skipped] == [str(key(7))] and not report.corrupt


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to make a user with two names",
)
def test_a_uid_whose_second_name_is_in_the_group_is_a_member() -> None:
    """The review of the lookup by uid: a uid with two passwd names answers with its first
    alone, whose primary group may be another; its second, in the root's group, counts."""
    import grp
    import pwd

    from runtime_cache.backends.dir_root import GroupMembers

    tag = os.getpid() % 100000
    share, other, user, alias = (f"rcs{tag}", f"rco{tag}", f"rcu{tag}", f"rca{tag}")
    try:
        system_users.add_group(share)
        system_users.add_group(other)
        system_users.add_user(user, other)
        uid = pwd.getpwnam(user).pw_uid
        system_users.add_user(alias, share, "-o", "-u", str(uid))
        assert pwd.getpwuid(uid).pw_name == user
        assert uid in GroupMembers(grp.getgrnam(share).gr_gid, -1)
        assert uid in GroupMembers(grp.getgrnam(other).gr_gid, -1)
    finally:
        system_users.remove([alias, user], [share, other])


def test_prune_reports_what_another_prune_left_and_never_freshens_junk(tmp_path: Path) -> None:
    """The second review of prune: with another prune done first, nothing was removed, the
    first listing stood, and the report (and the CLI's exit code) said the cap was unmet;
    a corrupt file whose removal failed was read with a counted use, which made it fresh,
    so the next --older-than neither aged it nor said why."""
    from runtime_cache import maintenance
    from runtime_cache.errors import BackendError

    backend = DirectoryBackend(tmp_path, max_size=None)
    cache = rc.Cache(backend)
    now = time.time()
    _used_in_turn(tmp_path, cache, 10, b"x" * 1000, now)
    size = path_of(tmp_path, key(0)).stat().st_size
    other = rc.Cache(DirectoryBackend(tmp_path, max_size=None))

    def first(done: int, _total: int) -> None:
        if done == 1:
            maintenance.prune(other, max_size=5 * size)

    report = maintenance.prune(cache, max_size=5 * size, on_progress=first)
    assert report.removed == 0 and report.remaining == 5 and report.over_cap == 0
    assert [cache.get(key(i)) is not None for i in range(10)] == [False] * 5 + [True] * 5

    junk = str(key(90))

    class Immutable(DirectoryBackend):
        def delete(self, key_: str) -> bool:
            if key_ == junk:
                raise BackendError("an immutable file")
            return super().delete(key_)

    stuck = rc.Cache(Immutable(tmp_path, max_size=None))
    backend.set(junk, os.urandom(500))
    ten_days = now - 10 * 86400
    os.utime(path_of(tmp_path, junk), (ten_days, ten_days))
    for _ in range(2):
        report = maintenance.prune(stuck, older_than=86400, now=now)
        assert [k for k, _ in report.failed] == [junk] and report.stuck == 1
        assert path_of(tmp_path, junk).stat().st_mtime == ten_days
