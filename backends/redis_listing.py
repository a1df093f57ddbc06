"""How ``redis://`` lists its entries: names by ``SCAN``, sizes by ``STRLEN``.

Redis allows names of up to 512 MB. Anyone who can write to the server could plant names
of 100 MiB under the prefix: a plain ``SCAN`` sent them whole (a reply over the
connection's length cap, or hundreds of MiB a listing just under it). Here a Lua script
(:data:`SCAN_SHORT`) runs ``SCAN`` on the server and sends back only names of at most
:func:`longest_name` bytes, the longest a key of this backend may have
(:data:`MAX_KEY` characters, after the prefix). The script stops after a few MiB of names
seen, long ones included, so each of its replies comes soon after the request (a
planted name costs the server about 0.3 s per 100 MiB to pass over). On a cluster it runs
on each primary. Where scripts are refused (an ACL without ``EVAL``), the names come by a
plain ``SCAN``, as before, and a name too long for a key is left out on arrival.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import Any

from runtime_cache.api import MAX_TEXT_KEY, StoredItem

from .redis_scripts import checked, refused

__all__ = [
    "MAX_EMPTY_SCANS",
    "MAX_KEY",
    "SCAN_SHORT",
    "Listing",
    "listed_sizes",
    "longest_name",
    "own_name",
]

log = logging.getLogger(__name__)

#: The longest key ``redis://`` takes, in characters (:func:`~runtime_cache.api.check_text_key`).
MAX_KEY = MAX_TEXT_KEY
#: Names per script reply, at most; and the bytes of names (long ones included) the
#: script passes over before it answers.
_NAMES = 1000
_SEEN = 8 << 20
#: SCAN steps one script call takes at most (each visits about 10 slots of the table).
_STEPS = 10_000
#: One SCAN step at a time (``COUNT 1``: about one name), so a call stops soon after the
#: bytes it passed over reach ARGV[4]; a name of more than ARGV[3] bytes is never sent, and
#: TYPE is asked only of the others. Returns the next cursor and the names kept.
SCAN_SHORT = (
    "local cursor, match, most, budget = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]) "
    "local names, seen, steps = {}, 0, 0 "
    "repeat local r = redis.call('SCAN', cursor, 'MATCH', match, 'COUNT', 1) "
    "cursor, steps = r[1], steps + 1 "
    "for _, name in ipairs(r[2]) do seen = seen + #name "
    "if #name <= most and redis.call('TYPE', name)['ok'] == 'string' then "
    "names[#names + 1] = name end end "
    f"until cursor == '0' or #names >= {_NAMES} or seen >= budget or steps >= {_STEPS} "
    "return {cursor, names}"
)
_SCAN_SHORT_SHA = hashlib.sha1(SCAN_SHORT.encode()).hexdigest()
#: Commands per pipeline round trip in listings.
_BATCH = 500
#: SCAN replies in a row with no name in them after which a listing gives up: a server whose
#: cursor never comes back to 0 (no Redis) made every listing endless. A real one's table
#: shrinks below 10 empty slots a key, so this is about 100 million empty slots.
MAX_EMPTY_SCANS = 100_000
_GLOB = str.maketrans({c: "\\" + c for c in "*?[]\\"})


def longest_name(prefix: str) -> int:
    """The most bytes a name of an entry under ``prefix`` takes (:data:`MAX_KEY` characters
    of UTF-8 after it)."""
    return len(prefix.encode()) + 4 * MAX_KEY


def own_name(name: str) -> bool:
    """Whether ``name`` (under this backend's prefix) is an entry of this namespace: a name
    whose first ``/`` component holds a ``:`` is a lease (``lease:...``) or belongs to a
    namespace nested in this one (``namespace=team`` must not list, clear or repair
    ``team:ml``'s entries). Cache keys (``runtime/purpose/digest``) never hold one there."""
    return ":" not in name.partition("/")[0]


def listed_sizes(client: Any, prefix: str, keys: list[str]) -> list[StoredItem]:
    """The sizes of ``keys`` (names under ``prefix``) by pipelined ``STRLEN``: no value is
    sent. A key that changed type since it was listed answers WRONGTYPE: left out, not
    fatal (any other error reply, an ACL's refusal, is raised); an empty answer is an empty
    value only where the key exists."""
    items: list[StoredItem] = []
    for start in range(0, len(keys), _BATCH):
        chunk = keys[start : start + _BATCH]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.strlen(prefix + key)
        replies = [checked(n) for n in pipe.execute(raise_on_error=False)]
        kept = [(k, n) for k, n in zip(chunk, replies, strict=True) if isinstance(n, int)]
        present = {k for k, n in kept if not n and client.exists(prefix + k)}
        items += [StoredItem(k, int(n)) for k, n in kept if n or k in present]
    return items


class Listing:
    """The entries of one backend (``prefix``; ``cluster``: each primary in turn)."""

    def __init__(self, prefix: str, name: str, cluster: bool) -> None:
        self.prefix, self.name, self.cluster = prefix, name, cluster
        self.longest = longest_name(prefix)
        self.scripts = True  # until the server refuses them

    def keys(self, client: Any, prefix: str = "") -> list[str]:
        """This namespace's keys under ``prefix``, once each (see :func:`own_name`)."""
        match = (self.prefix + prefix).translate(_GLOB) + "*"
        found = (self._strip(k) for k in self.names(client, match))
        own = (k for k in found if k is not None and k.startswith(prefix) and own_name(k))
        return list(dict.fromkeys(own))

    def sizes(self, client: Any, prefix: str = "") -> list[StoredItem]:
        """The keys under ``prefix`` with their sizes; no value is sent."""
        return listed_sizes(client, self.prefix, self.keys(client, prefix))

    def _strip(self, raw: bytes) -> str | None:
        # The name under this prefix, or None (not ours, or no key's length: the prefix
        # alone, or more characters than a key has, which no command could remove, so
        # `verify` and `ls` said "skipped" for good).
        if len(raw) > self.longest:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None  # not written by us
        name = text[len(self.prefix) :]
        return name if text.startswith(self.prefix) and 0 < len(name) <= MAX_KEY else None

    def names(self, client: Any, match: str) -> Iterator[bytes]:
        """The names of strings matching ``match`` of at most :attr:`longest` bytes (by
        :data:`SCAN_SHORT`, or plain ``SCAN`` where scripts are refused), until each
        cursor is 0 again; ``RuntimeError`` after :data:`MAX_EMPTY_SCANS` empty replies in
        a row."""
        nodes = client.get_primaries() if self.cluster else [None]
        for node in nodes:
            cursor, empty = 0, 0
            while True:
                cursor, names = self._step(client, node, cursor, match)
                yield from names
                if cursor == 0:
                    break
                empty = 0 if names else empty + 1
                if empty >= MAX_EMPTY_SCANS:
                    raise RuntimeError(f"SCAN gave {empty} empty replies in a row, and no end")

    def _step(self, client: Any, node: Any, cursor: int, match: str) -> tuple[int, list[bytes]]:
        import redis

        where = {} if node is None else {"target_nodes": node}
        if self.scripts:
            args = (0, cursor, match, self.longest, _SEEN)
            try:
                try:
                    reply = client.execute_command("EVALSHA", _SCAN_SHORT_SHA, *args, **where)
                except redis.exceptions.NoScriptError:
                    reply = client.execute_command("EVAL", SCAN_SHORT, *args, **where)
            except redis.exceptions.ResponseError as exc:
                if not refused(exc):
                    raise
                self.scripts = False
                log.info(
                    "runtime-cache: %s refuses Lua scripts (%s); names by SCAN", self.name, exc
                )
            else:
                return _pair(reply)
        return _pair(
            client.execute_command(
                "SCAN", cursor, "MATCH", match, "COUNT", 1000, "TYPE", "string", **where
            )
        )


def _pair(reply: Any) -> tuple[int, list[bytes]]:
    # A SCAN reply (cursor, names), as a server may send it; anything else is raised.
    if not (isinstance(reply, list | tuple) and len(reply) == 2 and isinstance(reply[1], list)):
        raise TypeError(f"SCAN answered {type(reply).__name__}, not a cursor and names")
    cursor = reply[0]
    if isinstance(cursor, dict) and len(cursor) == 1:  # redis-py's cluster client: {node: cursor}
        cursor = next(iter(cursor.values()))
    return int(cursor), [n for n in reply[1] if isinstance(n, bytes)]
