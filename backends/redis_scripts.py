"""What ``redis://`` runs on the server, and how it reads names and replies.

Kept apart from :mod:`.redis` (the backend): the Lua scripts of a compare-and-delete and
of a capped read, and the reads built on them (a value over the size cap is never sent; a
key of another type is a miss; one ``get_many`` holds at most its total budget).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from runtime_cache.errors import EntryTooLargeError

__all__ = [
    "DELETE_IF",
    "DELETE_IF_UNCHANGED",
    "HOLD_CAPS",
    "READ_SMALL",
    "SMALL",
    "CappedReads",
    "checked",
    "refuse_over_cap",
    "refused",
]

log = logging.getLogger(__name__)

#: Delete a key while it holds the value whose SHA-1 is ARGV[1]: the digest is sent, not the
#: value (a planted 500 MB value, sent back whole, timed out and opened the breaker). A key
#: of another type is no entry: it goes too.
DELETE_IF = (
    "local t = redis.call('TYPE', KEYS[1])['ok'] "
    "if t == 'none' then return 0 end "
    "if t ~= 'string' or redis.sha1hex(redis.call('GET', KEYS[1])) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0"
)

#: Delete a key while it is the string listed: ARGV[1] bytes long and beginning with the
#: bytes ARGV[2] (an entry's head: a rewrite changes it). Only the head is sent; ``prune``
#: removes entries this way, so one written again while it ran stays.
DELETE_IF_UNCHANGED = (
    "if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then return 0 end "
    "if redis.call('STRLEN', KEYS[1]) ~= tonumber(ARGV[1]) then return 0 end "
    "if #ARGV[2] > 0 and redis.call('GETRANGE', KEYS[1], 0, #ARGV[2] - 1) ~= ARGV[2] then "
    "return 0 end return redis.call('DEL', KEYS[1])"
)


#: Per name of KEYS: its value if it is at most ARGV[1] bytes (and the reply stays within
#: ARGV[2] bytes), else its size; -1 where there is no string (none, or another type). Any
#: other error (an ACL that refuses STRLEN) fails the script: never a quiet miss.
READ_SMALL = (
    "local small, budget, out, total = tonumber(ARGV[1]), tonumber(ARGV[2]), {}, 0 "
    "for i, name in ipairs(KEYS) do "
    "local n = redis.pcall('STRLEN', name) "
    "if type(n) == 'table' then "
    "if string.sub(tostring(n.err), 1, 9) ~= 'WRONGTYPE' then return n end out[i] = -1 "
    "elseif n > small or total + n > budget then out[i] = n "
    "else out[i] = redis.call('GET', name) or -1 total = total + n end end "
    "return out"
)
_READ_SMALL_SHA = hashlib.sha1(READ_SMALL.encode()).hexdigest()
#: Values up to this size come back in the script's reply: a script copies what it
#: returns (1 KiB values: 0.2 ms for 32, against 0.45 ms asked apart; at 16 KiB the script
#: is slower).
SMALL = 4 << 10
#: What one ``get_many`` holds by default, in values at the cap (``max_batch_size``).
HOLD_CAPS = 4
#: Names per script call or pipeline: one call's time on the server stays short.
CHUNK = 1000
#: Names remembered as over the cap, at most (each is logged once per process).
_LOGGED_MAX = 1024


def _wrong_type(reply: object) -> bool:
    return isinstance(reply, Exception) and str(reply).startswith("WRONGTYPE")


def refused(exc: Exception) -> bool:
    """Whether ``exc`` is a server's refusal of a command (not a failure of it)."""
    # An ACL's no (NOPERM, or inside a script "can't run this command"), or no such command.
    import redis

    text = str(exc).lower()
    return isinstance(exc, redis.exceptions.NoPermissionError) or any(
        words in text for words in ("can't run", "no permissions", "unknown command")
    )


def checked(reply: Any) -> Any:
    """A pipeline's ``reply``: a key of another type is a miss (``None``); another error
    reply is raised."""
    if isinstance(reply, Exception):
        if _wrong_type(reply):
            return None
        raise reply
    return reply


