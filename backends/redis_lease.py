"""Build leases for ``redis://``: ``SET NX PX`` with a random token.

The holder renews the expiry every ``ttl / 3`` seconds while its build runs, and
both renewal and release compare the token first (in one Lua script), so a
holder whose lease expired never extends or deletes the next holder's. A killed
holder stops renewing, and its lease expires after at most ``ttl`` seconds. Whatever else
sits at a lease's name (another type, no expiry, an expiry far past ``ttl``) is removed
when a lease is taken, so a planted key holds nobody off.

With the cache's secret (:meth:`~runtime_cache.api.Backend.sign_leases`), a token also
carries an HMAC of the lease's name and its nonce. A taker that finds the name held reads
the token there (a short string only) and checks it: one that no key of the secret signed
was planted by someone who can write the store but has no secret (a string that expires
within the hour held every process off for its whole wait, 92 s by default, per key), and
is removed, and the lease taken at once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Sequence
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
#: The token at a lease's name: 0 when there is none, 1 when it is longer than ARGV[1]
#: (another type was removed by _TAKE), else the token.
_HOLDER = (
    "local t = redis.call('type', KEYS[1])['ok'] "
    "if t == 'none' then return 0 end "
    "if t ~= 'string' or redis.call('strlen', KEYS[1]) > tonumber(ARGV[1]) then return 1 end "
    "return redis.call('get', KEYS[1])"
)
#: Remove the string at a lease's name if it is longer than any token (ARGV[1]).
_DROP_LONG = (
    "if redis.call('type', KEYS[1])['ok'] == 'string' "
    "and redis.call('strlen', KEYS[1]) > tonumber(ARGV[1]) then "
    "return redis.call('del', KEYS[1]) else return 0 end"
)
#: A signed token: a nonce, a dot, and the HMAC's first bytes, in hex.
_NONCE, _MAC = 16, 16
_TOKEN_MAX = 2 * (_NONCE + _MAC) + 1


def _mac(key: bytes, name: str, nonce: str) -> str:
    message = f"runtime-cache lease\n{name}\n{nonce}".encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[: 2 * _MAC]


def _signed(keys: Sequence[bytes], name: str, token: bytes) -> bool:
    nonce, _, mac = token.decode("ascii", "replace").partition(".")
    return any(hmac.compare_digest(_mac(key, name, nonce), mac) for key in keys)


class RedisLease(Lease):
    """A lease stored under the Redis key ``name``.

    ``run(op, call)`` runs ``call(client)`` with the backend's error handling
    (it raises :class:`~runtime_cache.errors.BackendError`).
    """

    renews = True

    def __init__(
        self, run: Runner, name: str, key: str, ttl: float, keys: Sequence[bytes] = ()
    ) -> None:
        super().__init__(key, ttl)
        self._run = run
        self.name = name
        self._keys = tuple(keys)  # the secret's: the first signs, any verifies
        nonce = secrets.token_hex(_NONCE)
        self._token = f"{nonce}.{_mac(keys[0], name, nonce)}" if keys else nonce
        self._ms = max(1, min(int(self.ttl * 1000), MAX_TTL_MS))

    def _take(self) -> bool:
        name, token, ms = self.name, self._token, self._ms

        def take(client: Any) -> bool:
            return bool(client.eval(_TAKE, 1, name, token, ms, MAX_TTL_MS))

        if self._run("lease", take):
            return True
        if not self._keys:
            return False
        holder = self._run("lease", lambda c: c.eval(_HOLDER, 1, name, _TOKEN_MAX))
        if holder == 0:  # gone since: try once more
            return bool(self._run("lease", take))
        drop: tuple[str, bytes | int]
        if isinstance(holder, bytes):
            if _signed(self._keys, name, holder):
                return False  # a live holder with this secret
            drop = (_RELEASE, holder)  # that token only, should it change meanwhile
        else:  # longer than any token: never a holder's
            drop = (_DROP_LONG, _TOKEN_MAX)
        # Planted by a writer without the secret: removed, then the lease taken.
        self._run("lease", lambda c: c.eval(drop[0], 1, name, drop[1]))
        return bool(self._run("lease", take))

    def _extend(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        return bool(self._run("lease", lambda c: c.eval(_RENEW, 1, name, token, ms)))

    def _drop(self) -> None:
        name, token = self.name, self._token
        self._run("lease", lambda c: c.eval(_RELEASE, 1, name, token))
