"""``max_entry_size`` on a real redis-server: a value over the cap is never sent to a reader,
``get_many`` brings large values in bounded replies, and writes over the cap are refused.

Someone who can write to a shared Redis could plant 512 MB strings under every entry's name;
each reader then pulled them whole (one ``MGET`` of a module's keys: gigabytes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.errors import BackendError, EntryTooLargeError, InvalidURLError

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

pytestmark = pytest.mark.redis

CAP = 1 << 20


def _sent(client: Any) -> int:
    """Bytes the server has sent to all its clients so far."""
    return int(client.info("stats")["total_net_output_bytes"])


@pytest.fixture
def direct(redis_server: RedisProcess) -> Iterator[Any]:
    import redis

    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


#: ``limited(commands, query="")``: a backend logged in as a Redis user held to the test's
#: prefix by an ACL with these ``commands`` (removed afterwards).
Limited = Callable[..., AbstractContextManager[Any]]


@pytest.fixture
def limited(redis_server: RedisProcess, unique_prefix: str, direct: Any) -> Limited:
    @contextlib.contextmanager
    def make(commands: list[str], query: str = "") -> Iterator[Any]:
        user = f"u{uuid.uuid4().hex[:12]}"
        keys = [f"{unique_prefix}*"]
        direct.acl_setuser(user, enabled=True, passwords=["+pw"], keys=keys, commands=commands)
        try:
            port = redis_server.port
            backend = _open(f"redis://{user}:pw@127.0.0.1:{port}/0?prefix={unique_prefix}{query}")
            try:
                yield backend
            finally:
                backend.close()
        finally:
            direct.acl_deluser(user)

    return make


def _open(url: str) -> Any:
    from runtime_cache.backends.redis import RedisBackend

    backend = rc.open_backend(url)
    assert isinstance(backend, RedisBackend)
    return backend


def test_a_value_over_the_cap_is_a_logged_miss_and_never_sent(
    redis_server: RedisProcess, unique_prefix: str, direct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1MiB")
    assert backend.max_entry_size == CAP
    direct.set(f"{unique_prefix}demo/t/big", os.urandom(8 * CAP))
    backend.set("demo/t/ok", b"v" * 1000)
    before = _sent(direct)
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert backend.get("demo/t/big") is None
        assert backend.get_many(["demo/t/big", "demo/t/ok"]) == {"demo/t/ok": b"v" * 1000}
        assert backend.get("demo/t/big") is None
    # Of the 8 MiB value, the first get brings the cap and a byte (that shows it is over);
    # get_many, and any later get of that name, ask its size first and bring none of it.
    assert _sent(direct) - before < CAP + (64 << 10)
    assert caplog.text.count("over the 1048576-byte cap") == 1  # once per name
    cache = rc.Cache(backend, secret="fleet-secret")
    key = rc.make_key(module_id="m", runtime="demo", purpose="t")
    direct.set(f"{unique_prefix}{key}", os.urandom(2 * CAP))
    assert cache.get(key) is None
    assert cache.stats().misses == 1 and cache.stats().errors == 0  # a miss, not an outage
    backend.close()


def test_get_many_brings_large_values_in_bounded_replies(
    redis_server: RedisProcess, unique_prefix: str, direct: Any
) -> None:
    from runtime_cache.backends.redis_scripts import SMALL, CappedReads

    replies: list[int] = []

    class Counting(CappedReads):
        def _read_sized(self, client: Any, taken: list[tuple[str, int]]) -> Any:
            found = super()._read_sized(client, taken)
            replies.append(sum(len(v or b"") for v in found.values()))
            return found

    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1MiB")
    backend._reads = Counting(CAP, 3 * CAP, backend.name, cluster=False, hold=16 * CAP)
    values = {f"demo/t/{i:02d}": os.urandom(CAP - i) for i in range(10)}
    small = {f"demo/t/s{i}": os.urandom(SMALL - i) for i in range(5)}
    backend.set_many({**values, **small, "demo/t/empty": b""})
    direct.rpush(f"{unique_prefix}demo/t/list", b"x")  # another type: a miss
    asked = [*values, *small, "demo/t/list", "demo/t/none", "demo/t/00", "demo/t/empty"]
    found = backend.get_many(asked)
    assert found == {**values, **small, "demo/t/empty": b""}
    # 10 values of about 1 MiB in replies of at most 3 MiB: four, not one; the small ones
    # came with the sizes.
    assert (
        len(replies) == 4
        and max(replies) <= 3 * CAP
        and sum(replies) == sum(map(len, values.values()))
    )
    backend.close()


def test_writes_over_the_cap_are_refused_and_the_rest_stored(
    redis_server: RedisProcess, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1MiB")
    with pytest.raises(BackendError, match="max_entry_size"):
        backend.set("demo/t/huge", bytes(CAP + 1))
    with pytest.raises(BackendError, match=r"demo/t/huge \(1048577 bytes\)"):
        backend.set_many({"demo/t/a": b"1", "demo/t/huge": bytes(CAP + 1)})
    assert backend.get("demo/t/a") == b"1" and backend.get("demo/t/huge") is None
    assert backend.breaker.state == "closed"  # not the server's fault
    cache = rc.Cache(backend, secret="fleet-secret")
    key = rc.make_key(module_id="m", runtime="demo", purpose="t")
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert not cache.put(key, bytes(CAP))  # with its header, over the cap
        assert not cache.put(key, bytes(CAP))
    assert cache.stats().errors == 2
    # Said once, as what it is: not an outage to wait out.
    assert caplog.text.count("max_entry_size") == 1 and "until it recovers" not in caplog.text
    assert cache.put(key, bytes(CAP // 2)) and cache.get(key) == bytes(CAP // 2)
    with pytest.raises(EntryTooLargeError):
        rc.Cache(backend, secret="fleet-secret", strict=True).put(key, bytes(CAP))
    backend.close()


def test_the_cap_holds_on_a_cluster(redis_cluster: RedisCluster, unique_prefix: str) -> None:
    import redis

    backend = _open(f"{redis_cluster.url}?prefix={unique_prefix}&max_entry_size=1MiB")
    values = {f"demo/t/{i:02d}": os.urandom(1000 + i) for i in range(30)}
    backend.set_many(values)
    port = int(redis_cluster.url.rsplit(":", 1)[1])
    direct = redis.RedisCluster(host="127.0.0.1", port=port)
    direct.set(f"{unique_prefix}demo/t/big", os.urandom(4 * CAP))
    direct.rpush(f"{unique_prefix}demo/t/list", b"x")
    assert backend.get("demo/t/big") is None and backend.get("demo/t/list") is None
    found = backend.get_many([*values, "demo/t/big", "demo/t/list"])
    assert found == values
    direct.close()
    backend.close()


def test_a_user_without_scripts_reads_sizes_by_strlen(
    limited: Limited, unique_prefix: str, direct: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An ACL that allows reads and writes but no Lua: sizes come from STRLEN, said once."""
    with limited(["+@read", "+@write", "-@scripting"], "&max_entry_size=1MiB") as backend:
        backend.set_many({"demo/t/a": b"1", "demo/t/b": b"2"})
        direct.set(f"{unique_prefix}demo/t/big", os.urandom(2 * CAP))
        before = _sent(direct)
        with caplog.at_level(logging.INFO, logger="runtime_cache"):
            assert backend.get("demo/t/a") == b"1" and backend.get("demo/t/big") is None
            for _ in range(2):
                assert backend.get_many(["demo/t/a", "demo/t/b", "demo/t/big"]) == {
                    "demo/t/a": b"1",
                    "demo/t/b": b"2",
                }
        assert _sent(direct) - before < CAP + (64 << 10)
        assert caplog.text.count("refuses Lua scripts") == 1
        assert backend.breaker.state == "closed"


