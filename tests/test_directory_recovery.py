"""A ``dir://`` cache comes back by itself: after its root was removed under the process,
after its storage was read-only for a while, and before its hits journal fills up.

From the operator review of session 36: a process whose cache folder a tmp cleaner (or an
``rm -rf ~/.cache/runtime-cache``) removed never cached again; one that had found its mount
read-only skipped every write for the rest of its life, though the mount was made
read-write again; and a long-lived process's hits journal grew until it counted no more.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
import runtime_cache.backends.directory as directory
from runtime_cache.backends.directory import DirectoryBackend


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"r{i}", runtime="r", purpose="p")


def test_a_root_removed_under_the_process_is_made_again(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    cache = rc.Cache(backend)
    assert cache.put(_key(0), b"zero")
    shutil.rmtree(root)
    assert cache.get(_key(0)) is None  # gone: a miss
    assert cache.put(_key(1), b"one")  # the write finds the root gone and makes it again
    assert cache.get(_key(1)) == b"one"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700  # made as an open makes it
    for i in range(2, 5):
        assert cache.put(_key(i), b"more") and cache.get(_key(i)) == b"more"
    backend.flush_hits()
    assert (root / ".hits").exists()  # the journal follows the new root
    assert cache.stats().errors == 0


def test_a_shared_root_made_again_gets_back_its_group(tmp_path: Path) -> None:
    """Carried over from session 36: a shared folder made again took this process's group,
    so the group's other members could no longer write it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder a group this process is not in")
    root = tmp_path / "shared"
    root.mkdir(mode=0o2770)
    os.chown(root, -1, 65534)  # a group other than this process's
    backend = DirectoryBackend(root, shared=True)
    cache = rc.Cache(backend, secret="s")
    assert cache.put(_key(0), b"zero")
    shutil.rmtree(root)
    assert cache.put(_key(1), b"one") and cache.get(_key(1)) == b"one"
    st = root.stat()
    assert st.st_gid == 65534 != os.getegid()
    assert st.st_mode & stat.S_ISGID  # its files and folders take the group too
    assert next(p for p in root.rglob("*") if p.is_file()).stat().st_gid == 65534


def test_a_root_made_again_passes_an_opens_checks(tmp_path: Path) -> None:
    """The root made again follows no link at its path (one to a folder of another user's
    was refused by the owner check before; now it is not followed at all), so the cache
    carries on without writes rather than write into it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    root, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, 65534, 65534)  # nobody's
    cache = rc.Cache(DirectoryBackend(root))
    assert cache.put(_key(0), b"zero")
    shutil.rmtree(root)
    root.symlink_to(elsewhere)
    assert not cache.put(_key(1), b"one")
    assert list(elsewhere.iterdir()) == []


def test_a_read_only_store_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    backend = DirectoryBackend(tmp_path / "cache")
    cache = rc.Cache(backend)
    real = directory.writes.write_entry

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(directory.writes, "write_entry", read_only)  # a mount made read-only
    monkeypatch.setattr(directory, "READ_ONLY_RECHECK", 0.3)
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert not cache.put(_key(1), b"one")
        assert backend.read_only
        monkeypatch.setattr(directory.writes, "write_entry", real)  # made read-write again
        assert not cache.put(_key(2), b"two")  # skipped until the recheck is due
        time.sleep(0.35)
        assert cache.put(_key(3), b"three")
    assert not backend.read_only
    assert cache.get(_key(3)) == b"three"
    assert cache.put(_key(2), b"two") and cache.get(_key(2)) == b"two"
    text = caplog.text
    assert "read-only" in text and "work again" in text


def test_a_long_lived_process_compacts_the_hits_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Operator review, session 36: only a vacuum (hourly, at an open) compacted the hits
    journal, so a long-lived process hitting many keys grew it to the 64 MiB read cap (in
    about 20 minutes at 1,000 hits a second), and no hit counted after that. A process whose
    append finds it past ``COMPACT_AT`` compacts it on a thread of its own."""
    import runtime_cache.backends.hits_journal as journal

    monkeypatch.setattr(journal, "COMPACT_AT", 64 << 10)  # 64 KiB here
    monkeypatch.setattr(journal, "COMPACT_EVERY", 0.0)
    backend = DirectoryBackend(tmp_path / "cache", hits_batch=50)
    cache = rc.Cache(backend)
    keys = [_key(i) for i in range(40)]
    for key in keys:
        assert cache.put(key, b"v" * 100)
    rounds = 200  # 8,000 hits: about 380 KB of lines uncompacted
    for _ in range(rounds):
        for key in keys:
            assert cache.get(key) == b"v" * 100
    backend.flush_hits()
    for thread in threading.enumerate():
        if thread.name == "runtime-cache hits":
            thread.join(10)
    size = (tmp_path / "cache" / ".hits").stat().st_size
    assert size < 2 * (64 << 10), size
    hits = {item.key: item.hits for item in backend.scan()}
    counted = sum(hits[str(key)] or 0 for key in keys)
    # Appends that raced a rewrite may be lost (counts are advisory); most are kept.
    assert 0.8 * rounds * len(keys) <= counted <= rounds * len(keys), counted
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp-")]


