"""Outages against a real redis-server: killed, hung, restarted, never there.

Callers must see misses and skipped stores, never an exception (unless strict),
and must not pay a timeout per call while the circuit breaker is open.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.errors import BackendUnavailableError

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]
pytestmark = pytest.mark.redis

BREAKER_LOG = "runtime_cache.backends.breaker"


def _key(i: int) -> rc.CacheKey:
    return rc.make_key(module_id=f"m{i % 10}", runtime="fault", purpose="test", device=None, i=i)


def _backend(url: str, prefix: str, **options: str) -> Any:
    from runtime_cache.backends.redis import RedisBackend

    query = "&".join(f"{k}={v}" for k, v in {"prefix": prefix, **options}.items())
    backend = rc.open_backend(f"{url}?{query}")
    assert isinstance(backend, RedisBackend)
    return backend


def _breaker_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == BREAKER_LOG and r.levelno == level]


def test_kill_mid_run_then_restart_on_the_same_port(
    redis_process: RedisProcess, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    backend = _backend(redis_process.url, unique_prefix, backoff="100ms", max_backoff="400ms")
    cache = rc.Cache(backend, secret="test-secret")
    slowest_while_open = 0.0
    for i in range(300):
        if i == 100:
            redis_process.kill()
        was_open = backend.breaker.is_open
        started = time.perf_counter()
        if i % 2 == 0:
            cache.put(_key(i // 2), b"value %d" % i)  # no exception may escape
        else:
            cache.get(_key(i // 2))
        if was_open:
            slowest_while_open = max(slowest_while_open, time.perf_counter() - started)
    stats = cache.stats()
    assert stats.hits == 50 and stats.stores == 50  # the first 100 operations worked
    assert stats.errors == 200  # every later one was absorbed as a miss or skipped store
    breaker = backend.breaker.stats()
    assert breaker.opened == 1
    # After the first failure every call either failed fast or was the single probe.
    assert breaker.fast_failures + breaker.probes == 199
    assert breaker.fast_failures > breaker.probes
    assert slowest_while_open < backend.timeout  # a correctness bound; typical is ~10 us
    assert len(_breaker_records(caplog, logging.WARNING)) == 1  # once per outage

    redis_process.start()  # same port, same backend object, no new client
    deadline = time.monotonic() + 10
    while not cache.put(_key(999), b"after restart"):
        assert time.monotonic() < deadline, "the backend did not recover"
        time.sleep(0.02)
    assert cache.get(_key(999)) == b"after restart"
    assert backend.breaker.state == "closed"
    assert len(_breaker_records(caplog, logging.INFO)) == 1
    assert len(_breaker_records(caplog, logging.WARNING)) == 1
    backend.close()


def test_hung_server_costs_one_timeout_not_one_per_call(
    redis_process: RedisProcess, unique_prefix: str
) -> None:
    backend = _backend(
        redis_process.url, unique_prefix, timeout="300ms", connect_timeout="100ms", backoff="150ms"
    )
    cache = rc.Cache(backend, secret="test-secret")
    assert cache.put(_key(1), b"before")
    redis_process.pause()  # accepts connections, never answers
    try:
        fast_max = slowest = 0.0
        started_all = time.monotonic()
        calls = 0
        while time.monotonic() - started_all < 1.0:
            before = backend.breaker.stats()
            started = time.perf_counter()
            assert cache.get(_key(1)) is None
            elapsed = time.perf_counter() - started
            after = backend.breaker.stats()
            slowest = max(slowest, elapsed)
            if after.fast_failures > before.fast_failures:
                fast_max = max(fast_max, elapsed)
            calls += 1
            time.sleep(0.005)
        breaker = backend.breaker.stats()
        # Without the breaker each call would wait 0.3 s, so ~3 calls would fit in 1 s.
        assert calls > 20 and breaker.fast_failures > 20
        assert fast_max < backend.timeout  # refused calls never touch the network
        # A probe may wait for a reply (timeout) after a connect (connect_timeout).
        assert slowest < backend.timeout + backend.connect_timeout + 0.5
    finally:
        redis_process.resume()
    deadline = time.monotonic() + 10
    while cache.get(_key(1)) != b"before":
        assert time.monotonic() < deadline, "the backend did not recover after SIGCONT"
        time.sleep(0.02)
    assert backend.breaker.state == "closed"
    backend.close()


def test_server_never_there(unique_prefix: str) -> None:
    from redis_servers import require_redis

    require_redis()  # redis-py only; no server needed
    from redis_servers import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    cache = rc.Cache(_backend(url, unique_prefix), secret="test-secret")
    key = _key(3)
    assert cache.get_or_build(key, lambda: b"built anyway") == b"built anyway"
    assert cache.get_many([_key(4), _key(5)]) == {}
    assert list(cache.entries()) == []
    assert cache.stats().errors >= 3 and cache.stats().builds == 1
    strict = rc.Cache(_backend(url, unique_prefix), strict=True, secret="test-secret")
    with pytest.raises(BackendUnavailableError):
        strict.get(key)
    with pytest.raises(BackendUnavailableError):  # now refused by the open breaker
        strict.put(key, b"x")


def test_a_server_that_does_not_speak_redis_opens_the_breaker(unique_prefix: str) -> None:
    """Operator review, session 36: a URL pointing at an HTTP server answered every call
    after 0.3 s with a protocol error, which counted as a plain error, not an outage, so
    each call connected and waited again (1.2 s a loop of four calls, for ever)."""
    import socket
    import threading

    from redis_servers import require_redis

    require_redis()  # redis-py only; the server here is not Redis
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer(conn: socket.socket) -> None:
        with conn:
            while conn.recv(4096):
                time.sleep(0.3)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"redis://127.0.0.1:{port}/0"
        cache = rc.Cache(_backend(url, unique_prefix), secret="test-secret")
        assert cache.get(_key(1)) is None  # the first call pays its wait, and opens it
        started = time.monotonic()
        for i in range(5):
            assert cache.get(_key(i)) is None
        assert time.monotonic() - started < 0.3  # refused by the open breaker, at once
        assert "Protocol error" in (cache.last_error or "")
    finally:
        server.close()


def test_a_database_the_server_lacks_opens_the_breaker(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    """Carried over from session 35: ``/99`` on a server of 16 databases failed every
    call with a plain error, so each call connected again and was refused again."""
    url = redis_server.url.rsplit("/", 1)[0] + "/99"
    cache = rc.Cache(_backend(url, unique_prefix), secret="test-secret")
    assert cache.put(_key(1), b"v") is False  # refused: an outage, the breaker opens
    assert "refused the URL's database number" in (cache.last_error or "")
    with pytest.raises(BackendUnavailableError, match="database number"):
        rc.Cache(_backend(url, unique_prefix), secret="test-secret", strict=True).get(_key(1))
    assert cache.backend.breaker.state == "open"
    import redis

    with redis.Redis(port=redis_server.port) as admin:
        connects = admin.info("stats")["total_connections_received"]
        for i in range(20):
            assert cache.get(_key(i)) is None
        assert admin.info("stats")["total_connections_received"] == connects


def test_tiers_keep_serving_over_a_dead_redis(
    tmp_path: Path, redis_process: RedisProcess, unique_prefix: str
) -> None:
    from runtime_cache.backends.tiered import TieredBackend

    url = f"memory://,dir://{tmp_path},{redis_process.url}?prefix={unique_prefix}&backoff=100ms"
    tiered = rc.open_backend(url)
    assert isinstance(tiered, TieredBackend)
    cache = rc.Cache(tiered, secret="test-secret")
    for i in range(40):
        cache.put(_key(i), b"v%d" % i)
    assert tiered.flush(timeout=10)
    redis_process.kill()
    for i in range(40, 80):  # writes still land in memory and on disk
        assert cache.put(_key(i), b"v%d" % i)
    assert all(cache.get(_key(i)) == b"v%d" % i for i in range(80))
    assert tiered.flush(timeout=10)
    tiered.close()

    # A fresh process-like start: empty memory tier, same directory, Redis still dead.
    again = rc.Cache(rc.open_backend(url), secret="test-secret")
    assert all(again.get(_key(i)) == b"v%d" % i for i in range(80))
    assert again.get(_key(500)) is None  # a plain miss: two tiers answered, one was skipped
    stats = again.stats()
    assert (stats.hits, stats.errors) == (80, 0)
    again.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_backoff_grows_to_the_cap_and_closes(caplog: pytest.LogCaptureFixture) -> None:
    from runtime_cache.backends.breaker import CircuitBreaker

    caplog.set_level(logging.INFO)
    clock = _Clock()
    breaker = CircuitBreaker("srv", backoff=1.0, max_backoff=4.0, clock=clock)
    breaker.before_call()
    breaker.failure(ConnectionError("down"))
    windows = []
    for _ in range(5):
        with pytest.raises(BackendUnavailableError, match="circuit open"):
            breaker.before_call()
        start = clock.now
        while True:  # step the clock until a probe is let through
            clock.now += 0.25
            try:
                breaker.before_call()
                break
            except BackendUnavailableError:
                continue
        windows.append(clock.now - start)
        breaker.failure(ConnectionError("still down"))
    assert windows == [1.0, 2.0, 4.0, 4.0, 4.0]
    clock.now += 4.0
    breaker.before_call()
    breaker.success()
    assert breaker.state == "closed"
    breaker.before_call()  # closed: no error
    assert len(_breaker_records(caplog, logging.WARNING)) == 1
    assert len(_breaker_records(caplog, logging.INFO)) == 1
    assert breaker.stats().opened == 1 and breaker.stats().probes == 6


def test_breaker_relapse_is_the_same_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A failure soon after recovering (one cluster node still down) logs nothing new."""
    from runtime_cache.backends.breaker import CircuitBreaker

    caplog.set_level(logging.INFO)
    clock = _Clock()
    breaker = CircuitBreaker("srv", backoff=1.0, max_backoff=8.0, clock=clock)
    breaker.failure(ConnectionError("node down"))
    for expected_delay in (2.0, 4.0, 8.0, 8.0):
        clock.now += 10.0  # the window has passed: this call is the probe
        breaker.before_call()
        breaker.success()  # the probe reached a healthy node...
        clock.now += 0.5
        breaker.failure(ConnectionError("node down"))  # ...the next call hit the dead one
        assert breaker.stats().delay == expected_delay
    assert breaker.stats().opened == 1
    assert len(_breaker_records(caplog, logging.WARNING)) == 1
    assert len(_breaker_records(caplog, logging.INFO)) == 1
    clock.now += 10.0
    breaker.before_call()
    breaker.success()
    clock.now += 100.0  # quiet for longer than the window: the outage is over
    breaker.failure(ConnectionError("down again"))
    assert breaker.stats().opened == 2 and breaker.stats().delay == 1.0
    assert len(_breaker_records(caplog, logging.WARNING)) == 2


