"""A hostile member of a ``dir://...?shared=1`` cache's group, tried with two real users.

The test makes a group and two users in it (``useradd``), a victim and a
hostile member. The victim runs as a long-lived child that takes one command
per line; every command must answer within 5 seconds. The hostile member
plants links, FIFOs, folders, a sparse terabyte, 60,000 one-byte entries,
swapped and stopped locks, and renames folders aside. Then the victim's
private files are unchanged, nothing is written outside the cache, no planted
entry is served, and the victim keeps its own recent entries.

Needs root (to make the users); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import system_users

import runtime_cache as rc
from conftest import holding
from runtime_cache.backends.dir_lease import DirLease
from runtime_cache.backends.dir_tree import rel_path

SECRET = "group-secret"
CALL_LIMIT = 5.0

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="needs root and useradd to make two real users in one group",
)

# Imports come first: once a child drops to a plain user, the interpreter's own
# files (under /root here) may no longer be readable.
PRELUDE = """
import grp, json, os, pwd, select, signal, sys, time, fcntl
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.dir_tree import rel_path
from runtime_cache.backends.dir_lease import DirLease  # (a lease imports it on first use)
for name in rc.__all__:  # its names load on first use: load them before the switch
    getattr(rc, name)
uid, gid = int(sys.argv[1]), int(sys.argv[2])
os.setgroups([gid]); os.setgid(gid); os.setuid(uid); os.umask(0o007)
"""

VICTIM = """
root, cap, stale = sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
backend = DirectoryBackend(root, shared=True, max_size=cap or None)
backend.lock_stale_after = stale
cache = rc.Cache(backend, secret=sys.argv[6])
def key(i):
    return rc.make_key(module_id=f"m{i}", runtime="grp", purpose="test")
def value(i, size):
    return (f"victim-{i}-".encode() * size)[:size]
sizes = {}
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    op, *args = line.split()
    n = [int(a) for a in args]
    if op == "put":
        sizes[n[0]] = n[1]
        out = cache.put(key(n[0]), value(n[0], n[1]))
    elif op == "build":  # get_or_build under the key's lease
        sizes[n[0]] = n[1]
        out = cache.get_or_build(key(n[0]), lambda: value(n[0], n[1])) == value(n[0], n[1])
    elif op == "get":
        got = cache.get(key(n[0]))
        ours = got == value(n[0], sizes.get(n[0], 0))
        out = None if got is None else ("ours" if ours else "other")
    elif op in ("many", "tiered-many"):
        reader = cache
        if op == "tiered-many":  # a memory tier in front, empty: the batch reads the folder
            url = f"memory://,dir://{root}?shared=1"
            reader = rc.Cache(rc.open_backend(url), secret=sys.argv[6])
        got = reader.get_many([key(i) for i in n])
        out = sorted(i for i in n if got.get(str(key(i))) == value(i, sizes.get(i, 0)))
    elif op == "vacuum":
        out = backend.vacuum()
    elif op == "enforce":
        out = backend.enforce_size(budget=1.5)
    elif op == "ls":
        out = len(list(cache.entries()))
    elif op == "flush":
        backend.flush_hits(); out = True
    elif op == "stats":
        s = cache.stats()
        locks = backend.lock_stats
        out = {"junk": backend.junk, "skipped": locks.skipped, "broken": locks.broken,
               "errors": s.errors, "read_only": backend.read_only, "disk": backend.total_size()}
    else:
        out = "unknown"
    print(json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class Group:
    victim: User
    hostile: User
    base: Path  # traversable by both; holds the cache and each user's private folder

    @property
    def root(self) -> Path:
        return self.base / "cache"


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    tag = f"{os.getpid() % 100000}"
    group, names = f"rc14g{tag}", (f"rc14v{tag}", f"rc14h{tag}")
    system_users.add_group(group)
    try:
        for name in names:
            system_users.add_user(name, group, "-s", "/usr/sbin/nologin")
        import grp
        import pwd

        gid = grp.getgrnam(group).gr_gid
        victim, hostile = (User(n, pwd.getpwnam(n).pw_uid, gid) for n in names)
        yield victim, hostile
    finally:
        system_users.remove(list(names), [group])


@pytest.fixture
def group(users: tuple[User, User]) -> Iterator[Group]:
    victim, hostile = users
    base = Path(tempfile.mkdtemp(prefix="rc-group-", dir="/tmp"))
    base.chmod(0o755)
    root = base / "cache"
    root.mkdir()
    os.chown(root, 0, victim.gid)
    root.chmod(0o2770)  # what an admin sets up: the group's setgid folder
    private = base / "victim"
    private.mkdir(mode=0o700)
    (private / "private").write_bytes(b"precious")
    os.chown(private, victim.uid, victim.gid)
    os.chown(private / "private", victim.uid, victim.gid)
    outside = base / "outside"  # the hostile member's own folder, open to all
    outside.mkdir()
    outside.chmod(0o777)
    try:
        yield Group(victim, hostile, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Victim:
    """The victim's process: one command per line, each answered within CALL_LIMIT seconds."""

    calls = 0  # across the module, for the report (pytest -s prints it)
    slowest = 0.0

    def __init__(self, g: Group, cap: int = 0, stale: float = 30.0) -> None:
        user = g.victim
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                PRELUDE + VICTIM,
                str(user.uid),
                str(user.gid),
                str(g.root),
                str(cap),
                str(stale),
                SECRET,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HOME": "/tmp"},
        )
        assert self._answer("start", 30.0) == "ready"

    def _answer(self, what: str, limit: float = CALL_LIMIT) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], limit)
        if not ready:
            self.proc.kill()
            pytest.fail(f"victim's {what!r} did not return within {limit} s")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            pytest.fail(
                f"victim died on {what!r}: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        return json.loads(line)

    def __call__(self, command: str) -> Any:
        assert self.proc.stdin is not None
        start = time.monotonic()
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        out = self._answer(command)
        took = time.monotonic() - start
        assert took < CALL_LIMIT, command
        Victim.calls += 1
        Victim.slowest = max(Victim.slowest, took)
        return out

    def close(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)
        return self.proc.stderr.read() if self.proc.stderr else ""


def as_user(user: User, code: str, *args: str) -> str:
    """Run ``code`` as ``user`` (args after uid and gid); return its stdout."""
    run = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, str(user.uid), str(user.gid), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": "/tmp"},
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="grp", purpose="test")