def test_a_padded_journal_costs_a_bounded_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Attacker review, session 37: a member of a shared folder padded ``.hits`` to just
    under the 64 MiB read cap with 5.6 million distinct keys: every process opening the
    cache parsed it all (13.5 s of CPU, 1.4 GiB). Only live keys are counted now, and a
    read parses for at most ``READ_SECONDS``; the vacuum then writes back what it counted."""
    import runtime_cache.backends.hits_journal as journal

    root = tmp_path / "cache"
    cache = rc.Cache(DirectoryBackend(root), secret="s")
    keys = [_key(i) for i in range(3)]
    for key in keys:
        assert cache.put(key, b"v") and cache.get(key) == b"v"
    cache.close()
    with open(root / ".hits", "ab") as padded:
        padded.write(b"".join(b"1 1 opencl/binary/%032x\n" % i for i in range(200_000)))
    backend = DirectoryBackend(root, track_access=True)
    assert {item.key: item.hits for item in backend.scan()} == {str(k): 1 for k in keys}
    live = {str(k) for k in keys}
    assert set(backend._journal.read(keep=live)) == live  # the padding is never held
    monkeypatch.setattr(journal, "READ_SECONDS", 0.0)
    with caplog.at_level(logging.WARNING):
        assert backend._journal.read(keep=live) == {}  # out of time: the rest left out
    assert "took over 0.0 s to read" in caplog.text
    monkeypatch.setattr(journal, "READ_SECONDS", 10.0)
    backend.compact_hits()
    assert (root / ".hits").stat().st_size < 1000  # the live keys' lines alone
    # Lines ended by "\r" made one piece of the whole file (str.splitlines splits there),
    # parsed past the deadline, and counted the live key's padded lines (re-attack review).
    padding = b"".join(b"9 1 %s\r" % str(keys[0]).encode() for _ in range(100_000))
    pieces = list(journal._pieces(padding))
    assert len(pieces) > 10 and max(len("\n".join(p)) for p in pieces) <= journal._PIECE + 4096
    with open(root / ".hits", "ab") as padded:
        padded.write(padding)
    assert backend._journal.read(keep=live)[str(keys[0])][0] < 10  # none of them counted


def _read_often(backend: DirectoryBackend, count: int, value: bytes) -> list[rc.CacheKey]:
    """Store ``count`` keys, read each 1,000 times, flush the hits, and wait for the
    journal's compactions; the keys."""
    cache = rc.Cache(backend)
    keys = [_key(i) for i in range(count)]
    for key in keys:
        assert cache.put(key, value)
    for _ in range(1000):
        for key in keys:
            cache.get(key)
    backend.flush_hits()
    for thread in threading.enumerate():
        if thread.name == "runtime-cache hits":
            thread.join(10)
    return keys


