"""A waiter of a fleet does not read a refused entry whole on every poll.

From an attacker review: in a signed cache on Redis, one process built under the lease
while another waited for its entry, and someone who can write the store planted a large
entry with a forged signature at the key. The waiter polls (one byte) and, since a value
is there, reads it: Redis reads values whole, so every poll read the planted 64 MiB again
(1.2 GB from the server to one waiter in 9 s). Now a wait reads a blob it refused once,
then only its first bytes while they stay the same; the good entry, once stored, is read.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import redis
from forged_entries import forge

import runtime_cache as rc
from runtime_cache.fleet import LeasePolicy

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]
pytestmark = pytest.mark.redis

SECRET = "fleet-secret"
SIZE = 4 << 20


def _counted(backend: Any, reads: Counter[str]) -> None:
    # Count the bytes each kind of read brings back (instance attributes over the class's).
    def wrap(name: str) -> None:
        real: Callable[..., Any] = getattr(backend, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            found = real(*args, **kwargs)
            if isinstance(found, (bytes, bytearray)):
                reads[name] += len(found)
            elif isinstance(found, tuple):
                reads[name] += sum(len(p) for p in found)
            return found

        setattr(backend, name, call)

    for name in ("get", "head"):  # (get_parts and peek read through get)
        wrap(name)


def test_a_forged_entry_is_read_whole_once_while_a_fleet_member_waits(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    url = f"{redis_server.url}?prefix={unique_prefix}"
    key = rc.make_key(module_id="m", runtime="fleet", purpose="poll")
    holder = rc.Cache(rc.open_backend(url), secret=SECRET)
    waiter = rc.Cache(rc.open_backend(url), secret=SECRET)
    waiter.fleet.policy = LeasePolicy(ttl=5.0, first_poll=0.01, max_poll=0.02)
    reads: Counter[str] = Counter()
    _counted(waiter.backend, reads)
    building, planted = threading.Event(), threading.Event()

    def build() -> bytes:
        building.set()
        assert planted.wait(10)
        time.sleep(1.0)  # the waiter polls meanwhile: about 50 times
        return b"good"

    got: list[bytes] = []
    holding = threading.Thread(target=lambda: got.append(holder.get_or_build(key, build)))
    holding.start()
    try:
        assert building.wait(10)
        forged = forge(key, b"\0" * SIZE, created_at=time.time(), signature=b"\0" * 32)
        redis.Redis.from_url(redis_server.url).set(unique_prefix + str(key), forged)
        planted.set()
        assert waiter.get_or_build(key, lambda: b"built by the waiter") == b"good"
    finally:
        holding.join(10)
    assert got == [b"good"]
    stats = waiter.stats()
    assert stats.lease_waits == 1 and stats.builds == 0
    # The miss and the first poll read it whole (each through get), later polls its head.
    assert reads["get"] <= 2 * len(forged) + 4096, reads  # (and the good entry)
    assert reads["head"] < 2 * len(forged) // 8, reads
    holder.close()
    waiter.close()