def test_threads_during_a_hang_wait_at_most_once_each(
    redis_process: RedisProcess, unique_prefix: str
) -> None:
    import threading

    backend = _backend(redis_process.url, unique_prefix, timeout="300ms", backoff="100ms")
    cache = rc.Cache(backend, secret="test-secret")
    assert cache.put(_key(1), b"v")
    slow: list[float] = []
    failures: list[BaseException] = []
    redis_process.pause()

    def work() -> None:
        try:
            until = time.monotonic() + 0.8
            while time.monotonic() < until:
                started = time.perf_counter()
                cache.get(_key(1))
                elapsed = time.perf_counter() - started
                if elapsed > backend.timeout / 2:
                    slow.append(elapsed)
                time.sleep(0.002)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        redis_process.resume()
    assert not failures
    breaker = backend.breaker.stats()
    # Calls in flight when the server hung each wait once; after that only probes wait.
    assert len(slow) <= len(threads) + breaker.probes
    assert breaker.fast_failures > 10 * len(slow)
    backend.close()


def test_prune_with_the_redis_tier_down_says_what_it_removed_and_where_entries_live_on(
    redis_process: RedisProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator review (helper-77): ``prune --max-size`` on ``dir://...,redis://...``
    with Redis down removed entries from the folder and said "removed 0 entries", "20
    remain", and that they could not be removed for "an immutable file or folder, a
    read-only mount, a permission"."""
    from runtime_cache.cli import main

    url = f"dir://{tmp_path / 'c'},{redis_process.url}?prefix=prune:"
    secret = ["--secret", "s" * 32]
    cache = rc.Cache(rc.open_backend(url), secret="s" * 32)
    for i in range(20):
        cache.put(_key(i), bytes([i]) * 10_000)
    cache.close()
    redis_process.stop()
    capsys.readouterr()
    assert main(["--cache", url, *secret, "prune", "--max-size", "100KB"]) == 1
    out, err = capsys.readouterr()
    from runtime_cache.backends.directory import DirectoryBackend

    left = len(list(DirectoryBackend(tmp_path / "c").keys()))
    removed = int(out.split()[1])
    assert removed == 20 - left and removed > 0, out
    assert "immutable" not in err and "could not be reached" in err, err
