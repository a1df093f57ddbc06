"""Build leases for ``redis://``: ``SET NX PX`` with a random token.

The holder renews the expiry every ``ttl / 3`` seconds while its build runs, and
both renewal and release compare the token first (in one Lua script), so a
holder whose lease expired never extends or deletes the next holder's. A killed
holder stops renewing, and its lease expires after at most ``ttl`` seconds. Whatever else
sits at a lease's name (another type, no expiry, an expiry far past ``ttl``) is removed
when a lease is taken, so a planted key holds nobody off.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from runtime_cache.api import Lease

__all__ = ["MAX_TTL_MS", "RedisLease"]

Runner = Callable[[str, Callable[[Any], Any]], Any]

#: The longest a lease lives without renewal (a longer ``ttl`` is cut to it): a key at a
#: lease's name that expires later than this was not set by a holder, whatever its ttl.
MAX_TTL_MS = 3_600_000

#: Take the lease: ``SET NX PX``, after removing what cannot be a live lease at its name (a
#: key of another type, or one that never expires or expires later than any lease may,
#: ARGV[3]: planted, it would hold every process off until its wait gave up).
_TAKE = (
    "local t = redis.call('type', KEYS[1])['ok'] "
    "if t ~= 'none' then "
    "  local left = redis.call('pttl', KEYS[1]) "
    "  if t ~= 'string' or left < 0 or left > tonumber(ARGV[3]) then "
    "    redis.call('del', KEYS[1]) end end "
    "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])"
)
#: Whether the lease's name holds this holder's token. Its type and length come first: a
#: value swapped in at the name (400 MB seen) is never copied into the script.
_OURS = (
    "redis.call('type', KEYS[1])['ok'] == 'string' "
    "and redis.call('strlen', KEYS[1]) == #ARGV[1] "
    "and redis.call('get', KEYS[1]) == ARGV[1]"
)
_RENEW = f"if {_OURS} then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = f"if {_OURS} then return redis.call('del', KEYS[1]) else return 0 end"


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
        self._ms = max(1, min(int(self.ttl * 1000), MAX_TTL_MS))

    def _take(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        return bool(self._run("lease", lambda c: c.eval(_TAKE, 1, name, token, ms, MAX_TTL_MS)))

    def _extend(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        return bool(self._run("lease", lambda c: c.eval(_RENEW, 1, name, token, ms)))

    def _drop(self) -> None:
        name, token = self.name, self._token
        self._run("lease", lambda c: c.eval(_RELEASE, 1, name, token))
