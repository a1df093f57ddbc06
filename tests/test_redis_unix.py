"""``redis+unix://``: a real redis-server that listens on a Unix socket only (no TCP port)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis_backends import drop_keys, open_redis

import runtime_cache as rc
from runtime_cache.errors import BackendUnavailableError, InsecureStoreError, InvalidURLError
from runtime_cache.testing import BackendConformance, CacheConformance

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

pytestmark = pytest.mark.redis


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i}", runtime="demo", purpose="unix", device=None)


class TestUnixSocketConformance(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self, redis_unix_server: RedisProcess, unique_prefix: str) -> Iterator[rc.Backend]:
        backend = open_redis(f"{redis_unix_server.url}?prefix={unique_prefix}")
        yield backend
        drop_keys(backend)


def test_the_server_has_no_tcp_port(redis_unix_server: RedisProcess) -> None:
    assert redis_unix_server.unix is not None and redis_unix_server.unix.is_socket()
    assert redis_unix_server.port == 0  # (--port 0: the socket is the only way in)


def test_db_selects_the_database(redis_unix_server: RedisProcess, unique_prefix: str) -> None:
    import redis

    one = open_redis(f"{redis_unix_server.url}?db=1&prefix={unique_prefix}")
    two = open_redis(f"{redis_unix_server.url}?db=2&prefix={unique_prefix}")
    one.set("k", b"in one")
    assert two.get("k") is None
    two.set("k", b"in two")
    assert (one.get("k"), two.get("k")) == (b"in one", b"in two")
    direct = redis.Redis(unix_socket_path=str(redis_unix_server.unix), db=2)
    assert direct.get(f"{unique_prefix}k") == b"in two"
    direct.close()
    assert one.name == f"redis+unix://{redis_unix_server.unix}?db=1"
    drop_keys(one)
    drop_keys(two)


def test_a_signed_cache_end_to_end(
    redis_unix_server: RedisProcess, unique_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{redis_unix_server.url}?prefix={unique_prefix}"
    with pytest.raises(InsecureStoreError):  # shared, as any Redis: signed, or insecure=1
        rc.Cache(open_redis(url))
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "test-secret")
    cache = rc.set_cache_provider(url)
    assert cache.get_or_build(_key(1), lambda: b"built once") == b"built once"
    other = rc.Cache(open_redis(url), secret="test-secret")
    assert other.get(_key(1)) == b"built once"
    assert rc.Cache(open_redis(url), secret="another").get(_key(1)) is None  # not its signature
    drop_keys(other.backend)


def test_the_cli_lists_a_unix_socket_store(
    redis_unix_server: RedisProcess, unique_prefix: str, tmp_path: Path
) -> None:
    url = f"{redis_unix_server.url}?prefix={unique_prefix}"
    cache = rc.Cache(open_redis(url), secret="test-secret")
    cache.put(_key(2), b"value")
    env = {**os.environ, "RUNTIME_CACHE": url, "RUNTIME_CACHE_SECRET": "test-secret"}
    done = subprocess.run(
        [sys.executable, "-m", "runtime_cache.cli", "ls"],
        capture_output=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert b"1 entry" in done.stdout and b"signed:  yes" in done.stdout, done.stdout
    drop_keys(cache.backend)


def test_a_missing_socket_is_a_counted_miss(tmp_path: Path) -> None:
    cache = rc.Cache(open_redis(f"redis+unix://{tmp_path}/absent.sock?insecure=1"))
    started = time.monotonic()
    assert cache.get(_key(3)) is None  # never raised
    cache.put(_key(3), b"x")  # skipped, not raised
    assert time.monotonic() - started < 5
    stats = cache.stats()
    assert stats.errors == 2 and stats.hits == 0


def test_a_killed_server_opens_the_breaker(unique_prefix: str) -> None:
    from redis_servers import require_redis, running_server

    require_redis("redis-server")
    with running_server(unix=True) as server:
        backend = open_redis(f"{server.url}?prefix={unique_prefix}&backoff=100ms&max_backoff=400ms")
        cache = rc.Cache(backend, secret="test-secret")
        cache.put(_key(4), b"v")
        assert cache.get(_key(4)) == b"v"
        server.kill()
        for _ in range(20):
            assert cache.get(_key(4)) is None
        assert backend.breaker.stats().opened == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "url",
    [
        "redis+unix://host/run/redis.sock",  # a host: the socket is a local file
        "redis+unix://run/redis.sock",  # a relative path (read as a host)
        "redis+unix:///run/redis/",  # a folder
        "redis+unix:///run/redis.sock?db=one",
        "redis+unix:///run/redis.sock?db=-1",
        "redis://127.0.0.1:6379/0?db=1",  # the database of a TCP server is its path
        "redis+unix:///run/redis.sock?db=",  # (empty: as an empty prefix=, refused)
        "redis+unix:///run/redis.sock?db=99999999999999999999",
        "redis+unix:///run/redis.sock%00x",  # (the kernel cut the path at the NUL)
        "redis+unix:///run/redis%0A.sock",
        "redis+unix:///run/redis.%E2%80%AEsock",  # (a right-to-left override, in messages)
    ],
)
def test_bad_unix_urls_are_refused(url: str) -> None:
    from redis_servers import require_redis

    require_redis()  # redis-py only; no server needed
    with pytest.raises(InvalidURLError):
        rc.open_backend(url)


def test_a_password_never_shows() -> None:
    from redis_servers import require_redis

    require_redis()
    backend = open_redis("redis+unix://:s3cret%2Fpw@/run/redis.sock?db=3&namespace=ml")
    assert "s3cret" not in backend.name and "s3cret" not in repr(backend)
    assert backend.name == "redis+unix:///run/redis.sock?db=3"


def test_a_refused_login_says_where_the_password_goes(tmp_path: Path) -> None:
    from redis_servers import RedisProcess, require_redis

    require_redis("redis-server")
    server = RedisProcess(tmp_path / "auth", unix=True)
    server.start()
    try:
        import redis

        redis.Redis(unix_socket_path=str(server.unix)).config_set("requirepass", "pw-1234")
        backend = open_redis(f"{server.url}?insecure=1")
        with pytest.raises(BackendUnavailableError, match="before the socket path"):
            backend.get("k")
        good = open_redis(f"redis+unix://:pw-1234@{server.unix}?insecure=1")
        good.set("k", b"v")
        assert good.get("k") == b"v"
    finally:
        server.stop()
