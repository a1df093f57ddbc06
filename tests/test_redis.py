"""RedisBackend against a real redis-server: conformance, URL options, TTL, prefixes, fork."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from redis_backends import drop_keys, open_redis

import runtime_cache as rc
from runtime_cache.errors import InvalidURLError, MissingDependencyError
from runtime_cache.testing import BackendConformance, CacheConformance

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

pytestmark = pytest.mark.redis


class TestStandaloneConformance(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self, redis_server: RedisProcess, unique_prefix: str) -> Iterator[rc.Backend]:
        backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
        yield backend
        drop_keys(backend)


class TestClusterConformance(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self, redis_cluster: RedisCluster, unique_prefix: str) -> Iterator[rc.Backend]:
        backend = open_redis(f"{redis_cluster.url}?prefix={unique_prefix}")
        yield backend
        drop_keys(backend)


def test_cluster_keys_span_every_node(redis_cluster: RedisCluster, unique_prefix: str) -> None:
    import redis

    backend = open_redis(f"{redis_cluster.url}?prefix={unique_prefix}")
    keys = {f"span/{i:04d}" for i in range(60)}
    backend.set_many({k: k.encode() for k in keys})
    holding = 0
    for node in redis_cluster.nodes:
        direct = redis.Redis(port=node.port)
        holding += bool(list(direct.scan_iter(match=f"{unique_prefix}span/*", count=1000)))
        direct.close()
    assert holding == len(redis_cluster.nodes)  # 60 keys hash to every node's slots
    assert set(backend.keys("span/")) == keys
    assert backend.get_many(sorted(keys)) == {k: k.encode() for k in keys}
    drop_keys(backend)


def test_url_options(redis_server: RedisProcess) -> None:
    from runtime_cache.backends.redis import RedisBackend

    backend = open_redis(
        f"{redis_server.url}?namespace=team&ttl=2h&timeout=300ms&connect_timeout=100ms"
        "&max_connections=8&backoff=50ms&max_backoff=2s"
    )
    assert isinstance(backend, RedisBackend)
    assert (backend.prefix, backend.ttl) == ("team:", 7200.0)
    assert (backend.timeout, backend.connect_timeout, backend.max_connections) == (0.3, 0.1, 8)
    assert (backend.breaker.backoff, backend.breaker.max_backoff) == (0.05, 2.0)
    defaults = open_redis(redis_server.url)
    assert isinstance(defaults, RedisBackend)
    assert (defaults.prefix, defaults.ttl, defaults.timeout, defaults.connect_timeout) == (
        "rc:",
        None,
        0.5,
        0.2,
    )
    assert backend.remote and type(backend).remote


@pytest.mark.parametrize(
    "query",
    [
        "colour=red",
        "prefix=a&namespace=b",
        "ttl=soon",
        "timeout=-1",
        "max_connections=x",
        # (the operator review: a URL made from an unset variable covered the whole database)
        "namespace=",
        "prefix=",
        "namespace=%20",
        # (the attacker review: prefix=app listed, cleared and repaired prefix=app2's keys)
        "prefix=app",
        "prefix=rc:opencl/",
        # (the review of the fix: rc: listed, and verify --repair removed, rc:team/ml:'s keys)
        "namespace=rc:team/ml",
        "prefix=rc:team/ml:",
    ],
)
def test_bad_url_options_are_rejected(redis_server: RedisProcess, query: str) -> None:
    with pytest.raises(InvalidURLError):
        rc.open_backend(f"{redis_server.url}?{query}")


def test_cluster_url_rejects_a_database() -> None:
    from redis_servers import require_redis

    require_redis()  # redis-py only; no server needed
    with pytest.raises(InvalidURLError):
        rc.open_backend("redis+cluster://127.0.0.1:7000/3")


@pytest.mark.parametrize("path", ["/abc", "/3/x", "/-1", "/1.5", "/ 2", "/\u0663"])
def test_a_database_path_that_is_not_a_number_is_rejected(path: str) -> None:
    """redis-py reads these as database 0: a typo would have used another's data."""
    from redis_servers import require_redis

    require_redis()  # redis-py only; no server needed
    with pytest.raises(InvalidURLError, match="database number"):
        rc.open_backend(f"redis://127.0.0.1:6379{path}?insecure=1")
    for good in ("", "/", "/0", "/15", "/0/", "/%31"):  # as redis-py reads them
        assert rc.open_backend(f"redis://127.0.0.1:6379{good}?insecure=1").name