def test_max_entry_size_in_the_url_is_checked() -> None:
    with pytest.raises(InvalidURLError):
        rc.open_backend("redis://127.0.0.1:1/0?max_entry_size=0")
    with pytest.raises(ValueError):
        rc.open_backend("redis://127.0.0.1:1/0?max_entry_size=lots")


def test_a_value_swapped_for_a_larger_one_between_size_and_read_is_a_miss(
    redis_server: RedisProcess, unique_prefix: str, direct: Any
) -> None:
    """get_many reads each value up to the size it had: a swap in between brings one byte
    more, never the new value."""
    from runtime_cache.backends.redis_scripts import CappedReads

    class Swapping(CappedReads):
        def _first(self, client: Any, fulls: list[str], found: dict[str, Any], room: int) -> Any:
            sizes = super()._first(client, fulls, found, room)
            direct.set(f"{unique_prefix}demo/t/a", os.urandom(CAP))  # the attacker's move
            return sizes

    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1MiB")
    backend._reads = Swapping(CAP, CAP, backend.name, cluster=False)
    backend.set_many({"demo/t/a": bytes(64 << 10), "demo/t/b": b"kept"})
    before = _sent(direct)
    assert backend.get_many(["demo/t/a", "demo/t/b"]) == {"demo/t/b": b"kept"}
    assert _sent(direct) - before < 80 << 10  # the sizes, and the 64 KiB and a byte
    backend.close()


