"""Build leases between machines whose clocks differ: a live holder's lease is never taken.

A reviewer confirmed two ways clock skew let two processes build one key: on ``redis://``
with a secret, a taker whose clock ran 26-40 s ahead of a live holder's judged the holder's
signed token run out (it was stamped and judged by each machine's ``time.time()``) and
swapped it out; on ``dir://``, a taker whose clock ran 20 s ahead of the file system's judged
a live holder's lock file stale (its time is the file system's) and broke it. A machine's
clock is shifted here by replacing ``time.time`` in one process, or in this one while the
taker looks: the server's and the file system's clocks stay true, as another machine's
would.
"""

from __future__ import annotations

import os
import secrets
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from conftest import holding
from runtime_cache.backends import dir_lease, lease_tokens
from runtime_cache.backends.dir_fs import NOFOLLOW
from runtime_cache.backends.dir_lease import DirLease
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.lease import Lease

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

KEY = "fleet/test/00112233445566778899aabbccddeeff"
SECRET = "fleet-secret"
#: A lease's time to live here: 3 s + the 10 s slack is well inside a 40 s skew.
TTL = 3.0

#: A holder on a machine whose wall clock is off by argv[3] seconds: it takes the lease,
#: leaves a note (5 s), says so, and lives on (renewing) until killed.
SKEWED_HOLDER = textwrap.dedent(
    """
    import sys, time
    _true_time = time.time
    time.time = lambda: _true_time() + float(sys.argv[3])
    import runtime_cache as rc
    cache = rc.Cache(rc.open_backend(sys.argv[1]), secret=sys.argv[2])
    lease = cache.backend.lease(sys.argv[4], float(sys.argv[5]))
    assert lease is not None and lease.acquire()
    lease.note_unstored(5.0)
    print("held", flush=True)
    time.sleep(60)
    """
)


@contextmanager
def skewed_holder(url: str, shift: float, cwd: Path) -> Iterator[None]:
    """A live holder of ``KEY``'s lease whose clock is off by ``shift`` seconds."""
    args = [sys.executable, "-c", SKEWED_HOLDER, url, SECRET, str(shift), KEY, str(TTL)]
    with holding(args, cwd):
        yield


def _shift_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    true_time = time.time
    monkeypatch.setattr(time, "time", lambda: true_time() + seconds)


def _lease(backend: rc.Backend, ttl: float = TTL, key: str = KEY) -> Lease:
    lease = backend.lease(key, ttl)
    assert lease is not None
    return lease