def test_the_journal_of_a_small_cache_stays_a_small_part_of_it(tmp_path: Path) -> None:
    """Operator review, session 37: on a 2 MiB disk holding a cache of ``max_size=1MB``,
    two readers grew ``.hits`` (outside the cap) to 1.36 MB in 5 s; the disk filled, every
    store failed, and a compaction, which writes a new journal first, failed too."""
    from conftest import fill, tmpfs

    with tmpfs(tmp_path / "disk", "2m") as disk:
        backend = DirectoryBackend(disk / "cache", max_size="1MB", hits_batch=64)
        keys = _read_often(backend, 20, b"v" * 1000)  # 20,000 hits: about 1 MB of lines
        assert (disk / "cache" / ".hits").stat().st_size <= (1 << 17) + 64 * 60
        # A full disk: the compaction cuts the journal in place.
        with open(disk / "cache" / ".hits", "ab") as more:
            more.write(b"".join(b"1 1 %s\n" % str(k).encode() for k in keys * 200))
        filler = fill(disk)
        try:
            backend.compact_hits()
            assert (disk / "cache" / ".hits").stat().st_size < 2000
            assert not [p for p in (disk / "cache").iterdir() if p.name.startswith(".tmp-")]
            hits = {item.key: item.hits for item in backend.scan()}
            assert all((hits[str(k)] or 0) > 200 for k in keys)
        finally:
            filler.unlink()
        assert rc.Cache(backend).put(_key(99), b"room again")
        # A full disk fails the append itself: that append still sets off the compaction
        # (review: its size was taken only after a write that worked, so none started).
        with open(disk / "cache" / ".hits", "ab") as more:
            more.write(b"".join(b"1 1 dead/key/%032x\n" % i for i in range(2000)))
            pad = -(more.tell() + 1) % 4096  # to a whole page: no room left in its last one
            more.write(b"#" * pad + b"\n")
        again = rc.Cache(DirectoryBackend(disk / "cache", max_size="1MB", hits_batch=8))
        filler = fill(disk)
        try:
            for key in keys[:8]:
                again.get(key)  # the eighth hit appends: the write fails, the disk is full
            for thread in threading.enumerate():
                if thread.name == "runtime-cache hits":
                    thread.join(10)
            assert (disk / "cache" / ".hits").stat().st_size < 2000
        finally:
            filler.unlink()


def test_a_root_removed_on_nfs_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the fix: on NFS the descriptor of a folder another client removed
    answers ``ESTALE`` rather than a link count of 0, so nothing was made again there."""
    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    cache = rc.Cache(backend)
    assert cache.put(_key(0), b"zero")
    shutil.rmtree(root)
    real, stale_fd = os.fstat, backend.root_fd

    def fstat(fd: int) -> os.stat_result:
        if fd == stale_fd and not root.exists():
            raise OSError(errno.ESTALE, "Stale file handle")
        return real(fd)

    monkeypatch.setattr(os, "fstat", fstat)
    assert cache.put(_key(1), b"one")
    assert cache.get(_key(1)) == b"one"


def _victim(tmp_path: Path) -> tuple[Path, tuple[int, int, int]]:
    victim = tmp_path / "victim"  # a private folder of the process's own user
    victim.mkdir(mode=0o700)
    (victim / "notes").write_text("mine")
    st = victim.stat()
    return victim, (st.st_mode, st.st_uid, st.st_gid)


def _unchanged(victim: Path, before: tuple[int, int, int]) -> None:
    st = victim.stat()
    assert (st.st_mode, st.st_uid, st.st_gid) == before
    assert sorted(p.name for p in victim.iterdir()) == ["notes"]


def test_a_shared_root_is_not_made_again_through_a_planted_link(tmp_path: Path) -> None:
    """Review of session 42 (High): a member of a shared folder's group replaced the root
    by a link to a private folder of the victim's (root's: /etc); making the root again
    followed it, gave that folder to the group, made it group-writable and wrote entries
    into it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the shared root a group this process is not in")
    victim, before = _victim(tmp_path)
    team = tmp_path / "team"
    team.mkdir(mode=0o2770)
    root = team / "cache"
    root.mkdir(mode=0o2770)
    os.chown(team, -1, 65534)
    os.chown(root, -1, 65534)
    cache = rc.Cache(DirectoryBackend(root, shared=True), secret="s")
    assert cache.put(_key(0), b"zero")
    shutil.rmtree(root)
    root.symlink_to(victim)  # what a member of the group can do: the team folder is theirs
    assert not cache.put(_key(1), b"one")  # no root: the write is skipped
    _unchanged(victim, before)
    root.unlink()  # a folder there again: made again, with its group
    assert cache.put(_key(2), b"two") and root.stat().st_gid == 65534