def test_a_cap_under_the_scripts_small_values_still_holds(
    redis_server: RedisProcess, unique_prefix: str, direct: Any
) -> None:
    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1KiB")
    direct.set(f"{unique_prefix}demo/t/a", b"b" * 1025)
    direct.set(f"{unique_prefix}demo/t/b", b"b" * 1024)
    assert backend.get("demo/t/a") is None and backend.get("demo/t/b") == b"b" * 1024
    assert backend.get_many(["demo/t/a", "demo/t/b"]) == {"demo/t/b": b"b" * 1024}
    backend.close()


@pytest.mark.parametrize("refused", ["-strlen", "-exists", "-getrange"])
@pytest.mark.parametrize("scripts", ["+@scripting", "-@scripting"])
def test_an_acl_that_refuses_a_read_command_is_an_error_never_a_quiet_miss(
    limited: Limited, refused: str, scripts: str
) -> None:
    """A Redis user denied STRLEN, EXISTS or GETRANGE got ``{}`` from every get_many (read
    as keys of another type), and a missing key could come back as b"" when EXISTS was
    refused."""
    with limited(["+@all", scripts, refused]) as backend:
        backend.set_many({"demo/t/a": b"1" * 5000, "demo/t/b": b"2"})
        for call in (
            lambda: backend.get_many(["demo/t/a", "demo/t/b", "demo/t/none"]),
            lambda: backend.get("demo/t/none"),
        ):
            try:
                found = call()
            except BackendError as exc:
                assert "permission" in str(exc).lower() or "can't run" in str(exc)
            else:  # only where the refused command is not needed on this path
                assert found in ({"demo/t/a": b"1" * 5000, "demo/t/b": b"2"}, None), found


@pytest.mark.parametrize("refused", ["-multi", "-exec", "-@transaction"])
def test_misses_read_without_transactions_where_an_acl_refuses_them(
    limited: Limited, refused: str
) -> None:
    with limited(["+@all", refused]) as backend:
        backend.set("demo/t/empty", b"")
        for _ in range(2):
            assert backend.get("demo/t/none") is None and backend.get("demo/t/empty") == b""
        assert backend.breaker.state == "closed" and not backend._reads.transactions


