"""Signed build leases in a ``shared=1`` folder: a lock no key of the secret signed holds
nobody off.

The attacker review of session 36: a member of a shared folder's group, without the
secret, held a key's lock file and touched it, and every ``get_or_build`` and
``OpenCLModule.build_all`` of the others waited out its deadline, 92 s per key, where a
lease planted in Redis is replaced at once. Here the "member" is a process of this user
that locks the file and keeps it fresh, as a member could; the real two-user case is in
``tests/test_hostile_group.py``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from conftest import holding
from runtime_cache.backends.dir_lease import FOREIGN_GRACE, DirLease
from runtime_cache.backends.lease_tokens import make_token
from runtime_cache.fleet import LeasePolicy

SECRET = "team-secret-0123456789abcdef"

#: Locks the file at argv[1] (and argv[3] too, when given), writes argv[2] into it, and
#: keeps it fresh: a holder as far as the lock and its time go.
PLANTED = textwrap.dedent(
    """
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o660)
    fcntl.flock(fd, fcntl.LOCK_EX)
    token = sys.argv[2].encode()
    os.pwrite(fd, token, 0)
    os.ftruncate(fd, len(token))
    if len(sys.argv) > 3:
        other = os.open(sys.argv[3], os.O_RDWR | os.O_CREAT, 0o660)
        fcntl.flock(other, fcntl.LOCK_EX)
    print("held", flush=True)
    while True:
        os.utime(fd)
        time.sleep(0.2)
    """
)

#: A holder with the secret, through the library: takes the lease on argv[2], then waits.
MEMBER = textwrap.dedent(
    """
    import sys, time
    import runtime_cache as rc
    cache = rc.Cache(rc.open_backend(sys.argv[1]), secret=sys.argv[3])
    lease = cache.backend.lease(sys.argv[2], 30.0)
    assert lease is not None and lease.acquire()
    print("held", flush=True)
    time.sleep(60)
    """
)


def _cache(root: Path) -> rc.Cache:
    cache = rc.Cache(rc.open_backend(f"dir://{root}?shared=1"), secret=SECRET)
    cache.fleet.policy = LeasePolicy(ttl=30.0, default_expected=30.0)  # a 92 s wait
    return cache


def _key(name: str = "m") -> rc.CacheKey:
    return rc.make_key(module_id=name, runtime="fleet", purpose="test", device=None)


def _lock_path(cache: rc.Cache, key: rc.CacheKey | str) -> Path:
    lease = cache.backend.lease(str(key), 30.0)
    assert isinstance(lease, DirLease)
    assert lease.acquire()  # makes .locks/ with the cache's modes
    lease.release()
    return cache.backend.root / lease.path  # type: ignore[attr-defined, no-any-return]


@contextmanager
def _holding(script: str, *args: str) -> Iterator[None]:
    with holding([sys.executable, "-c", script, *args]):
        yield


def test_a_lock_held_without_a_signed_token_holds_nobody_off(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    key = _key()
    path = _lock_path(cache, key)
    built: list[str] = []
    for planted in ("", "junk", "0" * 32 + ".99999999999999.deadbeef"):
        with _holding(PLANTED, str(path), planted):
            started = time.monotonic()
            value = cache.get_or_build(key, lambda: built.append("v") or b"built here")
            took = time.monotonic() - started
        assert value == b"built here"
        assert took < 6.0, (planted, took)  # the grace and a poll or two; was 92 s
        cache.delete(key)
    assert built == ["v"] * 3
    stats = cache.stats()
    # Each waited one poll or two, then broke the lock as a stale one and took the lease
    # over (a takeover, as when a holder dies), far from its deadline.
    assert (stats.lease_waits, stats.takeovers, stats.builds) == (3, 3, 3)
    assert stats.wait_seconds < 3 * 6.0


def test_a_token_of_bytes_no_ascii_leaks_no_descriptor(tmp_path: Path) -> None:
    """The attacker review of session 40: a token-shaped string whose MAC held bytes that
    are no ASCII made the check raise (compare_digest on non-ASCII text) while the lock's
    file was open, and that descriptor was never closed: one leaked a miss, until the app
    could open no file. Now it is no holder's token, like any other junk."""
    cache = _cache(tmp_path)
    key = _key()
    path = _lock_path(cache, key)
    planted = "a" * 32 + "." + "9" * 13 + "." + "\u00e9" * 16  # 32 bytes of UTF-8
    open_fds = len(os.listdir("/proc/self/fd"))
    with _holding(PLANTED, str(path), planted):
        for _ in range(20):
            assert cache.get_or_build(key, lambda: b"built here") == b"built here"
            cache.delete(key)
    assert len(os.listdir("/proc/self/fd")) <= open_fds + 1  # (+1: the folder's own)
    assert cache.stats().errors == 0


def test_a_token_of_the_secret_that_ran_out_is_no_holder(tmp_path: Path) -> None:
    """A replay: a live holder's token copied and planted again counts until it runs out."""
    cache = _cache(tmp_path)
    key = _key()
    path = _lock_path(cache, key)
    name = path.name
    old = make_token(SECRET.encode(), name, 1000, int(time.time() * 1000) - 60_000)
    with _holding(PLANTED, str(path), old):
        started = time.monotonic()
        assert cache.get_or_build(key, lambda: b"built here") == b"built here"
        assert time.monotonic() - started < 6.0


