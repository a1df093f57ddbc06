"""Redis backends for tests: opened from a URL, and emptied afterwards (see
:mod:`redis_servers` for the servers they talk to)."""

from __future__ import annotations

from typing import Any

import runtime_cache as rc


def open_redis(url: str) -> Any:
    """The :class:`~runtime_cache.backends.redis.RedisBackend` that ``url`` opens."""
    from runtime_cache.backends.redis import RedisBackend

    backend = rc.open_backend(url)
    assert isinstance(backend, RedisBackend)
    return backend


def drop_keys(backend: Any) -> None:
    """Delete every key under ``backend``'s prefix, and close it."""
    for key in list(backend.keys()):
        backend.delete(key)
    backend.close()