def entry(g: Group, i: int) -> Path:
    return g.root / rel_path(str(key(i)))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their target text) with its bytes."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            seen[str(path)] = os.readlink(path).encode()
        elif path.is_file():
            seen[str(path)] = path.read_bytes()
    return seen


# ------------------------------------------------------------------ the plants
PLANT = """
root, private, outside = sys.argv[3], sys.argv[4], sys.argv[5]
paths = json.loads(sys.argv[6])
for name in (".hits", ".vacuumed", ".evict.lock", f".tmp-hits-{os.getpid()}", ".tmp-0"):
    target = os.path.join(root, name)
    if os.path.lexists(target):
        os.unlink(target)
    os.symlink(private, target)
link, fifo, folder, sparse, unsigned, copied = paths
os.unlink(link); os.symlink(private, link)
os.unlink(fifo); os.mkfifo(fifo, 0o660)
os.unlink(folder); os.mkdir(folder); open(os.path.join(folder, "x"), "w").close()
with open(sparse, "wb") as f:
    f.truncate(1 << 40)
untrusted = rc.Cache(DirectoryBackend(outside))  # the hostile member's own, unsigned
planted_key = rc.make_key(module_id="m4", runtime="grp", purpose="test")
untrusted.put(planted_key, b"planted")
os.replace(os.path.join(outside, rel_path(str(planted_key))), unsigned)
os.replace(copied[0], copied[1])  # a real signed entry, under another key's name
print("planted")
"""


def test_planted_links_fifos_folders_and_sparse_files(group: Group) -> None:
    g = group
    victim = Victim(g)
    for i in range(10):
        assert victim(f"put {i} 3000") is True
    assert victim("flush") is True
    private_before = (g.base / "victim" / "private").read_bytes()
    paths = [str(entry(g, i)) for i in range(5)] + [[str(entry(g, 5)), str(entry(g, 6))]]
    hostile_out = g.base / "outside" / "hostile-cache"
    out = as_user(
        g.hostile,
        PLANT,
        str(g.root),
        str(g.base / "victim" / "private"),
        str(hostile_out),
        json.dumps(paths),
    )
    assert out.strip() == "planted"
    outside_before = snapshot(g.base / "outside")

    got = [victim(f"get {i}") for i in range(10)]
    # link, FIFO, folder, sparse: misses; unsigned plant and moved entry: not served
    assert got[:7] == [None] * 7
    assert got[7:] == ["ours"] * 3  # the victim's untouched entries stay
    stats = victim("stats")
    assert stats["junk"] >= 4 and not stats["read_only"]
    for i in range(10):
        assert victim(f"put {i} 3000") is True
    assert victim("vacuum") >= 0
    assert victim("enforce") == 0
    assert victim("flush") is True
    assert victim("ls") == 10
    assert [victim(f"get {i}") for i in range(10)] == ["ours"] * 10
    victim.close()

    assert (g.base / "victim" / "private").read_bytes() == private_before == b"precious"
    assert sorted(os.listdir(g.base / "victim")) == ["private"]
    assert snapshot(g.base / "outside") == outside_before
    for name in (".hits", ".vacuumed", ".evict.lock"):
        path = g.root / name
        assert not path.is_symlink() or os.readlink(path) == str(g.base / "victim" / "private")
    # what the victim made is the group's to read and write
    for path in g.root.rglob("*.rce"):
        assert path.stat().st_mode & 0o660 == 0o660 and path.stat().st_gid == g.victim.gid