def test_a_member_with_the_secret_is_waited_for(tmp_path: Path) -> None:
    """The holder's signed token keeps its lease: others wait, and never break it."""
    cache = _cache(tmp_path)
    key = _key()
    url = f"dir://{tmp_path}?shared=1"
    with _holding(MEMBER, url, str(key), SECRET):
        lease = cache.backend.lease(str(key), 30.0)
        assert lease is not None
        for _ in range(2):  # looks further apart than the grace: still held, still signed
            assert not lease.acquire()
            time.sleep(FOREIGN_GRACE * 1.2)
        # Another secret's token is no team member's: broken like any planted lock.
        other = rc.Cache(rc.open_backend(url), secret="another-secret-0123456789")
        theirs = other.backend.lease(str(key), 30.0)
        assert theirs is not None and not theirs.acquire()
        time.sleep(FOREIGN_GRACE * 1.2)
        assert theirs.acquire()
        theirs.release()


def test_a_lock_that_cannot_be_broken_is_built_without(tmp_path: Path) -> None:
    """The member also holds the folder's unlinking lock, so no lock can be broken: the
    caller builds without a lease, at once, instead of waiting out its deadline."""
    cache = _cache(tmp_path)
    key = _key()
    path = _lock_path(cache, key)
    with _holding(PLANTED, str(path), "", str(path.parent / ".unlinking")):
        started = time.monotonic()
        assert cache.get_or_build(key, lambda: b"built here") == b"built here"
        assert time.monotonic() - started < 8.0  # the grace, then the unlinking lock's 1 s
    assert cache.get(key) == b"built here"


def test_a_private_folder_signs_nothing(tmp_path: Path) -> None:
    """In one's own folder a lock is one's own processes': no token is written, and an
    unsigned lock (an earlier version's holder) is waited for as before."""
    cache = rc.Cache(rc.open_backend(f"dir://{tmp_path}"), secret=SECRET)
    lease = cache.backend.lease(str(_key()), 30.0)
    assert isinstance(lease, DirLease) and lease.acquire()
    assert (tmp_path / lease.path).read_bytes() == b""
    lease.release()
    shared = _cache(tmp_path / "shared")
    held = shared.backend.lease(str(_key()), 30.0)
    assert isinstance(held, DirLease) and held.acquire()
    token = (tmp_path / "shared" / held.path).read_bytes()
    assert token.count(b".") == 2 and len(token) > 60
    held.release()
    assert os.path.exists(tmp_path / "shared" / ".locks")


def test_build_all_is_held_off_by_no_planted_lock(ctx: Any, tmp_path: Path) -> None:
    """``build_all`` asks for a new lease at each try: the look that starts the grace is
    the folder's, not one lease object's (it waited 92 s with three planted locks)."""
    from runtime_cache.opencl import OpenCLModule

    sources = {
        f"k{i}": f"__kernel void k{i}(__global float *a) {{ a[get_global_id(0)] *= {i}.5f; }}"
        for i in range(3)
    }
    cache = _cache(tmp_path)
    first = OpenCLModule(ctx, sources, cache=cache)
    first.build_all()
    keys = [key for name in sources for key in first._plan(name).keys or ()]
    locks = [_lock_path(cache, key) for key in keys]
    for key in keys:
        cache.delete(key)
    with contextlib.ExitStack() as stack:
        for lock in locks:
            stack.enter_context(_holding(PLANTED, str(lock), ""))
        started = time.monotonic()
        again = OpenCLModule(ctx, sources, cache=cache)
        again.build_all()
        assert time.monotonic() - started < 10.0
    assert again.built == sorted(sources)
    assert all(cache.get(key) is not None for key in keys)


@pytest.mark.parametrize("junk", ["fifo", "file", "link"])
def test_junk_at_the_locks_folders_name_is_replaced(tmp_path: Path, junk: str) -> None:
    """Operator review, session 36: a FIFO planted at ``.locks`` kept leases off for good,
    with a warning at each run; it is removed (a link never followed) and the folder made."""
    root = tmp_path / "cache"
    backend = rc.open_backend(f"dir://{root}")
    locks, target = root / ".locks", tmp_path / "elsewhere"
    target.mkdir()
    if junk == "fifo":
        os.mkfifo(locks)
    elif junk == "file":
        locks.write_bytes(b"x")
    else:
        locks.symlink_to(target)
    lease = backend.lease(str(_key()), 30.0)
    assert lease is not None and lease.acquire()
    lease.release()
    assert locks.is_dir() and not locks.is_symlink()
    assert list(target.iterdir()) == []


def test_a_look_from_an_earlier_wait_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """The review of the fix: a look with no token stayed for the life of the process, so
    a later wait broke another holder, in its moment between lock and token, at once."""
    from runtime_cache.backends.lease_tokens import LeaseSigning

    signing = LeaseSigning()
    monkeypatch.setattr(LeaseSigning, "FORGET_AFTER", 0.2)
    assert signing.unsigned_for("a.lock") == 0.0
    time.sleep(0.1)
    assert 0.09 < signing.unsigned_for("a.lock") < 0.2  # the same wait: counted on
    time.sleep(0.3)
    assert signing.unsigned_for("a.lock") == 0.0  # a later wait: from its own first look
    assert signing.unsigned_for("b.lock") == 0.0
    signing.signed("a.lock")
    assert signing.unsigned_for("a.lock") == 0.0
