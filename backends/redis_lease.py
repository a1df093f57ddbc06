"""Build leases for ``redis://``: ``SET NX PX`` with a random token.

The holder renews the expiry every ``ttl / 3`` seconds while its build runs, and
both renewal and release compare the token first (in one Lua script), so a
holder whose lease expired never extends or deletes the next holder's. A killed
holder stops renewing, and its lease expires after at most ``ttl`` seconds. Whatever else
sits at a lease's name (another type, no expiry, an expiry far past ``ttl``) is removed
when a lease is taken, so a planted key holds nobody off.

With the cache's secret (:meth:`~runtime_cache.api.Backend.sign_leases`), tokens are
signed and expire (:mod:`.lease_tokens`): a taker that finds the name held by a token no
key of the secret signed, or one that ran out, replaces it in one step, so a string planted
by someone without the secret (which held every process off for its whole wait, 92 s by
default, per key) holds nobody off, looping or replayed. Token times are the clock of the
server that holds the lease, never a machine's own (:mod:`.redis_clock`): a holder stamps
its tokens with its estimate of that clock, and a taker judges a token by the exact time
the script that read it returns, so how far the machines' own clocks differ no longer
counts (a taker 26-40 s ahead of a live holder took its lease over when it did). Unsigned
leases need no clock: they rely on the server's ``PX``.

A holder whose entry the store refused for its size leaves a note
(:meth:`runtime_cache.lease.Lease.note_unstored`) at the lease's name followed by the
byte ``0xff`` and ``unstored``: no text key makes that name, and listings skip it (it is
not UTF-8). It expires on the server (a key there that never expires, or only after
:data:`MAX_TTL_MS`, is no note); with the secret it holds a token signed for the note
(not for the lease), and a note no key signed, or that ran out by the server's clock, is
no note.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from runtime_cache.api import Lease
from runtime_cache.errors import BackendError

from .lease_tokens import MAX_TOKEN, genuine, make_token
from .redis_clock import TIME_MS, ServerClock, node_of

__all__ = ["MAX_TTL_MS", "RedisLease"]

Runner = Callable[[str, Callable[[Any], Any]], Any]

#: The longest a lease lives without renewal (a longer ``ttl`` is cut to it): a key at a
#: lease's name that expires later than this was not set by a holder, whatever its ttl.
MAX_TTL_MS = 3_600_000

#: What follows a lease's name in its note's: not UTF-8, so no key's lease has the name.
_NOTE_TAIL = b"\xffunstored"
#: What follows the lease's name in what a note's token signs: a lone surrogate, which
#: no key holds (check_text_key), so no lease's token counts as a note's.
_NOTE_SIGNED = "\udcffunstored"

#: Leave a note (ARGV[1], PX ARGV[2]); what is at its name and not a string is freed by
#: the server's background thread (UNLINK), as a plain SET over a planted set would not.
_NOTE_SET = (
    "if redis.call('type', KEYS[1])['ok'] ~= 'string' then redis.call('unlink', KEYS[1]) end "
    "return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])"
)
#: The note: a string of at most ARGV[1] bytes that expires within ARGV[2] ms, else nil
#: (a planted key that never expires, or far ahead, is no note).
_NOTE_GET = (
    "if redis.call('type', KEYS[1])['ok'] ~= 'string' then return false end "
    "local left = redis.call('pttl', KEYS[1]) "
    "if left <= 0 or left > tonumber(ARGV[2]) "
    "or redis.call('strlen', KEYS[1]) > tonumber(ARGV[1]) then return false end "
    "return redis.call('get', KEYS[1])"
)

#: Take the lease: ``SET NX PX``, after removing what cannot be a live lease at its name (a
#: key of another type, or one that never expires or expires later than any lease may,
#: ARGV[3]: planted, it would hold every process off until its wait gave up). ``UNLINK``: a
#: planted set of millions of members is freed by the server's background thread, not here.
#: The name holding this very token (ARGV[1], fresh per take) is a take that the client
#: sent again after its reply was lost: it is taken, not held by someone else.
_TAKE = (
    "local t = redis.call('type', KEYS[1])['ok'] "
    "if t ~= 'none' then "
    "  local left = redis.call('pttl', KEYS[1]) "
    "  if t ~= 'string' or left < 0 or left > tonumber(ARGV[3]) then "
    "    redis.call('unlink', KEYS[1]) "
    "  elseif redis.call('strlen', KEYS[1]) == #ARGV[1] "
    "  and redis.call('get', KEYS[1]) == ARGV[1] then "
    "    return redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) end end "
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
#: The token at a lease's name, and the server's time in ms then (a taker judges the token by
#: it, not by its own clock): {0, now} when there is none, {1, now} when it is longer than
#: ARGV[1] (another type was removed by _TAKE), else {the token, now}.
_HOLDER = TIME_MS + (
    "local t = redis.call('type', KEYS[1])['ok'] "
    "if t == 'none' then return {0, now} end "
    "if t ~= 'string' or redis.call('strlen', KEYS[1]) > tonumber(ARGV[1]) then "
    "return {1, now} end "
    "return {redis.call('get', KEYS[1]), now}"
)
#: With a secret: the note (as _NOTE_GET; nil when none) and the server's time in ms then.
_NOTE_GET_TIMED = TIME_MS + f"return {{(function() {_NOTE_GET} end)(), now}}"
#: Put token ARGV[2] (PX ARGV[3]) at the name in place of what is there: nothing, exactly
#: ARGV[1] (ARGV[5] 'exact'; an empty string too), a string longer than ARGV[4] (ARGV[5]
#: 'long'), or (with ARGV[5] 'exact') any string that is not shaped as a signed token: no
#: holder's. One step: a writer looping on the name cannot take it between a removal and a
#: take, nor win by changing a junk value faster than a look and a swap; one that changes
#: token-shaped values that fast, three looks running, is built past (_take_over).
_SWAP = (
    "local t = redis.call('type', KEYS[1])['ok'] "
    "local n = t == 'string' and redis.call('strlen', KEYS[1]) or -1 "
    "local take = t == 'none' or (ARGV[5] == 'long' and n > tonumber(ARGV[4])) "
    "if not take and ARGV[5] == 'exact' and n >= 0 and n <= tonumber(ARGV[4]) then "
    "  local v = redis.call('get', KEYS[1]) "
    "  take = v == ARGV[1] or #v ~= #ARGV[2] or not string.match(v, '^%x+%.%d+%.%x+$') end "
    "if take then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
)
#: Whether the name holds one of this holder's tokens: ARGV[1], ARGV[2], or any of ARGV[4..]
#: (those a renewal may have put there unanswered); all signed tokens have one length, so a
#: swapped-in value is never read.
_OURS_ANY = (
    "(function() "
    "if redis.call('type', KEYS[1])['ok'] ~= 'string' "
    "or redis.call('strlen', KEYS[1]) ~= #ARGV[1] then return false end "
    "local v = redis.call('get', KEYS[1]) "
    "if v == ARGV[1] or v == ARGV[2] then return true end "
    "for i = 4, #ARGV do if v == ARGV[i] then return true end end "
    "return false end)()"
)
#: Renewal with a signed token: put a fresh one (ARGV[2]) in place of this holder's. The old
#: one (ARGV[1]), the fresh one (a retried call whose first reply was lost) or one an earlier
#: renewal may have put there unanswered (ARGV[4..]) all count as this holder's.
_RENEW_SWAP = (
    f"if {_OURS_ANY} then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end return 0"
)
#: Release with a signed token: any of this holder's tokens, as for renewal.
_RELEASE_ANY = f"if {_OURS_ANY} then return redis.call('del', KEYS[1]) end return 0"
#: Renewals whose replies may have been lost, kept as this holder's possible tokens (one
#: whose call the breaker refused makes no token, so counts no more: before tokens were made
#: in the call, 4 were used up by quick retries).
_UNANSWERED = 16


def _eval(script: str, name: str | bytes, args: tuple[Any, ...], client: Any) -> Any:
    return client.eval(script, 1, name, *args)


class RedisLease(Lease):
    """A lease stored under the Redis key ``name``.

    ``run(op, call)`` runs ``call(client)`` with the backend's error handling
    (it raises :class:`~runtime_cache.errors.BackendError`).
    """

    renews = True

    def __init__(
        self,
        run: Runner,
        name: str,
        key: str,
        ttl: float,
        keys: Sequence[bytes] = (),
        clock: ServerClock | None = None,
    ) -> None:
        # Renewed every ttl/3: a ttl over the longest a lease may live would renew too late.
        super().__init__(key, min(ttl, MAX_TTL_MS / 1000))
        self._run = run
        self.name = name
        self._keys = tuple(keys)  # the secret's: the first signs, any verifies
        self._ms = max(1, int(self.ttl * 1000))
        #: The server's clock that signed tokens count in: the backend's, shared by its leases.
        self._clock = clock if clock is not None else ServerClock()
        # Never sent before a take replaces it: a signed token needs the server's time.
        self._token = secrets.token_hex(16)
        #: Fresh tokens renewals sent whose replies were lost: one may be the one there now.
        self._unanswered: list[str] = []

    def _signed(self, client: Any) -> str:
        # A fresh token stamped with the server's time: a round trip only when this process
        # has no recent reading of the clock of the node that holds the lease.
        now_ms = self._clock.now_ms(client, self.name)
        return make_token(self._keys[0], self.name, self._ms, now_ms)

    def _take(self) -> bool:
        name, ms = self.name, self._ms
        self._unanswered = []
        # A signed token is made in the call, which has the client to read the clock with.
        self._token = "" if self._keys else secrets.token_hex(16)

        def take(client: Any) -> Any:
            if not self._token:  # one per take: a call sent again must find its own there
                self._token = self._signed(client)
            return client.eval(_TAKE, 1, name, self._token, ms, MAX_TTL_MS)

        try:
            if self._run("lease", take):
                return True
            return self._take_over(self._token) if self._keys else False
        except Exception:
            if self._token:  # none made when the clock could not be read: nothing was sent
                self._forget()  # maybe taken, unanswered: not left for others to wait on
            raise

    def _holder(self, client: Any) -> tuple[Any, int]:
        # What is at the name, and the server's time then (a reading of its clock, free).
        sent = self._clock.sent()
        holder, now_ms = client.eval(_HOLDER, 1, self.name, MAX_TOKEN)
        self._clock.heard(node_of(client, self.name), now_ms, sent)
        return holder, int(now_ms)

    def _take_over(self, token: str) -> bool:
        # The name is held: by a live holder with this secret, or by what someone without it
        # planted (or left), which is replaced in one step.
        name, ms = self.name, self._ms
        forged = 0  # looks that found a token no key signed, changed before the swap
        for _ in range(3):  # a token shaped value that changed since the look: look again
            holder, now_ms = self._run("lease", self._holder)
            if holder == token.encode():  # a swap sent again after its reply was lost
                return True
            # Judged by the time of the server that holds it: a taker whose own clock runs
            # ahead of the holder's must not find a live holder's token run out.
            if isinstance(holder, bytes) and genuine(self._keys, name, holder, now_ms):
                return False
            # Nothing there now, a token no key signed or that ran out (an empty string too),
            # or a string longer than any token.
            mode, expected = ("exact", holder) if isinstance(holder, bytes) else ("long", b"")
            swap = (expected, token, ms, MAX_TOKEN, mode)
            if self._run("lease", partial(_eval, _SWAP, name, swap)):
                return True
            forged += isinstance(holder, bytes)
        if forged == 3:
            # A writer without the secret changing token-shaped values faster than a look
            # and a swap: no holder of ours, so none is waited for (as dir:// builds when a
            # lock is held with no genuine token); the caller builds without a lease.
            raise BackendError(
                f"lease {name!r}: held by values no key of the secret signed, changed "
                "faster than they can be replaced"
            )
        return False

    def _forget(self) -> None:
        try:
            self._drop()
        except Exception:  # the store is away: the token expires after ttl
            pass

    def _extend(self) -> bool:
        name, token, ms = self.name, self._token, self._ms
        if not self._keys:
            return bool(self._run("lease", lambda c: c.eval(_RENEW, 1, name, token, ms)))
        earlier = self._unanswered[-_UNANSWERED:]
        made: list[str] = []  # one fresh token per renewal, however often its call is sent

        def renew(client: Any) -> Any:
            if not made:
                made.append(self._signed(client))  # a live holder's token never runs out
                self._unanswered = [*earlier, made[0]]  # until a reply says whether it was put
            return client.eval(_RENEW_SWAP, 1, name, token, made[0], ms, *earlier)

        if not self._run("lease", renew):
            self._unanswered = earlier
            return False
        self._token, self._unanswered = made[0], []
        return True

    @property
    def _note_name(self) -> bytes:
        return self.name.encode("utf-8") + _NOTE_TAIL

    def _note(self, seconds: float) -> None:
        ms = max(1, min(int(seconds * 1000), MAX_TTL_MS))
        if not self._keys:
            self._run("lease", partial(_eval, _NOTE_SET, self._note_name, ("unstored", ms)))
            return
        signed, note_name = self.name + _NOTE_SIGNED, self._note_name

        def leave(client: Any) -> Any:
            # Stamped by the clock of the node that holds the note (in a cluster, maybe
            # not the lease's).
            note = make_token(self._keys[0], signed, ms, self._clock.now_ms(client, note_name))
            return client.eval(_NOTE_SET, 1, note_name, note, ms)

        self._run("lease", leave)

    def _noted(self) -> bool:
        script = _NOTE_GET_TIMED if self._keys else _NOTE_GET
        found = self._run("lease", partial(_eval, script, self._note_name, (MAX_TOKEN, MAX_TTL_MS)))
        if not self._keys:
            return isinstance(found, bytes) and bool(found)
        note, now_ms = found  # judged by the server's time, as a lease's token is
        if not isinstance(note, bytes) or not note:
            return False
        return genuine(self._keys, self.name + _NOTE_SIGNED, note, int(now_ms))

    def _drop(self) -> None:
        name, token = self.name, self._token
        if not self._keys:
            self._run("lease", lambda c: c.eval(_RELEASE, 1, name, token))
            return
        release = (token, token, "", *self._unanswered)
        self._run("lease", partial(_eval, _RELEASE_ANY, name, release))