RENAME = """
import shutil
root, outside, folder = sys.argv[3], sys.argv[4], sys.argv[5]
moved = os.path.join(outside, "moved")
os.rename(os.path.join(root, folder), moved)    # the victim's folder, out of the cache
os.symlink(moved, os.path.join(root, folder))  # and a link to it in its place
print("renamed")
"""


def test_renamed_folder_and_link_cannot_redirect_writes(group: Group) -> None:
    g = group
    victim = Victim(g)
    assert victim("put 0 2000") is True
    assert as_user(g.hostile, RENAME, str(g.root), str(g.base / "outside"), "grp") == "renamed\n"
    outside_before = snapshot(g.base / "outside")
    assert victim("get 0") is None  # the old file is out of the cache now
    for i in range(1, 6):
        assert victim(f"put {i} 2000") is True
    assert [victim(f"get {i}") for i in range(1, 6)] == ["ours"] * 5
    assert victim("vacuum") >= 0
    assert victim("ls") == 5
    victim.close()
    assert snapshot(g.base / "outside") == outside_before
    assert not (g.root / "grp").is_symlink() and (g.root / "grp").is_dir()


FLOOD = """
root, count = sys.argv[3], int(sys.argv[4])
made = set()
for n in range(count):
    name = f"{n:032x}"
    folder = os.path.join(root, "flood", "x", name[-2:])
    if folder not in made:
        os.makedirs(folder, exist_ok=True); made.add(folder)
    # the fan-out folder holds the last two digits' files under names that start with them
    path = os.path.join(folder, name[-2:] + name[2:] + ".rce")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o660); os.write(fd, b"x"); os.close(fd)
sparse = os.path.join(root, "flood", "x", "ff", "ffsparse.rce")
with open(sparse, "wb") as f:
    f.truncate(1 << 40)
print("flooded")
"""


def _entry_disk(root: Path) -> int:
    total = 0
    for path in root.rglob("*.rce"):
        st = path.lstat()
        if path.is_file() and not path.is_symlink():
            total += st.st_blocks * 512
    return total


def test_flood_and_sparse_terabyte_keep_the_cap_and_the_victims_entries(group: Group) -> None:
    g = group
    cap = 10_000_000
    victim = Victim(g, cap=cap)
    for i in range(40):
        assert victim(f"put {i} 50000") is True
    assert as_user(g.hostile, FLOOD, str(g.root), "60000") == "flooded\n"
    assert _entry_disk(g.root) > 2 * cap  # 60,000 blocks of one byte each, and more
    for i in range(40, 60):
        assert victim(f"put {i} 50000") is True
    for _ in range(12):  # each turn walks and evicts for 1.5 s each; a few catch up with a flood
        victim("enforce")
        stats = victim("stats")
        if stats["disk"] <= 1.1 * cap:
            break
    assert stats["disk"] <= 1.1 * cap and not stats["read_only"]
    # the victim's own recent entries are all kept, and served
    assert [victim(f"get {i}") for i in range(40, 60)] == ["ours"] * 20
    victim.close()
    assert _entry_disk(g.root) <= 1.1 * cap
    print(
        f"\nflood: disk {_entry_disk(g.root) / cap:.2f} x cap; victim calls so far {Victim.calls}"
    )
    assert not (g.root / "flood" / "x" / "ff" / "ffsparse.rce").exists()  # junk: removed


HOLD = """
root, name, fresh = sys.argv[3], sys.argv[4], sys.argv[5] == "1"
path = os.path.join(root, name)
if fresh:  # swap the lock for one of our own
    if os.path.lexists(path):
        os.unlink(path)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o660)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
while True:
    if fresh:
        os.utime(fd)
    time.sleep(0.2)
"""


