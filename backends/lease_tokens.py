"""Signed lease tokens: a lease planted by someone without the secret holds nobody off.

A shared store's build lease is a token at a name. Anyone who can write the store can
put a string there; without a check, every process then waits the lease out (92 s per
key by default). With the cache's secret, a holder's token is ``nonce.expiry.mac``:

* ``nonce``: 16 random bytes, in hex;
* ``expiry``: when the token stops counting, in milliseconds since the epoch on the
  clock of the server that holds the lease (:mod:`.redis_clock`): the lease's time to
  live, plus :data:`SLACK_MS` for what a holder's estimate of that clock may be off by.
  The holder makes a new token at each renewal, so a live holder's token never runs out,
  and a token copied from the store and planted again later (a replay) counts for at most
  that long;
* ``mac``: the first 16 bytes, in hex, of an HMAC-SHA256 of the lease's name, the nonce and
  the expiry, under the first key of the secret. Any key of the secret verifies it.

A taker that finds a token no key signed, or one that ran out, or a string longer than
any token, replaces it in one step (compare-and-set on the server), so a writer looping
on the name cannot slip in between a removal and a take.

Both functions take "now" from their caller, never from the local clock: machines' wall
clocks differ (a taker 26-40 s ahead of a live holder took its lease over when expiries
were the holder's ``time.time()`` and the taker judged them by its own), while the server
that holds the lease is one clock for all of them.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from collections.abc import Sequence

from runtime_cache.fork_locks import renew_in_child

__all__ = ["MAX_TOKEN", "SLACK_MS", "LeaseSigning", "genuine", "make_token"]

#: Milliseconds a token counts past its lease's time to live: what a holder's estimate of
#: the server's clock may be off by (a node relearned late, a stepped server clock).
SLACK_MS = 10_000
_NONCE = 16
_MAC = 16
#: The longest token (a nonce, 13 digits of milliseconds, a MAC and two dots); anything
#: longer at a lease's name is not a holder's.
MAX_TOKEN = 2 * _NONCE + 20 + 2 * _MAC + 2


def _mac(key: bytes, name: str, nonce: str, expiry: str) -> str:
    message = f"runtime-cache lease\n{name}\n{nonce}\n{expiry}".encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[: 2 * _MAC]


def make_token(key: bytes, name: str, ttl_ms: int, now_ms: int) -> str:
    """A fresh token for the lease at ``name``, signed with ``key``, counting for ``ttl_ms``
    (plus :data:`SLACK_MS`) from ``now_ms``, the server's time in milliseconds since the
    epoch (:meth:`.redis_clock.ServerClock.now_ms`)."""
    nonce = os.urandom(_NONCE).hex()  # (what secrets.token_hex does; imported with dir://)
    expiry = str(now_ms + ttl_ms + SLACK_MS)
    return f"{nonce}.{expiry}.{_mac(key, name, nonce, expiry)}"


def genuine(keys: Sequence[bytes], name: str, token: bytes, now_ms: int) -> bool:
    """Whether ``token`` (found at the lease's ``name``) was signed by one of ``keys`` and
    has not run out by ``now_ms``, the time of the server that holds it."""
    # Bytes that are no ASCII are no holder's: compare_digest raised TypeError on a
    # non-ASCII str (U+FFFD from a "replace" decode), which left a lock's file open.
    if len(token) > MAX_TOKEN or not token.isascii():
        return False
    parts = token.decode("ascii").split(".")
    if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) < now_ms:
        return False
    nonce, expiry, mac = parts
    return any(hmac.compare_digest(_mac(key, name, nonce, expiry), mac) for key in keys)


class LeaseSigning:
    """A shared folder's lease signing: the secret's keys (the newest cache's first signs,
    any verifies; 8 at most), and since when each key's lock has been seen held with no
    genuine token. Kept by the backend and shared by its leases: callers such as
    ``build_all`` ask for a new lease at each try."""

    #: Seconds after which a look with no token is forgotten: a waiter looks every 0.5 s
    #: at most, so only a wait that ended (a later one, at another holder) goes past it.
    FORGET_AFTER = 2.0

    def __init__(self) -> None:
        self.keys: tuple[bytes, ...] = ()
        # lock name -> (first look with no genuine token, latest such look), monotonic
        self._unsigned: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    def add(self, keys: tuple[bytes, ...]) -> None:
        """Sign with ``keys`` from now on; earlier keys still verify."""
        self.keys = (*keys, *(k for k in self.keys if k not in keys))[:8]

    def unsigned_for(self, name: str) -> float:
        """Seconds since the lock ``name`` was first seen held with no genuine token, in
        looks no further apart than :attr:`FORGET_AFTER` (0.0 at the first look)."""
        now = time.monotonic()
        with self._lock:
            if len(self._unsigned) >= 4096:
                self._unsigned.clear()
            first, latest = self._unsigned.get(name, (now, now))
            if now - latest > self.FORGET_AFTER:  # an earlier wait's look: not this holder's
                first = now
            self._unsigned[name] = (first, now)
            return now - first

    def signed(self, name: str) -> None:
        """The lock ``name`` is held with a genuine token, or was taken: forget any look."""
        with self._lock:
            self._unsigned.pop(name, None)