@pytest.fixture(params=["redis", "redis-cluster"])
def redis_url(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[str]:
    fixture = "redis_server" if request.param == "redis" else "redis_cluster"
    server: RedisProcess | RedisCluster = request.getfixturevalue(fixture)
    yield f"{server.url}?prefix={unique_prefix}"


@pytest.mark.parametrize(
    ("holder_shift", "taker_shift"),
    [(-40.0, 0.0), (0.0, 40.0), (40.0, 0.0)],
    ids=["holder-40s-behind", "taker-40s-ahead", "holder-40s-ahead"],
)
def test_a_signed_lease_is_never_taken_from_a_live_holder_whose_clock_differs(
    redis_url: str,
    holder_shift: float,
    taker_shift: float,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the fix the taker found the holder's token run out by its own clock (a 40 s
    lead over the holder's), swapped it out and held the lease too; its note was no note."""
    cache = rc.Cache(rc.open_backend(redis_url), secret=SECRET)
    with skewed_holder(redis_url, holder_shift, tmp_path):
        _shift_clock(monkeypatch, taker_shift)
        taker = _lease(cache.backend)
        for _ in range(2):  # the holder's first token, then one a renewal made
            assert not taker.acquire(), "a live holder's lease was taken over"
            time.sleep(TTL / 3 + 0.2)
        assert taker.unstored(), "the holder's note was judged run out"
        monkeypatch.undo()
    cache.close()


def _plant(redis_port: int, name: str, value: bytes) -> None:
    import redis

    direct = redis.Redis(port=redis_port)
    direct.set(name, value, px=60_000)  # under an hour: not removed as no lease's
    direct.close()


def _signed(backend: rc.Backend, name: str, expiry_ms: int) -> bytes:
    """A token signed with the backend's secret for ``name``, running out at ``expiry_ms``
    on the server's clock (made as a holder makes one: :mod:`.lease_tokens`)."""
    key = backend._lease_keys[0]  # type: ignore[attr-defined]
    nonce, expiry = secrets.token_hex(16), str(expiry_ms)
    return f"{nonce}.{expiry}.{lease_tokens._mac(key, name, nonce, expiry)}".encode()


@pytest.mark.parametrize("taker_shift", [-40.0, 0.0, 40.0])
def test_a_token_that_ran_out_by_the_servers_clock_is_taken_over(
    redis_server: RedisProcess,
    unique_prefix: str,
    taker_shift: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A token that ran out 20 s ago on the server's clock counts for nothing, whatever the
    taker's clock says (before the fix, a taker 40 s behind judged it live and waited)."""
    import redis

    cache = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}"), secret=SECRET)
    name = f"{unique_prefix}lease:{KEY}"
    seconds, micros = redis.Redis(port=redis_server.port).time()
    server_ms = seconds * 1000 + micros // 1000
    _plant(redis_server.port, name, _signed(cache.backend, name, server_ms - 20_000))
    _shift_clock(monkeypatch, taker_shift)
    taker = _lease(cache.backend)
    assert taker.acquire(), "a token that ran out on the server's clock held the taker off"
    taker.release()
    # One that runs out in 20 s on the server's clock is a live holder's, for every taker.
    _plant(redis_server.port, name, _signed(cache.backend, name, server_ms + 20_000))
    assert not _lease(cache.backend).acquire()
    monkeypatch.undo()
    cache.close()


@pytest.mark.parametrize("taker_shift", [-40.0, 40.0])
def test_a_planted_unsigned_string_still_holds_no_skewed_taker_off(
    redis_server: RedisProcess,
    unique_prefix: str,
    taker_shift: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}"), secret=SECRET)
    name = f"{unique_prefix}lease:{KEY}"
    _shift_clock(monkeypatch, taker_shift)
    for planted in (b"unsigned", b"", b"0" * 32 + b".9999999999999." + b"f" * 32):
        _plant(redis_server.port, name, planted)
        taker = _lease(cache.backend)
        assert taker.acquire(), planted
        taker.release()
    monkeypatch.undo()
    cache.close()


def test_the_servers_clock_is_learned_once_per_node_not_at_each_take(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first signed take on a node costs one more round trip (the clock's reading);
    later takes, renewals and notes cost none."""
    from runtime_cache.backends import redis_clock

    backend = rc.Cache(rc.open_backend(redis_url), secret=SECRET).backend
    client: Any = backend._get_client()  # type: ignore[attr-defined]
    sent: list[str] = []
    real_eval = client.eval

    def counting_eval(script: str, *args: Any) -> Any:
        sent.append(script)
        return real_eval(script, *args)

    monkeypatch.setattr(client, "eval", counting_eval)
    for i in range(12):
        lease = _lease(backend, key=f"{KEY}{i}")
        assert lease.acquire() and lease.renew()
        lease.note_unstored(1.0)
        lease.release()
    nodes = 1 if "cluster" not in redis_url else 3
    assert 1 <= sent.count(redis_clock._READ) <= nodes
    backend.close()


def test_a_reading_of_the_servers_clock_is_carried_forward_and_learned_anew() -> None:
    """Carried forward by the monotonic clock; read again after RELEARN_SECONDS, or once
    the wall clock moved apart from the monotonic one (the machine slept: the monotonic
    clock stood still, and carrying the reading forward would stamp tokens too early)."""
    from runtime_cache.backends.redis_clock import RELEARN_SECONDS, ServerClock

    local = {"monotonic": 100.0, "wall": 5_000.0}
    server = {"ms": 1_700_000_000_000, "reads": 0}

    class Client:  # the server's clock only: what ServerClock asks of a client
        def eval(self, script: str, numkeys: int, name: str) -> int:
            server["reads"] += 1
            return server["ms"]

    def advance(seconds: float, slept: float = 0.0) -> None:
        local["monotonic"] += seconds
        local["wall"] += seconds + slept
        server["ms"] += int((seconds + slept) * 1000)

    clock = ServerClock(lambda: local["monotonic"], lambda: local["wall"])
    assert clock.now_ms(Client(), "a") == server["ms"] and server["reads"] == 1
    advance(10.0)
    assert clock.now_ms(Client(), "b") == server["ms"] and server["reads"] == 1
    advance(0.0, slept=600.0)  # suspended for 10 minutes
    assert clock.now_ms(Client(), "a") == server["ms"] and server["reads"] == 2
    advance(RELEARN_SECONDS + 1)
    server["ms"] += 30_000  # the server's clock was set 30 s ahead meanwhile
    assert clock.now_ms(Client(), "a") == server["ms"] and server["reads"] == 3


# ------------------------------------------------------------------------------ dir://


def test_a_dir_taker_whose_clock_runs_ahead_breaks_no_live_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the taker, 20 s ahead of the file system's clock, found the lock
    touched just now "untouched for 10 s", broke it and held the lease too."""
    backend = DirectoryBackend(tmp_path)  # kept: its root descriptor closes with it
    holder = DirLease(backend.root_fd, KEY, 10.0)
    assert holder.acquire()
    _shift_clock(monkeypatch, 20.0)
    taker = DirLease(backend.root_fd, KEY, 10.0)
    assert not taker.acquire(), "a live holder's lock was broken as stale"
    monkeypatch.undo()
    assert holder.renew() and not holder.lost
    assert [p.name for p in (tmp_path / ".locks").iterdir()] == [holder.name]  # no probe left
    holder.release()


@pytest.mark.parametrize("taker_shift", [-20.0, 0.0, 20.0])
def test_a_dir_lock_untouched_for_its_ttl_is_still_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taker_shift: float
) -> None:
    backend = DirectoryBackend(tmp_path)
    hung = DirLease(backend.root_fd, KEY, 10.0)
    assert hung.acquire()
    old = time.time() - 60  # its holder hung a minute ago (by the file system's clock)
    os.utime(tmp_path / hung.path, (old, old))
    _shift_clock(monkeypatch, taker_shift)
    taker = DirLease(backend.root_fd, KEY, 10.0)
    assert taker.acquire()
    monkeypatch.undo()
    assert not hung.renew() and hung.lost
    taker.release()
    hung.release()
    assert [p.name for p in (tmp_path / ".locks").iterdir()] == [".unlinking"]


def test_a_dir_lock_is_judged_by_the_local_clock_where_no_probe_can_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = DirectoryBackend(tmp_path)
    hung = DirLease(backend.root_fd, KEY, 10.0)
    assert hung.acquire()
    old = time.time() - 60
    os.utime(tmp_path / hung.path, (old, old))
    # No O_CREAT: the probe's open fails, as in a folder closed to this process.
    monkeypatch.setattr(dir_lease, "_PROBE_FLAGS", os.O_RDONLY | NOFOLLOW)
    taker = DirLease(backend.root_fd, KEY, 10.0)
    assert taker.acquire()  # broken by the local clock: a minute untouched
    assert not hung.renew()
    taker.release()
    hung.release()