def _holder(g: Group, user: User, fresh: bool) -> subprocess.Popen[str]:
    args = [str(user.uid), str(user.gid), str(g.root), ".evict.lock", "1" if fresh else "0"]
    proc = subprocess.Popen(
        [sys.executable, "-c", PRELUDE + HOLD, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": "/tmp"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_swapped_lock_held_by_another_member_never_blocks(group: Group) -> None:
    g = group
    holder = _holder(g, g.hostile, fresh=True)
    try:
        victim = Victim(g, cap=200_000)
        for i in range(20):  # far over the cap: writers would wait on the lock
            assert victim(f"put {i} 20000") is True
        stats = victim("stats")
        assert stats["skipped"] >= 1 and not stats["read_only"]
        assert [victim(f"get {i}") for i in range(15, 20)] == ["ours"] * 5
        victim.close()
    finally:
        holder.kill()
        holder.wait()


def test_stopped_evictor_is_broken_and_the_cap_kept(group: Group) -> None:
    g = group
    holder = _holder(g, g.victim, fresh=False)  # one of the victim's own processes
    os.kill(holder.pid, signal.SIGSTOP)  # Ctrl-Z while it holds the eviction lock
    try:
        victim = Victim(g, cap=200_000, stale=1.0)
        time.sleep(1.2)  # the stopped holder's lock goes stale
        for i in range(40):
            assert victim(f"put {i} 20000") is True
        assert victim("enforce") >= 0
        stats = victim("stats")
        assert stats["broken"] >= 1 and stats["disk"] <= 1.1 * 200_000
        assert [victim(f"get {i}") for i in range(37, 40)] == ["ours"] * 3
        victim.close()
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()


HOLD_LEASE = """
fd = os.open(sys.argv[3], os.O_RDWR | os.O_CREAT, 0o660)  # a key's lock, with no token
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
while True:
    os.utime(fd); time.sleep(0.2)  # kept fresh: never stale
"""


def test_a_lease_held_without_the_secret_holds_nobody_off(group: Group) -> None:
    """The attacker review of session 36: a member without the secret held a key's lock and
    touched it, and every ``get_or_build`` of the key waited out its deadline (92 s)."""
    g = group
    victim = Victim(g)
    assert victim("build 0 100") is True  # the folder of locks, made by the victim
    lock = g.root / ".locks" / DirLease(-1, str(key(1)), 30.0).name
    user = g.hostile
    command = [sys.executable, "-c", PRELUDE + HOLD_LEASE, str(user.uid), str(user.gid), str(lock)]
    with holding(command, env={**os.environ, "HOME": "/tmp"}):
        assert victim("build 1 100") is True  # within CALL_LIMIT
        assert victim("get 1") == "ours"
        victim.close()


UNREADABLE = """
path = sys.argv[3]
os.unlink(path)
fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)  # the hostile member's, unreadable to others
os.write(fd, b"not for you"); os.close(fd)
print("planted")
"""


def test_an_unreadable_entry_is_not_read_only(group: Group) -> None:
    g = group
    victim = Victim(g)
    assert victim("put 0 1000") is True and victim("put 1 1000") is True
    assert as_user(g.hostile, UNREADABLE, str(entry(g, 0))) == "planted\n"
    assert victim("get 0") is None  # a failed read: a miss, counted as an error
    assert victim("get 1") == "ours"
    stats = victim("stats")
    assert stats["errors"] == 1 and not stats["read_only"]
    assert victim("put 0 1000") is True  # writes go on
    assert victim("get 0") == "ours"
    log = victim.close()
    assert str(entry(g, 0)) in log and "read-only" not in log


def test_an_unreadable_entry_costs_its_key_not_the_batch(group: Group) -> None:
    """One unreadable file made get_many return nothing (0 of 10) in the attacker review:
    the batch read stopped at the first error. The OpenCL read-ahead reads in batches."""
    g = group
    victim = Victim(g)
    for i in range(10):
        assert victim(f"put {i} 1000") is True
    assert as_user(g.hostile, UNREADABLE, str(entry(g, 3))) == "planted\n"
    assert victim("many " + " ".join(map(str, range(10)))) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert victim("stats")["errors"] == 1
    # Through tiers too (0 of 10 before: the tier's whole batch counted as failed).
    assert victim("tiered-many " + " ".join(map(str, range(10)))) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    victim.close()


def test_report() -> None:
    """Print the victim's call count and slowest call (pytest -s shows them)."""
    print(f"\nvictim calls {Victim.calls}, slowest {Victim.slowest:.2f} s")
    assert Victim.slowest < CALL_LIMIT