def test_ttl_is_set_on_every_write(redis_server: RedisProcess, unique_prefix: str) -> None:
    import redis

    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}&ttl=1h")
    backend.set("one", b"1")
    backend.set_many({"two": b"2", "three": b"3"})
    direct = redis.Redis(port=redis_server.port)
    ttls = [direct.pttl(f"{unique_prefix}{k}") for k in ("one", "two", "three")]
    assert all(3_500_000 < t <= 3_600_000 for t in ttls), ttls
    direct.close()
    drop_keys(backend)


def test_prefixes_isolate_apps(redis_server: RedisProcess, unique_prefix: str) -> None:
    a = open_redis(f"{redis_server.url}?prefix={unique_prefix}a:")
    b = open_redis(f"{redis_server.url}?prefix={unique_prefix}b:")
    a.set("k", b"from a")
    assert b.get("k") is None and list(b.keys()) == []
    assert list(a.keys()) == ["k"]
    drop_keys(a)
    drop_keys(b)


def test_glob_characters_in_keys_are_literal(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    backend.set("g/a*b", b"1")
    backend.set("g/axb", b"2")
    backend.set("g/[x]", b"3")
    assert list(backend.keys("g/a*")) == ["g/a*b"]
    assert list(backend.keys("g/[")) == ["g/[x]"]
    drop_keys(backend)


def test_usable_after_fork(redis_server: RedisProcess, unique_prefix: str) -> None:
    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    backend.set("parent", b"p")  # the pool now holds a connection
    pid = os.fork()
    if pid == 0:  # child: must open its own connection, not share the parent's socket
        code = 1
        try:
            backend.set("child", b"c")
            code = 0 if backend.get("parent") == b"p" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.get("child") == b"c"
    assert backend.get("parent") == b"p"
    drop_keys(backend)


def test_missing_redis_py_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime_cache.backends.redis import RedisBackend

    monkeypatch.setitem(sys.modules, "redis", None)  # makes `import redis` raise ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'redis>=5\.0' 'hiredis>=2\.0'"):
        RedisBackend("redis://127.0.0.1:1/0")


def test_a_provider_url_works_end_to_end(
    redis_server: RedisProcess, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "test-secret")
    cache = rc.set_cache_provider(f"{redis_server.url}?prefix={unique_prefix}")
    key = rc.make_key(module_id="m", runtime="demo", purpose="e2e", device=None)
    assert cache.get_or_build(key, lambda: b"built once") == b"built once"
    other = rc.Cache(open_redis(f"{redis_server.url}?prefix={unique_prefix}"), secret="test-secret")
    assert other.get(key) == b"built once"
    assert [info.key for info in other.entries(runtime="demo")] == [str(key)]
    drop_keys(other.backend)


def test_tls_options_reach_redis_py() -> None:
    from redis_servers import require_redis

    require_redis()  # redis-py only; no server needed
    from runtime_cache.backends.redis import RedisBackend

    backend = rc.open_backend("rediss://:pw@cache.example:6380/1?ssl_cert_reqs=none")
    assert isinstance(backend, RedisBackend)
    assert backend._ssl_options == {"ssl_cert_reqs": "none"}
    assert "pw" not in repr(backend) and "pw" not in backend.name  # never log a password
    # TLS options need rediss://, and say so (an operator review found "unknown option").
    with pytest.raises(InvalidURLError, match=r"TLS options \(ssl_cert_reqs\) need rediss://"):
        rc.open_backend("redis://cache.example:6379/0?ssl_cert_reqs=none")
    # A typo failed every call (redis-py read it at the first connection), not the open.
    with pytest.raises(InvalidURLError, match="ssl_cert_reqs must be one of"):
        rc.open_backend("rediss://cache.example:6380/0?ssl_cert_reqs=bogus")


def test_a_namespace_never_lists_or_clears_one_nested_in_it(
    redis_server: RedisProcess, unique_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """namespace=team must not see team:ml's entries (its clear and verify --repair deleted
    them), nor the leases kept beside its entries."""
    from runtime_cache.cli import main

    outer = rc.Cache(open_redis(f"{redis_server.url}?prefix={unique_prefix}team:&insecure=1"))
    inner = rc.Cache(open_redis(f"{redis_server.url}?prefix={unique_prefix}team:ml:&insecure=1"))
    mine = rc.make_key(module_id="outer", runtime="demo", purpose="t")
    theirs = [rc.make_key(module_id=f"inner{i}", runtime="demo", purpose="t") for i in range(2)]
    outer.put(mine, b"outer")
    for k in theirs:
        inner.put(k, b"inner")
    lease = outer.backend.lease(str(mine), 30.0)
    assert lease.acquire()
    assert list(outer.backend.keys()) == [str(mine)]
    url = f"{redis_server.url}?prefix={unique_prefix}team:&insecure=1"
    assert main(["--cache", url, "verify", "--repair"]) == 0
    assert main(["--cache", url, "clear", "--yes"]) == 0
    capsys.readouterr()
    assert outer.get(mine) is None and all(inner.get(k) == b"inner" for k in theirs)
    assert lease.renew()  # the lease survived the clear
    lease.release()
    drop_keys(inner.backend)


@pytest.mark.parametrize("plant", ["no expiry", "a list", "a day"])
def test_a_key_planted_at_a_lease_holds_nobody_off(
    redis_server: RedisProcess, unique_prefix: str, plant: str
) -> None:
    import redis

    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    direct = redis.Redis(port=redis_server.port)
    name = f"{unique_prefix}lease:demo/t/abc"
    if plant == "no expiry":
        direct.set(name, b"forever")
    elif plant == "a list":
        direct.rpush(name, b"x")
    else:
        direct.set(name, b"long", px=86_400_000)
    lease = backend.lease("demo/t/abc", 30.0)
    assert lease.acquire()  # taken at once: the planted key could never have expired in time
    assert 0 < direct.pttl(name) <= 30_000
    assert not backend.lease("demo/t/abc", 30.0).acquire()  # a live lease stays a lease
    lease.release()
    direct.close()
    drop_keys(backend)


@pytest.mark.parametrize("swap", ["a large value", "a hash"])
def test_a_value_swapped_in_at_a_held_lease_is_not_read_into_the_scripts(
    redis_server: RedisProcess, unique_prefix: str, swap: str
) -> None:
    """Renewal and release compared the token with GET: a 400 MB value swapped in at the
    lease's name was copied into Lua (0.5 s, every client stalled, the breaker opened), and
    a hash made them raise WRONGTYPE. The type and length are asked first now."""
    import redis

    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    direct = redis.Redis(port=redis_server.port)
    name = f"{unique_prefix}lease:demo/t/swap"
    lease = backend.lease("demo/t/swap", 30.0)
    assert lease.acquire()
    if swap == "a large value":
        direct.set(name, b"x" * (64 << 20))
    else:
        direct.delete(name)
        direct.hset(name, "a", "b")
    direct.config_resetstat()
    assert not lease.renew()  # not ours any more
    lease.release()  # nothing raised, nothing removed
    assert direct.exists(name)
    # The scripts never read the value: no reply or Lua copy of 64 MiB was made.
    assert direct.info("commandstats").get("cmdstat_get") is None
    assert backend.breaker.state == "closed"
    direct.delete(name)
    direct.close()
    drop_keys(backend)


@pytest.mark.parametrize(
    "planted",
    [b"x", b"", b"0123456789abcdef" * 8, b"a" * 32 + b"." + b"9" * 13 + b"." + b"\xff" * 32],
    ids=["short", "empty", "long", "non-ascii"],  # the last raised in compare_digest (s40)
)
def test_with_a_secret_a_lease_planted_without_it_holds_no_build_off(
    redis_server: RedisProcess, unique_prefix: str, planted: bytes
) -> None:
    """A string at a lease's name that expires within the hour (so _TAKE keeps it) held
    every process off for its whole wait, 92 s per key by default (the attacker review).
    With a secret, lease tokens are signed: an unsigned one is removed and the lease taken."""
    import redis

    url = f"{redis_server.url}?prefix={unique_prefix}"
    key = rc.make_key(module_id="m", runtime="fleet", purpose="t")
    direct = redis.Redis(port=redis_server.port)
    name = f"{unique_prefix}lease:{key}"
    direct.set(name, planted, px=3_599_000)
    cache = rc.Cache(rc.open_backend(url), secret="fleet-secret")
    started = time.monotonic()
    assert cache.get_or_build(key, lambda: b"built") == b"built"
    assert time.monotonic() - started < 5
    assert cache.stats().leases_won == 1 and cache.stats().lease_waits == 0
    # A live holder with the secret (or an older one, while keys rotate) still holds.
    holder = rc.Cache(rc.open_backend(url), secret="fleet-secret").backend.lease("x/y/z", 30.0)
    assert holder is not None and holder.acquire()
    rotated = rc.Cache(rc.open_backend(url), secret=["new-fleet-secret", "fleet-secret"])
    other = rotated.backend.lease("x/y/z", 30.0)
    assert other is not None and not other.acquire()
    holder.release()
    assert other.acquire()
    other.release()
    direct.close()
    drop_keys(cache.backend)


def _takes_won_against(write: Any, backend: rc.Backend, key: str, port: int) -> int:
    """How many of 50 takes of ``key``'s lease win while a thread calls ``write(client)``
    over and over, as an attacker with no secret would."""
    import threading

    import redis

    stop = threading.Event()

    def attack() -> None:
        attacker = redis.Redis(port=port)
        while not stop.is_set():
            write(attacker)
        attacker.close()

    thread = threading.Thread(target=attack)
    thread.start()
    won = 0
    try:
        for _ in range(50):
            lease = backend.lease(key, 30.0)
            assert lease is not None
            won += lease.acquire()
            lease.release()
    finally:
        stop.set()
        thread.join()
    return won


def test_a_lease_planted_in_a_loop_or_replayed_holds_off_no_signed_taker(
    redis_server: RedisProcess, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third review: an attacker looping ``SET name x PX 60000 NX`` won the gap between
    the taker's removal and its take (the taker won 1 of 200 tries), and a holder's token
    copied from the store and planted again verified for ever. The swap is one step now,
    and a token runs out with its lease's time (plus a slack, 0 here)."""

    import redis

    from runtime_cache.backends import lease_tokens

    monkeypatch.setattr(lease_tokens, "SLACK_MS", 0)
    url = f"{redis_server.url}?prefix={unique_prefix}"
    name = f"{unique_prefix}lease:a/b/c"
    direct = redis.Redis(port=redis_server.port)
    backend = rc.Cache(rc.open_backend(url), secret="fleet-secret").backend

    def plant(attacker: redis.Redis) -> None:
        attacker.set(name, b"x", px=60_000, nx=True)

    assert _takes_won_against(plant, backend, "a/b/c", redis_server.port) == 50
    # A replayed token counts only until it runs out (here: the lease's 1 s time to live).
    holder = backend.lease("a/b/c", 1.0)
    assert holder.acquire()
    copied = direct.get(name)
    holder.release()
    direct.set(name, copied, px=3_599_000)
    taker = backend.lease("a/b/c", 1.0)
    assert not taker.acquire()  # still within its time: it may be a live holder
    time.sleep(1.2)
    assert taker.acquire()
    taker.release()
    direct.close()
    drop_keys(backend)


@pytest.mark.skipif(shutil.which("redis-benchmark") is None, reason="needs redis-benchmark")
def test_token_shaped_values_changed_in_a_loop_hold_no_signed_taker_off(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """The re-attack review of session 40: a writer without the secret pipelining SETs of
    random token-shaped values (redis-benchmark) changed the value between each look and
    swap, so a taker was told "held" 112 times in 116 and its waiters waited. Three such
    looks running now fail the take (BackendError): the caller builds without a lease."""
    from runtime_cache.errors import BackendError

    url = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.Cache(rc.open_backend(url), secret="fleet-secret-0123456789").backend
    name = backend.lease("a/b/c", 30.0).name  # type: ignore[union-attr]
    value = "a" * 20 + "__rand_int__." + str(int(time.time() * 1000) + 60_000) + "." + "b" * 32
    attacker = subprocess.Popen(
        [
            *(shutil.which("redis-benchmark") or "", "-p", str(redis_server.port), "-q"),
            *("-P", "16", "-c", "2", "-n", "50000000", "-r", "100000000000"),
            *("SET", name, value, "PX", "60000"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        told_held = 0
        for _ in range(20):
            lease = backend.lease("a/b/c", 30.0)
            assert lease is not None
            try:
                if lease.acquire():
                    lease.release()
                else:
                    told_held += 1
            except BackendError as exc:
                assert "no key of the secret signed" in str(exc) or "changed" in str(exc)
        assert told_held <= 2, told_held  # (a look that caught a value not yet changed)
    finally:
        attacker.kill()
        attacker.wait()
    drop_keys(backend)


def test_a_signed_holder_keeps_its_lease_through_a_lost_renewal_reply(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """A renewal swaps the token for a fresh one. When its reply was lost (a retried call,
    a timeout), the holder kept the old token: its next renewal failed, the lease was lost
    and its token could not be released (the fourth review)."""
    from runtime_cache.errors import BackendUnavailableError

    url = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.Cache(rc.open_backend(url), secret="fleet-secret").backend
    lease = backend.lease("l/o/st", 30.0)
    assert lease.acquire()
    run = lease._run  # type: ignore[attr-defined]

    def lost_reply(op: str, call: Any) -> Any:
        run(op, call)  # done on the server ...
        raise BackendUnavailableError("the reply was lost")  # ... but not heard of

    def refused(op: str, call: Any) -> Any:  # the breaker, open after the lost reply
        raise BackendUnavailableError("the breaker is open")

    lease._run = lost_reply  # type: ignore[attr-defined]
    with pytest.raises(BackendUnavailableError):
        lease.renew()
    lease._run = refused  # type: ignore[attr-defined]
    with pytest.raises(BackendUnavailableError):  # (it forgot the first one's token: lost)
        lease.renew()
    lease._run = run  # type: ignore[attr-defined]
    assert lease.renew() and not lease.lost
    # One lost reply, then quick retries the breaker refuses (the sixth review: four used up
    # the window of unanswered tokens; the lease was lost and its token left behind).
    lease._run = lost_reply  # type: ignore[attr-defined]
    with pytest.raises(BackendUnavailableError):
        lease.renew()
    lease._run = refused  # type: ignore[attr-defined]
    for _ in range(6):
        with pytest.raises(BackendUnavailableError):
            lease.renew()
    lease._run = run  # type: ignore[attr-defined]
    assert lease.renew() and not lease.lost
    lease.release()
    assert backend.lease("l/o/st", 30.0).acquire()  # released: nothing left behind
    # A take that replaces a planted value, whose reply is lost, leaves no token behind.
    import redis

    direct = redis.Redis(port=redis_server.port)
    direct.set(f"{unique_prefix}lease:s/w/p", b"junk-not-a-token", px=60_000)
    taker = backend.lease("s/w/p", 30.0)
    calls: list[int] = []

    def swap_unanswered(op: str, call: Any) -> Any:  # the take, the look, then the swap
        calls.append(1)
        return lost_reply(op, call) if len(calls) == 3 else run(op, call)

    taker._run = swap_unanswered  # type: ignore[attr-defined]
    with pytest.raises(BackendUnavailableError):
        taker.acquire()
    assert len(calls) == 4 and direct.get(f"{unique_prefix}lease:s/w/p") is None
    direct.close()
    drop_keys(backend)


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("planted", [False, True])
def test_a_take_the_client_sent_again_after_a_lost_reply_holds_the_lease(
    redis_server: RedisProcess, unique_prefix: str, signed: bool, planted: bool
) -> None:
    """redis-py sends a call again when the connection drops before its reply (a reset).
    The take (or, with a planted value, the swap) had run, so the second found the taker's
    own token there and said "held": the taker did not hold it, nor could anyone else for
    the whole ttl (the attacker review, through a proxy that dropped one reply)."""
    import redis

    url = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.open_backend(url)
    if signed:
        rc.Cache(backend, secret="fleet-secret")  # signs the backend's leases
    name = "r/e/set"
    direct = redis.Redis(port=redis_server.port)
    if planted:
        direct.set(f"{unique_prefix}lease:{name}", b"junk-not-a-token", px=60_000)
    taker = backend.lease(name, 30.0)
    run = taker._run  # type: ignore[attr-defined]
    calls: list[int] = []
    again = 3 if planted else 1  # the swap (after the take and the look), or the take

    def resent(op: str, call: Any) -> Any:  # as redis-py's retry after a reset
        calls.append(1)
        if len(calls) == again:
            run(op, call)  # run on the server; its reply lost
        return run(op, call)

    taker._run = resent  # type: ignore[attr-defined]
    if planted and not signed:
        assert not taker.acquire()  # unsigned: a planted string that expires is a holder
    else:
        assert taker.acquire() and taker.held
        taker._run = run  # type: ignore[attr-defined]
        other = backend.lease(name, 30.0)
        assert not other.acquire()  # held by the taker, as it believes
        assert taker.renew()
        taker.release()
        assert other.acquire()
        other.release()
    direct.close()
    drop_keys(backend)


def test_a_cache_reopened_with_a_rotated_secret_signs_leases_with_the_new_key(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """Keys given to one backend object were appended, and the first signed: a cache opened
    again with [new, old] kept signing with old, so a process with only new took its
    leases over (the fourth review)."""
    url = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.open_backend(url)
    rc.Cache(backend, secret="old-secret-0123456789")
    rotated = rc.Cache(backend, secret=["new-secret-0123456789", "old-secret-0123456789"])
    holder = rotated.backend.lease("r/o/t", 30.0)
    assert holder.acquire()
    newer = rc.Cache(rc.open_backend(url), secret="new-secret-0123456789").backend
    assert not newer.lease("r/o/t", 30.0).acquire()  # it verifies the holder's token
    holder.release()
    drop_keys(backend)


def test_no_flood_of_junk_nor_a_huge_set_at_a_lease_holds_a_signed_taker_off(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """The fifth review: a writer changing the value faster than a look and a swap won them
    (1 of 200 takes), and a planted set of 4 million members made the take's DEL block the
    server past the client's timeout, leaving an unowned token for the ttl. Junk that is not
    shaped as a token is now replaced whatever it is, and UNLINK frees a set in the
    background."""

    import redis

    url = f"{redis_server.url}?prefix={unique_prefix}"
    name = f"{unique_prefix}lease:f/l/d"
    backend = rc.Cache(rc.open_backend(url), secret="fleet-secret").backend

    def flood(attacker: redis.Redis) -> None:
        pipe = attacker.pipeline(transaction=False)
        for n in range(64):
            pipe.set(name, str(n), px=3_600_000)
        pipe.execute()

    assert _takes_won_against(flood, backend, "f/l/d", redis_server.port) == 50
    direct = redis.Redis(port=redis_server.port)
    direct.delete(name)  # (what the flood left)
    pipe = direct.pipeline(transaction=False)
    for start in range(0, 400_000, 10_000):
        pipe.sadd(name, *range(start, start + 10_000))
    pipe.execute()
    direct.pexpire(name, 60_000)
    started = time.monotonic()
    assert backend.lease("f/l/d", 30.0).acquire()
    assert time.monotonic() - started < 0.5
    direct.close()
    drop_keys(backend)


def test_leases_a_redis_namespace_cannot_collide_with(redis_server: RedisProcess) -> None:
    """``namespace=team:lease`` stored its entries where ``team`` keeps its leases: a build
    in ``team`` deleted them (the fifth review). No namespace may be named ``lease``; a
    tier's lease says lost when its inner lease is; a ttl over an hour renews in time."""
    from runtime_cache.backends.redis_lease import MAX_TTL_MS

    for url in (f"{redis_server.url}?namespace=team:lease", f"{redis_server.url}?prefix=lease:"):
        with pytest.raises(InvalidURLError, match="lease"):
            rc.open_backend(url)
    backend = rc.open_backend(f"{redis_server.url}?namespace=ttl&insecure=1")
    assert backend.lease("a/b/c", 20_000.0).ttl == MAX_TTL_MS / 1000  # renewed each 20 min
    tiered = rc.open_backend(f"memory://,{redis_server.url}?namespace=tl&insecure=1")
    lease = tiered.lease("t/i/e", 30.0)
    assert lease is not None and lease.acquire() and lease.held
    lease._inner._lost = True  # type: ignore[attr-defined]  # (as its renewal finds it)
    assert lease.lost and not lease.held
    lease.release()
    tiered.close()


def test_a_live_lease_with_a_long_ttl_is_never_taken_by_a_shorter_one(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    holder = backend.lease("demo/t/long", 600.0)
    assert holder.acquire()
    assert not backend.lease("demo/t/long", 15.0).acquire()  # a live lease, not a planted key
    assert holder.renew()
    holder.release()
    drop_keys(backend)


def test_a_redis_user_limited_to_its_namespace_takes_leases(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """An ACL on <prefix>* (least privilege): leases live inside the namespace, so they work;
    they used to fail, and every process built everything, with nothing said."""
    import redis

    direct = redis.Redis(port=redis_server.port)
    user = f"u{unique_prefix[:-1]}"
    direct.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=[f"{unique_prefix}*"], commands=["+@all"]
    )
    try:
        url = f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0?prefix={unique_prefix}"
        backend = open_redis(url)
        lease = backend.lease("demo/t/abc", 30.0)
        assert lease.acquire() and lease.renew()
        lease.release()
        backend.set("demo/t/abc", b"v")
        assert backend.get("demo/t/abc") == b"v"
        drop_keys(backend)
    finally:
        direct.acl_deluser(user)
        direct.close()


def test_a_key_of_another_type_at_an_entry_is_a_quiet_miss(
    redis_server: RedisProcess, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A list planted at an entry's name: a miss on every read, no outage logged or counted
    (it was 100 warnings and 100 errors for 100 reads), and the next store replaces it."""
    import logging

    import redis

    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}&insecure=1")
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m", runtime="demo", purpose="t")
    direct = redis.Redis(port=redis_server.port)
    direct.rpush(f"{unique_prefix}{key}", b"x")
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert all(cache.get(key) is None for _ in range(20))
    assert cache.stats().errors == 0 and "WRONGTYPE" not in caplog.text
    assert cache.put(key, b"v") and cache.get(key) == b"v"
    direct.close()
    drop_keys(backend)


def test_delete_if_sends_a_digest_and_removes_only_those_bytes(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    backend = open_redis(f"{redis_server.url}?prefix={unique_prefix}")
    backend.set("demo/t/a", b"judged bad")
    assert not backend.delete_if("demo/t/a", b"something else")
    assert backend.get("demo/t/a") == b"judged bad"
    assert backend.delete_if("demo/t/a", b"judged bad")
    assert backend.get("demo/t/a") is None and not backend.delete_if("demo/t/a", b"judged bad")
    drop_keys(backend)


def test_verify_sees_a_value_over_the_cap(redis_server: RedisProcess, unique_prefix: str) -> None:
    """The operator review: a value over max_entry_size is a miss to every read; ls called
    it corrupt and sent the user to verify, which did not see it ("checked 0 entries")."""
    import redis

    from runtime_cache import maintenance

    url = f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1MiB&insecure=1"
    cache = rc.Cache(rc.open_backend(url), insecure=True)
    key = rc.make_key(module_id="big", runtime="opencl", purpose="program-binary")
    cache.put(key, b"y" * (2 << 20))  # an entry over the cap: refused, so planted below
    client = redis.Redis(port=redis_server.port)
    junk = f"{unique_prefix}opencl/program-binary/{'b' * 32}"
    client.set(junk, b"\0" * (2 << 20))  # no entry at all
    whole = rc.Cache(rc.open_backend(url.replace("1MiB", "8MiB")), insecure=True)
    whole.put(key, b"y" * (2 << 20))
    report = maintenance.verify(cache)
    assert [k for k, _ in report.bad] == [junk[len(unique_prefix) :]], report
    assert [k for k, _ in report.skipped] == [str(key)], report  # an entry: said, not judged
    report = maintenance.verify(cache, repair=True)
    assert report.removed == 1 and client.exists(junk) == 0
    assert whole.get(key) == b"y" * (2 << 20)  # the entry stays
    client.close()
    for each in (cache, whole):
        each.close()


def test_a_refused_login_says_what_to_fix(redis_process: RedisProcess) -> None:
    """The new-user review: no password read "HELLO must be called with the client already
    authenticated", and a wrong one like any outage."""
    import redis

    from runtime_cache.errors import BackendUnavailableError

    admin = redis.Redis(port=redis_process.port)
    admin.config_set("requirepass", "sekrit-sekrit-sekrit")
    admin.close()
    host = f"127.0.0.1:{redis_process.port}/0?insecure=1"
    for url, advice in (
        (f"redis://{host}", "the URL gives no password"),
        (f"redis://:wrong-one@{host}", "check the URL's password"),
    ):
        backend = rc.open_backend(url)
        with pytest.raises(BackendUnavailableError, match="refused the login") as info:
            backend.get("demo/t/k")
        assert advice in str(info.value) and "wrong-one" not in str(info.value)
        backend.close()
    good = rc.open_backend(f"redis://:sekrit-sekrit-sekrit@{host}")
    good.set("demo/t/k", b"v")
    assert good.get("demo/t/k") == b"v"
    good.close()


def test_two_prefixes_one_the_start_of_the_other_clear_only_their_own(
    redis_server: RedisProcess,
) -> None:
    """The attacker review: with ``prefix=app`` and ``prefix=app2`` on one database,
    ``clear`` of the first removed the second's entry. Prefixes end with ``:`` now, and a
    name nested under another (``app:x:``) is left out of the outer one's listing."""
    tag = uuid.uuid4().hex[:8]
    outer = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix=app{tag}:"), secret=b"s" * 32)
    other = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix=app{tag}2:"), secret=b"s" * 32)
    nested = rc.Cache(
        rc.open_backend(f"{redis_server.url}?namespace=app{tag}:inner"), secret=b"s" * 32
    )
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    for cache in (outer, other, nested):
        cache.put(key, b"value")
    assert list(outer.backend.keys()) == [str(key)]  # what clear and verify go through
    for listed in list(outer.backend.keys()):
        outer.delete(listed)
    assert other.get(key) == b"value" and nested.get(key) == b"value"
