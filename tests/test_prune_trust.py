"""Prune and entries no reader of the cache serves: unsigned ones in a signed store, and
ones dated in the future.

The attacker review of session 40: with a secret, a writer without it planted five
unsigned entries dated in the year 2514 beside five good signed ones in Redis (which
keeps no last uses, so prune goes by the date an entry claims). ``prune --older-than 1s``
and ``prune --max-size`` then removed every good entry and kept all the planted ones.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import runtime_cache as rc
from runtime_cache.codec import encode_entry
from runtime_cache.pruning import prune

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

SECRET = "fleet-secret-0123456789abcdef"


def _key(name: str) -> rc.CacheKey:
    return rc.make_key(module_id=name, runtime="opencl", purpose="program-binary")


def _plant(cache: rc.Cache, name: str, created_at: float, secret: str | None = None) -> str:
    k = _key(name)
    raw = rc.Cache(cache.backend, insecure=True)  # (the store itself, no check)
    blob = encode_entry(
        str(k),
        k.parts,
        b"X" * 10_000,
        created_at=created_at,
        secret=None if secret is None else secret.encode(),
    )
    raw.backend.set(str(k), blob)
    return str(k)


def _state(cache: rc.Cache, goods: list[str], planted: list[str]) -> tuple[int, int]:
    keys = {item.key for item in cache.backend.scan()}
    return sum(k in keys for k in goods), sum(k in keys for k in planted)


def test_planted_entries_go_before_good_ones(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    cache = rc.Cache(rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}"), secret=SECRET)
    goods = [str(_key(f"good@{i}")) for i in range(5)]
    for i in range(5):
        cache.put(_key(f"good@{i}"), b"G" * 10_000)
    future = [_plant(cache, f"future@{i}", 2**34 - 1) for i in range(3)]
    unsigned = [_plant(cache, f"unsigned@{i}", time.time() + 60) for i in range(2)]
    size = next(item.size for item in cache.backend.scan() if item.key == goods[0])
    # For size: the five planted go first, though the newest by what they claim.
    report = prune(cache, max_size=5 * size + 100)
    assert _state(cache, goods, future + unsigned) == (5, 0)
    assert report.removed == 5 and sorted(k for k, _ in report.untrusted) == sorted(
        future + unsigned
    )
    assert {why for _, why in report.untrusted} == {
        "dated in the future",
        "unsigned, and this cache has a secret",
    }
    # For age: one dated in the future goes at any age; a good one only when old enough.
    future = [_plant(cache, f"future@{i}", 2**34 - 1) for i in range(3)]
    report = prune(cache, older_than=3600)
    assert _state(cache, goods, future) == (5, 0) and report.removed == 3
    # A signed entry dated within a day ahead (a fleet's clocks differ) is no suspect.
    ahead = _plant(cache, "ahead", time.time() + 3600, secret=SECRET)
    report = prune(cache, older_than=3600)
    assert report.removed == 0 and report.untrusted == [] and _state(cache, [ahead], [])[0] == 1
    # Without a secret, unsigned entries are the store's own: weighed as any other.
    plain = rc.Cache(cache.backend, insecure=True)
    report = prune(plain, max_size=10**9)
    assert report.untrusted == []
    cache.backend.close()
