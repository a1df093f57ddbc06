"""What someone who can write to a shared Redis, without the signing secret, can plant.

Names: Redis allows names of up to 512 MB. Four of 100 MiB under the prefix made each
listing's reply longer than the connection's cap, which counted as an outage: the breaker
opened, every signed entry then missed, and ``ls``/``clear`` failed, so the keys could not
even be cleared with the tool; names just under the cap cost each listing hundreds of MiB.

Values: 16 values at the 64 MiB cap under a module's keys made one ``get_many`` hold
1.1 GiB for 7.5 s before the front refused them all.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.errors import BackendError, BackendUnavailableError, InvalidKeyError

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

pytestmark = pytest.mark.redis

MIB = 1 << 20
#: With max_entry_size=1MiB a reply may be 1 + 32 + 1 MiB long (see backends/redis.py).
REPLY_CAP = 34 * MIB
SIZES = {"over": REPLY_CAP + MIB, "under": REPLY_CAP - MIB}
SECRET = "fleet-secret"

#: A victim in a child of its own: lists, and tells how much its peak memory grew meanwhile.
_VICTIM = """
import json, resource, sys
import runtime_cache as rc
backend = rc.open_backend(sys.argv[1])
backend.get("warm/up/0")  # (connected, and the reading machinery in memory)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
listed = sorted(backend.keys())
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"listed": listed, "grown_kib": grown, "breaker": backend.breaker.state}))
"""


def _plant_names(client: Any, prefix: str, size: int, count: int = 2) -> list[bytes]:
    # ``{i}``: a hash tag, so a cluster client finds the slot without hashing the name.
    names = [f"{prefix}opencl/tuning/{{{i}}}".encode() + b"a" * size for i in range(count)]
    for name in names:
        client.set(name, b"x")
    return names


def _good(cache: rc.Cache, count: int = 3) -> dict[rc.CacheKey, bytes]:
    entries = {
        rc.make_key(module_id=f"m{i}", runtime="opencl", purpose="program-binary"): b"binary %d" % i
        for i in range(count)
    }
    for key, value in entries.items():
        assert cache.put(key, value)
    return entries


def _direct(server: RedisProcess) -> Any:
    import redis

    return redis.Redis(port=server.port)


@pytest.fixture
def private(redis_process: RedisProcess) -> Iterator[tuple[RedisProcess, Any]]:
    client = _direct(redis_process)
    yield redis_process, client
    client.close()


@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_planted_long_names_are_never_received_and_disable_nothing(
    private: tuple[RedisProcess, Any], size: int
) -> None:
    server, client = private
    url = f"{server.url}?prefix=rc:&max_entry_size=1MiB"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    good = _good(cache)
    # Just under the cap, one name: a plain SCAN brought it whole in one reply.
    _plant_names(client, "rc:", size, 2 if size > REPLY_CAP else 1)
    assert sorted(cache.backend.keys()) == sorted(str(k) for k in good)
    assert {str(e.key) for e in cache.entries()} >= {str(k) for k in good}
    assert all(cache.get(k) == v for k, v in good.items())
    assert cache.backend.breaker.state == "closed" and cache.stats().errors == 0
    # In a child: listing never grows its peak memory by the names' size.
    child = subprocess.run(
        [sys.executable, "-c", _VICTIM, url], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout)
    assert report["listed"] == sorted(str(k) for k in good) and report["breaker"] == "closed"
    assert report["grown_kib"] < 8 * 1024, report  # against 33-70 MiB of names
    from runtime_cache.cli import main

    # The operator's tools still work, and leave the planted names alone (no key of ours).
    assert main(["--cache", url, "--secret", SECRET, "ls"]) == 0
    assert main(["--cache", url, "--secret", SECRET, "clear", "--yes"]) == 0
    assert not list(cache.backend.keys())
    assert client.dbsize() == (2 if size > REPLY_CAP else 1)
    cache.close()


def test_planted_long_names_on_a_cluster(redis_cluster: RedisCluster, unique_prefix: str) -> None:
    import redis

    port = int(redis_cluster.url.rsplit(":", 1)[1])
    client = redis.RedisCluster(host="127.0.0.1", port=port)
    url = f"{redis_cluster.url}?prefix={unique_prefix}&max_entry_size=1MiB"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    names: list[bytes] = []
    try:
        good = _good(cache, 8)  # over several primaries
        names = _plant_names(client, unique_prefix, SIZES["over"], 3)  # ({0}, {1}, {2}: 3 slots)
        assert sorted(cache.backend.keys()) == sorted(str(k) for k in good)
        assert all(cache.get(k) == v for k, v in good.items())
        assert cache.backend.breaker.state == "closed" and cache.stats().errors == 0
    finally:
        for name in names:
            client.delete(name)
        cache.close()
        client.close()


def test_a_cluster_that_refuses_scripts_is_listed_by_scan(
    redis_cluster: RedisCluster, unique_prefix: str
) -> None:
    """Review of this session's fix: where an ACL refuses Lua on a cluster, the plain-SCAN
    fallback got redis-py's cluster reply (``{node: cursor}``, names) and failed every
    listing (``int()`` of a dict)."""
    import redis

    user = f"u{uuid.uuid4().hex[:8]}"
    ports = [node.port for node in redis_cluster.nodes]
    for port in ports:
        with redis.Redis(port=port) as node:
            node.acl_setuser(
                user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"]
            )
    url = f"redis+cluster://{user}:pw@127.0.0.1:{ports[0]}?prefix={unique_prefix}"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    try:
        good = _good(cache, 8)  # over several primaries
        assert sorted(cache.backend.keys()) == sorted(str(k) for k in good)
        assert cache.backend.breaker.state == "closed" and cache.stats().errors == 0
    finally:
        for key in list(cache.backend.keys()):
            cache.backend.delete(key)
        cache.close()
        for port in ports:
            with redis.Redis(port=port) as node:
                node.acl_deluser(user)


def test_without_scripts_a_reply_over_the_cap_is_an_error_not_an_outage(
    private: tuple[RedisProcess, Any],
) -> None:
    """Where an ACL refuses Lua, names come by plain SCAN: a reply over the cap is then a
    BackendError for the listing alone; the breaker stays closed and reads go on."""
    server, client = private
    user = f"u{uuid.uuid4().hex[:8]}"
    client.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["rc:*"], commands=["+@all", "-@scripting"]
    )
    url = f"redis://{user}:pw@127.0.0.1:{server.port}/0?max_entry_size=1MiB"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    good = _good(cache)
    _plant_names(client, "rc:", SIZES["over"])
    with pytest.raises(BackendError, match="a reply longer than") as caught:
        list(cache.backend.keys())
    assert not isinstance(caught.value, BackendUnavailableError)
    assert cache.backend.breaker.state == "closed"
    assert all(cache.get(k) == v for k, v in good.items())
    assert cache.stats().errors == 0
    cache.close()
    server.kill()  # a real outage still opens the breaker
    backend = rc.open_backend(url)
    with pytest.raises(BackendUnavailableError):
        list(backend.keys())
    assert backend.breaker.state == "open"
    backend.close()


def test_keys_longer_than_a_listing_takes_are_refused(redis_server: RedisProcess) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    backend = rc.open_backend(f"{redis_server.url}?prefix={prefix}")
    longest = "é" * 1024  # 2048 bytes of UTF-8: still listed
    backend.set(longest, b"v")
    assert list(backend.keys()) == [longest]
    with pytest.raises(InvalidKeyError):
        backend.set("x" * 1025, b"v")
    with pytest.raises(InvalidKeyError):
        backend.get("x" * 1025)
    backend.delete(longest)
    backend.close()


# ---------------------------------------------------------------------- get_many's budget
def test_get_many_holds_at_most_its_budget_and_leaves_the_largest_out(
    redis_server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    import redis

    prefix = f"t{uuid.uuid4().hex[:8]}:"
    url = f"{redis_server.url}?prefix={prefix}&max_entry_size=1MiB&max_batch_size=3MiB"
    backend = rc.open_backend(url)
    client = redis.Redis(port=redis_server.port)
    small = {f"demo/t/s{i:03d}": b"%03d" % i * 100 for i in range(200)}  # 60 KB in all
    backend.set_many(small)
    for i in range(8):
        client.set(f"{prefix}demo/t/big{i}", bytes(MIB))  # planted at the cap
    wanted = [*small, *(f"demo/t/big{i}" for i in range(8))]
    with caplog.at_level(logging.DEBUG, logger="runtime_cache"):
        first = backend.get_many(wanted)
        second = backend.get_many(wanted)
    for found in (first, second):
        assert {k: v for k, v in found.items() if k in small} == small  # all the small ones
        assert sum(map(len, found.values())) <= 3 * MIB
        assert len(found) == len(small) + 2  # two of the eight fit beside them
    warned = [r for r in caplog.records if "left out 6 values" in r.getMessage()]
    assert [r.levelno for r in warned] == [logging.WARNING, logging.DEBUG]  # said once
    assert client.dbsize() >= 208  # nothing left out was removed
    client.close()
    backend.close()


def test_an_entry_left_out_is_a_miss_and_never_evicted(redis_server: RedisProcess) -> None:
    """Through the front: good signed entries past the budget are misses of that call,
    stay stored, and are served when asked for in a batch that fits."""
    prefix = f"t{uuid.uuid4().hex[:8]}:"
    url = f"{redis_server.url}?prefix={prefix}&max_entry_size=2MiB&max_batch_size=2MiB"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    keys = [
        rc.make_key(module_id=f"m{i}", runtime="opencl", purpose="program-binary") for i in range(5)
    ]
    values = {k: bytes([i]) * (700 << 10) for i, k in enumerate(keys)}
    for key, value in values.items():
        assert cache.put(key, value)
    found = cache.get_many_views(keys)
    assert 0 < len(found) < len(keys)
    assert all(bytes(found[str(k)]) == values[k] for k in keys if str(k) in found)
    assert cache.stats().corrupt == 0 and cache.stats().errors == 0
    assert sorted(cache.backend.keys()) == sorted(str(k) for k in keys)  # none evicted
    for key in keys:
        assert cache.get(key) == values[key]
    cache.close()


def test_max_batch_size_in_the_url() -> None:
    from runtime_cache.backends.redis import RedisBackend
    from runtime_cache.errors import InvalidURLError

    backend = rc.open_backend("redis://127.0.0.1:1/0?max_entry_size=1MiB")
    assert isinstance(backend, RedisBackend) and backend._reads.hold == 4 * MIB
    backend = rc.open_backend("redis://127.0.0.1:1/0?max_batch_size=1GiB")
    assert isinstance(backend, RedisBackend) and backend._reads.hold == 1 << 30
    with pytest.raises(InvalidURLError):
        rc.open_backend("redis://127.0.0.1:1/0?max_batch_size=0")


@pytest.mark.parametrize(
    "name", [b"", b"a" * 2000, "é".encode() * 1025], ids=["empty", "long", "wide"]
)
def test_names_of_no_keys_length_are_not_listed(
    private: tuple[RedisProcess, Any], name: bytes
) -> None:
    """The attacker review of session 40: the prefix alone (``rc:``) and names of more
    characters than a key has (but fewer bytes than a listing takes) were listed, and then
    skipped as "not a cache key" by every command, none of which could remove them:
    `verify` and `ls` said exit 1 for good. They are not this cache's names."""
    server, client = private
    url = f"{server.url}?prefix=rc:"
    cache = rc.Cache(rc.open_backend(url), secret=SECRET)
    good = _good(cache)
    client.set(b"rc:" + name, b"x")
    assert sorted(cache.backend.keys()) == sorted(str(k) for k in good)
    from runtime_cache.cli import main

    for command in (["ls"], ["verify"], ["stats"]):
        assert main(["--cache", url, "--secret", SECRET, *command]) == 0, command
    assert client.exists(b"rc:" + name)  # left alone, as any name that is not ours
    cache.close()