def test_a_passing_error_of_multi_leaves_transactions_on(
    redis_server: RedisProcess, unique_prefix: str, direct: Any
) -> None:
    """The operator review of session 40: a server over its maxmemory (noeviction) refuses
    MULTI for a moment, and that turned transactional reads off for the rest of the
    process. Now only a refusal (an ACL, a cluster client) does; that miss reads in two
    steps."""
    backend = _open(f"{redis_server.url}?prefix={unique_prefix}")
    backend.set("demo/t/empty", b"")
    policy = direct.config_get("maxmemory-policy")["maxmemory-policy"]
    direct.config_set("maxmemory-policy", "noeviction")
    direct.config_set("maxmemory", 1)
    try:
        assert backend.get("demo/t/none") is None and backend.get("demo/t/empty") == b""
    finally:
        direct.config_set("maxmemory", 0)
        direct.config_set("maxmemory-policy", policy)
    assert backend._reads.transactions and backend.breaker.state == "closed"
    assert backend.get("demo/t/none") is None and backend.get("demo/t/empty") == b""
    backend.close()


def test_a_cluster_client_without_transactions_reads_misses_in_two_steps(
    redis_cluster: RedisCluster, unique_prefix: str
) -> None:
    """redis-py 5's cluster client refuses transaction=True ("transaction is deprecated in
    cluster mode"): that is no outage."""
    import redis

    backend = _open(f"{redis_cluster.url}?prefix={unique_prefix}")
    client = backend._get_client()
    plain = client.pipeline

    def pipeline(transaction: bool = False, **kwargs: Any) -> Any:
        if transaction:
            raise redis.exceptions.RedisClusterException(
                "transaction is deprecated in cluster mode"
            )
        return plain(transaction=False, **kwargs)

    client.pipeline = pipeline
    backend.set("demo/t/empty", b"")
    assert backend.get("demo/t/none") is None and backend.get("demo/t/empty") == b""
    assert backend.breaker.state == "closed" and not backend._reads.transactions
    backend.close()


def test_an_acl_refusing_get_inside_scripts_reads_through_strlen_and_getrange(
    limited: Limited,
) -> None:
    with limited(["+@all", "-get"]) as backend:
        values = {"demo/t/a": b"1", "demo/t/b": bytes(10_000)}
        backend.set_many(values)
        assert backend.get_many([*values, "demo/t/none"]) == values
        assert not backend._reads.scripts


def test_a_listing_refused_strlen_is_an_error_not_an_empty_store(limited: Limited) -> None:
    with limited(["+@all", "-strlen"]) as backend:
        backend.set("demo/t/a", b"1")
        with pytest.raises(BackendError):
            list(backend.scan())


def test_an_oversized_value_through_tiers_is_no_outage(
    redis_server: RedisProcess, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"tiered://memory://,{redis_server.url}?prefix={unique_prefix}&max_entry_size=64KiB"
    cache = rc.Cache(rc.open_backend(url), secret="fleet-secret")
    keys = [rc.make_key(module_id="m", runtime="demo", purpose="t", i=i) for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert cache.put(keys[0], bytes(128 << 10))  # the memory tier takes it
        assert cache.put(keys[1], b"small")
        assert cache.backend.flush(10)
        assert cache.put(keys[2], bytes(128 << 10))
        assert cache.backend.flush(10)
    assert "until it recovers" not in caplog.text
    assert caplog.text.count("max_entry_size") == 1
    cache.close()


def test_a_batch_with_one_oversized_value_counts_the_others_stored(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    backend = _open(f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=64KiB")
    cache = rc.Cache(backend, secret="fleet-secret")
    keys = [rc.make_key(module_id="m", runtime="demo", purpose="t", i=i) for i in range(3)]
    before = cache.generation
    assert not cache.put_many({keys[0]: b"a", keys[1]: b"b", keys[2]: bytes(128 << 10)})
    stats = cache.stats()
    assert stats.stores == 2 and stats.errors == 1
    assert cache.get(keys[0]) == b"a" and cache.get(keys[2]) is None
    assert cache.generation != before
    cache.close()