def test_a_new_root_swapped_for_a_link_is_not_chmod_ed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of session 42: a shared root made at the open had its mode set by its path,
    so a link swapped in between the two steps led the chmod to a private folder."""
    victim, before = _victim(tmp_path)
    team = tmp_path / "team"
    team.mkdir()
    root = team / "cache"
    real = os.mkdir

    def mkdir_then_swap(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        if _made_for(root, path, kwargs):  # the attacker's move, at once
            if os.path.isdir(root) and not os.path.islink(root):
                os.rmdir(root)  # (made at its own name, where there is no renameat2)
            os.symlink(victim, root)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(rc.errors.BackendError, match="symbolic link"):
        DirectoryBackend(root, shared=True)
    monkeypatch.setattr(os, "mkdir", real)
    _unchanged(victim, before)


@pytest.mark.parametrize("remade", [False, True])
def test_a_folder_exchanged_for_the_new_root_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, remade: bool
) -> None:
    """Session 42's closing note: between the root's ``mkdir`` and its open, a member of a
    group-writable parent could swap in a folder of the victim's own (``renameat2`` with
    ``RENAME_EXCHANGE``: no link to refuse); the ``fchmod`` then made it group-writable
    and setgid (and a remade shared root's ``chown`` gave it to the group)."""
    victim, before = _victim(tmp_path)
    team = tmp_path / "team"
    team.mkdir()
    root = team / "cache"
    cache = None
    if remade:
        cache = rc.Cache(DirectoryBackend(root, shared=True), secret="s")
        assert cache.put(_key(0), b"zero")
        shutil.rmtree(root)
    real = os.mkdir

    def mkdir_then_exchange(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        if _made_for(root, path, kwargs):  # the attacker's move, at once
            made = team / os.fspath(path) if kwargs.get("dir_fd") is not None else Path(path)
            os.rename(made, team / "aside")
            os.rename(victim, made)

    monkeypatch.setattr(os, "mkdir", mkdir_then_exchange)
    if cache is None:
        with pytest.raises(rc.errors.BackendError, match="swapped"):
            DirectoryBackend(root, shared=True)
    else:
        assert not cache.put(_key(1), b"one")  # no root: the write is skipped
    monkeypatch.setattr(os, "mkdir", real)
    swapped_in = next(p for p in team.iterdir() if p.name != "aside")
    st = swapped_in.stat()
    assert (st.st_mode, st.st_uid, st.st_gid) == before


def _made_for(root: Path, path: Any, kwargs: dict[str, Any]) -> bool:
    """Whether ``os.mkdir(path, **kwargs)`` made the folder for the cache root ``root``: a
    random name beside it (``dir_fd``: its parent), or ``root`` itself (no renameat2)."""
    if kwargs.get("dir_fd") is not None:
        return os.fspath(path).startswith(".rc-root-")
    return os.fspath(path).rstrip("/") == str(root)


def test_a_new_shared_root_has_its_mode_before_another_process_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack of session 43: the root made at its own name was found by another process
    of the same user, which stored an entry into it before the maker checked it empty;
    the maker took it for one swapped in and left it at ``mkdir``'s mode (14 of 60 shared
    roots opened by 4 processes at once): a member's store then failed. The root takes its
    name only once it has its mode."""
    team = tmp_path / "team"
    team.mkdir()
    root = team / "cache"
    real = os.mkdir

    def mkdir_then_store(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        if root.is_dir():  # another process finds the root, and stores into it at once
            (root / "op").mkdir(exist_ok=True)

    monkeypatch.setattr(os, "mkdir", mkdir_then_store)
    old = os.umask(0o022)  # (mkdir's mode alone: no group write)
    try:
        DirectoryBackend(root, shared=True)
    finally:
        os.umask(old)
        monkeypatch.setattr(os, "mkdir", real)
    assert root.stat().st_mode & 0o2070 == 0o2070, oct(root.stat().st_mode)


def test_the_journal_leaves_a_small_disk_room_for_entries(tmp_path: Path) -> None:
    """Operator review, session 43: on a 2 MiB disk with the default cap (2 GB), 40 keys
    read for 3 s grew ``.hits`` to 1.9 MB; every store failed, a fresh process's too,
    until the hourly vacuum. The journal takes at most a sixteenth of the room the disk
    leaves it, and a full disk has it compacted."""
    from conftest import tmpfs

    with tmpfs(tmp_path / "disk", "2m") as disk:
        backend = DirectoryBackend(disk / "cache", hits_batch=64)
        keys = _read_often(backend, 40, b"v" * 100)  # 40,000 hits: about 1.9 MB of lines
        assert (disk / "cache" / ".hits").stat().st_size <= (2 << 20) // 16 + 64 * 60
        other = rc.Cache(DirectoryBackend(disk / "cache"))  # a fresh process's store
        assert other.put(_key(99), b"w" * 50_000) and other.get(_key(99)) == b"w" * 50_000
        hits = {item.key: item.hits for item in backend.scan()}
        assert all((hits[str(k)] or 0) > 0 for k in keys)


def test_a_file_system_that_tells_no_size_keeps_every_hit(tmp_path: Path) -> None:
    """Re-attack of session 43: ramfs and a tmpfs of ``size=0`` (no limit) tell no blocks
    and no free ones; the journal was held to 16 KiB there, and 1,744 of 2,000 keys read 3
    times each showed no hit. Such a file system is bounded by the cap alone."""
    from conftest import tmpfs

    with tmpfs(tmp_path / "disk", "0") as disk:
        assert os.statvfs(disk).f_blocks == 0
        backend = DirectoryBackend(disk / "cache", hits_batch=64)
        cache = rc.Cache(backend)
        keys = [_key(i) for i in range(2000)]
        for key in keys:
            assert cache.put(key, b"v")
        for _ in range(3):
            for key in keys:
                cache.get(key)
        backend.flush_hits()
        hits = {item.key: item.hits for item in backend.scan()}
        assert all(hits[str(k)] == 3 for k in keys)


def test_without_renameat2_a_folder_exchanged_for_the_new_root_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack of session 43: where the C library has no ``renameat2`` the root is made
    at its own name, and that path chmod-ed any folder of this user's found there: a
    victim's private folder swapped in (``RENAME_EXCHANGE``) became group-writable."""
    from runtime_cache.backends import exclusive_rename

    victim, before = _victim(tmp_path)
    team = tmp_path / "team"
    team.mkdir()
    root = team / "cache"
    monkeypatch.setattr(exclusive_rename, "_renameat2", lambda: None)
    real = os.mkdir

    def mkdir_then_exchange(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        if os.fspath(path).rstrip("/") in (str(root), root.name):  # the attacker's move
            os.rename(root, team / "aside")
            os.rename(victim, root)

    monkeypatch.setattr(os, "mkdir", mkdir_then_exchange)
    DirectoryBackend(root, shared=True)
    monkeypatch.setattr(os, "mkdir", real)
    st = root.stat()
    assert (st.st_mode, st.st_uid, st.st_gid) == before


def test_a_root_made_again_removes_what_a_killed_maker_left(tmp_path: Path) -> None:
    """Re-attack of session 43: a process killed while it made a root left its folder
    ``.rc-root-<hex>`` in the parent for good. The next root made there removes this
    user's that are empty and a minute old; others stay."""
    team = tmp_path / "team"
    team.mkdir()
    stale, young, full = team / ".rc-root-aa", team / ".rc-root-bb", team / ".rc-root-cc"
    for folder in (stale, young, full):
        folder.mkdir()
    (full / "keep").write_text("x")
    old = time.time() - 3600
    for folder in (stale, full):
        os.utime(folder, (old, old))
    DirectoryBackend(team / "cache", shared=True)
    assert not stale.exists() and young.exists() and full.exists()


def test_a_folder_exchanged_for_a_new_shared_folder_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack of session 43: a shared cache made its folders at their own names, then
    set their mode through a descriptor: a member who swapped a private folder of the
    victim's in between (``RENAME_EXCHANGE``) had it made group-writable and setgid, and
    another member's store into a folder not yet given its mode failed. A folder takes its
    name only once it has its mode; one swapped for it on the way is left as it is."""
    victim, before = _victim(tmp_path)
    root = tmp_path / "team" / "cache"
    cache = rc.Cache(DirectoryBackend(root, shared=True), secret="s" * 16)
    real, swapped = os.mkdir, []

    def mkdir_then_exchange(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        folder = kwargs.get("dir_fd")
        name = os.fspath(path)
        if folder is not None and not swapped and (name == "rt" or name.startswith(".rc-dir-")):
            swapped.append(name)  # the attacker's move, at once
            os.rename(name, "aside", src_dir_fd=folder, dst_dir_fd=folder)
            os.rename(victim, name, dst_dir_fd=folder)

    monkeypatch.setattr(os, "mkdir", mkdir_then_exchange)
    key = rc.make_key(module_id="m", runtime="rt", purpose="p")
    assert not cache.put(key, b"value")  # no folder of its own: the write is skipped
    monkeypatch.setattr(os, "mkdir", real)
    moved = next(root.rglob(swapped[0])) if swapped[0] != "rt" else root / "rt"
    st = moved.stat()
    assert (st.st_mode, st.st_uid, st.st_gid) == before
    assert cache.put(key, b"value") and cache.get(key) == b"value"


def test_without_renameat2_a_shared_folder_found_at_once_still_gets_its_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack of session 43: where there is no ``renameat2`` (NFS, FUSE, an old C
    library), a folder inside a shared cache was made at its name and given its mode only
    if still empty; another process of the same user that stored into it at once left it
    at ``mkdir``'s mode, and every other member's store into it failed for good. Inside
    the cache no victim's folder can be swapped in (moving a folder to another parent
    needs write on it), so a folder of this user's is given its mode whatever it holds."""
    from runtime_cache.backends import exclusive_rename

    root = tmp_path / "team" / "cache"
    cache = rc.Cache(DirectoryBackend(root, shared=True), secret="s" * 16)
    monkeypatch.setattr(exclusive_rename, "_renameat2", lambda: None)
    real = os.mkdir

    def mkdir_then_store(path: Any, mode: int = 0o777, **kwargs: Any) -> None:
        real(path, mode, **kwargs)
        folder = kwargs.get("dir_fd")
        if folder is not None and os.fspath(path) == "rt":  # another process stores at once
            os.close(os.open("rt/op", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=folder))

    monkeypatch.setattr(os, "mkdir", mkdir_then_store)
    old = os.umask(0o022)  # (mkdir's mode alone: no group write)
    try:
        assert cache.put(rc.make_key(module_id="m", runtime="rt", purpose="p"), b"value")
    finally:
        os.umask(old)
        monkeypatch.setattr(os, "mkdir", real)
    assert (root / "rt").stat().st_mode & 0o2070 == 0o2070, oct((root / "rt").stat().st_mode)
