"""Build leases for ``redis://``: ``SET NX PX`` with a random token.

The holder renews the expiry every ``ttl / 3`` seconds while its build runs, and
both renewal and release compare the token first (in one Lua script), so a
holder whose lease expired never extends or deletes the next holder's. A killed
holder stops renewing, and its lease expires after at most ``ttl`` seconds.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from runtime_cache.api import Lease

__all__ = ["RedisLease"]

Runner = Callable[[str, Callable[[Any], Any]], Any]

_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end"
)


class RedisLease(Lease):
    """A lease stored under the Redis key ``name``.

    ``run(op, call)`` runs ``call(client)`` with the backend's error handling
    (it raises :class:`~runtime_cache.errors.BackendError`).
    """

    renews = True

    def __init__(self, run: Runner, name: str, key: str, ttl: float) -> None:
        super().__init__(key, ttl)
        self._run = run
        self.name = name
        self._token = secrets.token_hex(16)
        self._ms = max(1, int(self.ttl * 1000))

    def _take(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        return bool(self._run("lease", lambda c: c.set(name, token, nx=True, px=ms)))

    def _extend(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        return bool(self._run("lease", lambda c: c.eval(_RENEW, 1, name, token, ms)))

    def _drop(self) -> None:
        name, token = self.name, self._token
        self._run("lease", lambda c: c.eval(_RELEASE, 1, name, token))
