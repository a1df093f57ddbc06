"""What ``redis://`` runs on the server, and how it reads names and replies.

Kept apart from :mod:`.redis` (the backend): the Lua script of a compare-and-delete, a
``GET`` that takes a key of another type for a miss, and the test of which names under a
prefix are this namespace's entries.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DELETE_IF", "get_string", "own_name"]

#: Delete a key while it holds the value whose SHA-1 is ARGV[1]: the digest is sent, not the
#: value (a planted 500 MB value, sent back whole, timed out and opened the breaker). A key
#: of another type is no entry: it goes too.
DELETE_IF = (
    "local t = redis.call('TYPE', KEYS[1])['ok'] "
    "if t == 'none' then return 0 end "
    "if t ~= 'string' or redis.sha1hex(redis.call('GET', KEYS[1])) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0"
)


def own_name(name: str) -> bool:
    """Whether ``name`` (under this backend's prefix) is an entry of this namespace: a name
    whose first ``/`` component holds a ``:`` is a lease (``lease:...``) or belongs to a
    namespace nested in this one (``namespace=team`` must not list, clear or repair
    ``team:ml``'s entries). Cache keys (``runtime/purpose/digest``) never hold one there."""
    return ":" not in name.partition("/")[0]


def get_string(client: Any, name: str) -> bytes | None:
    """``GET``, where a key of another type (a list planted at an entry's name) is a miss,
    not an error: an error would count as an outage, logged and counted on every read."""
    import redis

    try:
        value: bytes | None = client.get(name)
    except redis.ResponseError as exc:
        if str(exc).startswith("WRONGTYPE"):
            return None
        raise
    return value