class CappedReads:
    """Reads that never bring more than ``cap`` bytes of one value over the wire, about
    ``budget`` bytes in one reply of ``get_many`` (the rest comes in further ones), and at
    most ``hold`` bytes in all in one ``get_many`` (the values past it are left out).

    ``get`` is one ``GETRANGE 0 cap``: a reply of ``cap + 1`` bytes shows a value over
    the cap (a name seen so is asked its size first from then on). ``get_many`` first
    runs a Lua script that returns the small values and the sizes of the others (a
    ``STRLEN`` pipeline on a cluster, whose scripts cannot span slots, or where scripts
    are refused), then ``GETRANGE``s each larger value that fits up to the size it had:
    a value swapped for a larger one in between brings one byte more, not the larger
    value, and is a miss. A value over the cap (planted, or written by a client with a
    larger cap) is a miss, logged once per name; a key of another type is a quiet miss;
    any other error reply (an ACL that refuses a command) is raised. Large values never
    pass through Lua, which copies what it returns (4-5 times slower on 1 MiB).

    Values planted at the cap added up: 16 of 64 MiB made one ``get_many`` hold 1.1 GiB
    for 7 s before the front refused them all. The larger values are read smallest first
    while what the call holds stays within ``hold``; those past it are left out of the
    result (misses; the front's caller reads them again, alone or in a smaller batch, or
    builds them), logged once per process at WARNING (then at DEBUG).
    """

    def __init__(
        self, cap: int, budget: int, name: str, cluster: bool, hold: int | None = None
    ) -> None:
        self.cap, self.budget, self.name, self.cluster = cap, budget, name, cluster
        # Four values at the cap by default; one value at the cap is always read.
        self.hold = max(HOLD_CAPS * cap if hold is None else hold, cap)
        self._left_logged = False
        self.scripts = not cluster  # a cluster's scripts cannot span slots
        self.transactions = True
        self._logged: set[str] = set()

    # ------------------------------------------------------------------ the contract
    def get(self, client: Any, full: str) -> bytes | None:
        """The value under ``full``, or ``None`` (none, another type, or over the cap)."""
        import redis

        try:
            if full in self._logged and client.strlen(full) > self.cap:
                return None  # still over: not sent again
            value: bytes = client.getrange(full, 0, self.cap)
            if not value:  # no key, an empty value, or one made since: ask both at once
                there, value = self._exists_and_read(client, full)
                if not there:
                    return None
        except redis.ResponseError as exc:
            if _wrong_type(exc):
                return None
            raise
        if not isinstance(value, bytes):  # a server that is no Redis (an array, a map)
            raise TypeError(f"GETRANGE answered a {type(value).__name__}, not a string")
        if len(value) > self.cap:
            self._over(full, len(value), more=True)
            return None
        return value

    def _exists_and_read(self, client: Any, full: str, last: int = -1) -> tuple[bool, bytes]:
        # In one transaction (MULTI/EXEC), so a value made or removed in between cannot
        # read as empty; bytes 0 to ``last`` (default: to the cap). Where transactions fail
        # (an ACL that refuses MULTI or EXEC, a redis-py whose cluster client has none),
        # the two go in a plain pipeline (where a value removed in between reads as empty),
        # said once.
        import redis

        end = self.cap if last < 0 else last

        def both(transaction: bool) -> tuple[bool, bytes]:
            pipe = client.pipeline(transaction=transaction)
            pipe.exists(full)
            pipe.getrange(full, 0, end)
            there, value = pipe.execute()
            return bool(there), value

        if self.transactions:
            try:
                return both(True)
            except (redis.exceptions.ResponseError, redis.exceptions.RedisClusterException) as exc:
                cluster = isinstance(exc, redis.exceptions.RedisClusterException)
                if _wrong_type(exc) or (cluster and "transaction" not in str(exc).lower()):
                    raise
                # Off for good only where MULTI/EXEC is refused (an ACL that refuses MULTI
                # answers EXEC "without MULTI"); a passing error (a server over its maxmemory
                # refuses MULTI) reads this miss in two steps alone.
                if cluster or refused(exc) or "without multi" in str(exc).lower():
                    self.transactions = False
                    log.info(
                        "runtime-cache: %s: no MULTI/EXEC (%s); misses read in two steps",
                        self.name,
                        exc,
                    )
        return both(False)

    def get_many(self, client: Any, fulls: list[str]) -> list[bytes | None]:
        """The values of ``fulls`` in order (``None`` where :meth:`get` would give it, and
        for those left out past ``hold`` bytes)."""
        found: dict[str, bytes | None] = {}
        wanted = list(dict.fromkeys(fulls))
        sizes: dict[str, int] = {}
        held = 0
        for start in range(0, len(wanted), CHUNK):
            chunk = wanted[start : start + CHUNK]
            sizes.update(self._first(client, chunk, found, max(0, self.hold - held)))
            held += sum(len(found.get(f) or b"") for f in chunk)
        left, left_bytes = 0, 0
        pending = sorted(sizes.items(), key=lambda item: item[1])  # the most values served
        while pending:
            taken: list[tuple[str, int]] = []
            total = 0
            for full, size in pending:
                if size > self.cap:
                    found[full] = None
                    self._over(full, size)
                elif not size:
                    found[full] = self._empty(client, full)
                elif held + total + size > self.hold and (held or total):
                    found[full] = None  # past what one call may hold
                    left, left_bytes = left + 1, left_bytes + size
                elif taken and (total + size > self.budget or len(taken) >= CHUNK):
                    break
                else:
                    taken.append((full, size))
                    total += size
            read = self._read_sized(client, taken)
            found.update(read)
            held += sum(len(v or b"") for v in read.values())
            pending = [(f, n) for f, n in pending if f not in found]
        if left:
            self._left_out(left, left_bytes)
        return [found.get(f) for f in fulls]

    def _empty(self, client: Any, full: str) -> bytes | None:
        # A value whose size was 0: b"" if it is still there and empty; a miss if it is gone,
        # or holds bytes now (one byte is read, not what it holds).
        there, value = self._exists_and_read(client, full, 0)
        return value if there and value == b"" else None

    def _left_out(self, count: int, size: int) -> None:
        level = logging.DEBUG if self._left_logged else logging.WARNING
        self._left_logged = True
        log.log(
            level,
            "runtime-cache: %s: one get_many left out %d values (%d bytes) past the %d bytes "
            "it may hold (max_batch_size); read as misses",
            self.name,
            count,
            size,
            self.hold,
        )

    # ------------------------------------------------------------------ the parts
    def _first(
        self, client: Any, fulls: list[str], found: dict[str, bytes | None], room: int
    ) -> dict[str, int]:
        # The small values into ``found`` (at most ``room`` bytes of them; and the misses,
        # as None); the others' sizes.
        replies = self._script(client, fulls, room) if self.scripts else None
        if replies is None:
            pipe = client.pipeline(transaction=False)
            for full in fulls:
                pipe.strlen(full)
            replies = [checked(n) for n in pipe.execute(raise_on_error=False)]
        sizes: dict[str, int] = {}
        for full, reply in zip(fulls, replies, strict=True):
            if isinstance(reply, bytes):
                found[full] = reply
            elif isinstance(reply, int) and reply >= 0:
                sizes[full] = reply
            else:
                found[full] = None
        return sizes

    def _script(self, client: Any, fulls: list[str], room: int) -> list[Any] | None:
        import redis

        args = (*fulls, min(SMALL, self.cap), min(room, self.budget))
        try:
            try:
                return list(client.evalsha(_READ_SMALL_SHA, len(fulls), *args))
            except redis.exceptions.NoScriptError:
                return list(client.eval(READ_SMALL, len(fulls), *args))
        except redis.exceptions.ResponseError as exc:
            if not refused(exc):
                raise
            self.scripts = False
            log.info("runtime-cache: %s refuses Lua scripts (%s); sizes by STRLEN", self.name, exc)
            return None

    def _read_sized(self, client: Any, taken: list[tuple[str, int]]) -> dict[str, bytes | None]:
        # Each (non-empty) value up to the size it had: one that grew since is a miss, one
        # that is gone answers b"" and is a miss too.
        pipe = client.pipeline(transaction=False)
        for full, size in taken:
            pipe.getrange(full, 0, size)
        replies = pipe.execute(raise_on_error=False)
        found: dict[str, bytes | None] = {}
        for (full, size), reply in zip(taken, replies, strict=True):
            value = checked(reply)
            found[full] = value if isinstance(value, bytes) and 0 < len(value) <= size else None
        return found

    def _over(self, full: str, size: int, *, more: bool = False) -> None:
        if full not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add(full)
            log.warning(
                "runtime-cache: %s holds %s%d bytes under %r, over the %d-byte cap "
                "(max_entry_size); read as a miss",
                self.name,
                "more than " if more else "",
                size - more,
                full,
                self.cap,
            )


def refuse_over_cap(name: str, cap: int, sizes: dict[str, int]) -> None:
    """Raise :class:`EntryTooLargeError` naming the values of ``sizes`` (key: bytes) over
    ``cap``."""
    over = {key: size for key, size in sizes.items() if size > cap}
    if over:
        shown = [f"{key} ({size} bytes)" for key, size in list(over.items())[:3]]
        raise EntryTooLargeError(
            f"set on {name}: over the {cap}-byte max_entry_size, not stored: "
            + ", ".join(shown)
            + (f" and {len(over) - 3} more" if len(over) > 3 else ""),
            frozenset(over),
        )
