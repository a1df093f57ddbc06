"""Aggregate counts a reply cannot hold: ``redis://``'s guard against a huge array header.

hiredis makes the list for an array when it reads the array's header, before any element
comes: a server (or anyone on a plaintext link) that answers ``*2147483647\\r\\n`` had it
allocate 2**31 slots, and freeing them when the connection was dropped held the GIL for
about 4.5 s, on every call and every probe of the breaker. :class:`ReplyCounts` follows the
bytes of a connection's replies as they are read, skipping each bulk string's payload by
its length, and refuses an aggregate (array, set, push, map, attribute) that announces more
elements than the reply's length cap could hold: each element takes at least 3 bytes
(``_\\r\\n``). The read then raises ``OSError(EMSGSIZE)`` before the parser sees the header,
which redis-py reports as its ``ConnectionError``.

Following the headers costs about 1 µs each in isolation; through the backend on a 2-core
box, a 64 KiB ``get`` took 1.04-1.06x and a ``get_many`` of 16 values of 10 KB 1.02-1.09x
what it took without (see ``docs/backends/redis.md``).
"""

from __future__ import annotations

import errno
import re
from typing import Any

__all__ = ["ReplyCounts"]

# The least bytes one announced element takes, by the type byte of its header: arrays,
# sets and pushes one element each, maps and attributes two; 0 for the bulk kinds, whose
# header gives the length of the payload that follows.
_PER_ELEMENT = {ord(c): n for c, n in zip("*~>%|$=!", (3, 3, 3, 6, 6, 0, 0, 0), strict=True)}
_HEADER = re.compile(rb"([*~>%|$=!])(-?[0-9]{1,20})\r\n")
#: A header line is at most this long; of a longer line only its start is kept across reads.
_LONGEST = 32


class ReplyCounts:
    """Follows one connection's reply bytes; see the module's text.

    ``limit`` is the most bytes a reply may take.
    """

    __slots__ = ("_limit", "_rest", "_skip")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._skip = 0  # payload bytes (CRLF included) still to come
        self._rest = b""  # the start of a line the last read cut

    def feed(self, data: Any, end: int) -> None:
        """Take the ``end`` bytes just read into ``data``; raise ``OSError(EMSGSIZE)`` at a
        header whose count no reply within the limit could hold."""
        if self._skip >= end:  # all payload (most reads of a large value)
            self._skip -= end
            return
        if not hasattr(data, "find"):  # a memoryview
            data = bytes(memoryview(data)[:end])
        if self._rest:
            data, end = self._rest + bytes(data[:end]), len(self._rest) + end
            self._rest = b""
        pos = min(self._skip, end)
        self._skip -= pos
        match, find = _HEADER.match, data.find
        while pos < end:
            found = match(data, pos, end)
            if found is None:  # another kind of line, or a header cut by the read
                newline = find(b"\n", pos, end)
                if newline < 0:
                    self._rest = bytes(data[pos : min(end, pos + _LONGEST)])
                    return
                pos = newline + 1
                continue
            count, per = int(found.group(2)), _PER_ELEMENT[data[pos]]
            pos = found.end()
            if per == 0:
                if count >= 0:  # (-1: a null, with no payload)
                    self._skip = count + 2
                    taken = min(self._skip, end - pos)
                    pos += taken
                    self._skip -= taken
            elif count * per > self._limit:
                raise OSError(
                    errno.EMSGSIZE,
                    f"a reply announcing {count} elements, more than {self._limit} bytes hold",
                )
