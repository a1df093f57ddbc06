"""The Redis server's clock, as one process reckons it: the time signed lease tokens count in.

A signed lease token (:mod:`.lease_tokens`) says when it runs out, and a taker judges it
by comparing that with "now". Both times used to be the local wall clock of the machine
that made or read the token (``time.time()``), so a taker whose clock ran 26-40 s ahead of
a live holder's judged that holder's token run out (past :data:`.lease_tokens.SLACK_MS`)
and swapped it out: two processes built the same key. Machines of a fleet share no clock,
but they share the server that holds the lease, so both times are now the server's:

* a taker that finds a token judges it by the exact time of the server that holds it,
  which the script that reads the token returns (:data:`TIME_MS`, in
  :data:`.redis_lease._HOLDER`);
* a holder stamps its token with :meth:`ServerClock.now_ms`: the server's time, learned
  with :data:`TIME_MS` and carried forward with ``time.monotonic()``, which no one sets.
  The learning is a round trip of its own, paid by the first take that needs it, then
  once every :data:`RELEARN_SECONDS` at most, never at each take; a taker's look brings a
  reading back too, free.

The time a reading returns was taken somewhere between the call's sending and its reply;
it is counted as if taken at the sending, so the estimate runs ahead of the server by at
most one round trip (plus what the two clocks drift apart before the next reading, parts
per million): a holder's token runs out that much later than its ``ttl`` (a replay counts
for :data:`.lease_tokens.SLACK_MS` anyway), not earlier. ``time.monotonic()`` stands still
while the machine sleeps (a suspended laptop, a paused VM), which would leave the estimate
behind: a reading is learned anew when the local wall clock moved more than
:data:`JUMP_SECONDS` apart from it since (slept, or set): a round trip, never a wrong time.

In a Redis Cluster each node has its own clock, and a lease lives on its name's node, so
the readings are kept per node (the reading script is sent with the lease's name, so it
runs where the lease does). A slot moved to another node is read there once the client's
slot table names the new node; a reading redirected before that is kept for the old node
until it is relearned, and nodes whose clocks agree within the slack lose nothing meanwhile.

A ``fork()`` keeps the readings: ``time.monotonic()`` is the machine's, not the process's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["JUMP_SECONDS", "RELEARN_SECONDS", "TIME_MS", "ServerClock", "node_of"]

#: Lua that yields the server's time in milliseconds since the epoch (``TIME`` answers
#: seconds and microseconds, as strings; a double holds today's milliseconds exactly).
#: Read-only: Redis before 5 refused a write after ``TIME`` in a script, never a read.
TIME_MS = "local t = redis.call('time') local now = t[1] * 1000 + math.floor(t[2] / 1000) "
#: The script that only reads the time (sent with a lease's name: it runs on its node).
_READ = TIME_MS + "return now"
#: Seconds a reading is trusted for: a server whose clock was set since is read anew.
RELEARN_SECONDS = 300.0
#: Seconds the local wall clock may move apart from the monotonic one before the readings
#: are learned anew (the machine slept, or its clock was set).
JUMP_SECONDS = 1.0


def node_of(client: Any, name: str | bytes) -> str:
    """Which server holds ``name`` for ``client``: ``"host:port"`` of its node in a Redis
    Cluster, from the client's slot table (no round trip), or ``""`` for a single server."""
    find: Callable[[str | bytes], Any] | None = getattr(client, "get_node_from_key", None)
    if find is None:
        return ""
    try:
        return str(find(name).name)
    except Exception:  # a slot not covered now: the call itself will fail or be redirected
        return "?"


class ServerClock:
    """The server's time in milliseconds since the epoch, learned and carried forward.

    One per backend, shared by its leases (and their renewal threads), so a process
    learns each node's clock once. ``monotonic`` carries a reading forward; ``wall`` only
    tells when the machine slept or its clock was set (a test may pass its own).

    Example::

        clock = ServerClock()
        now = clock.now_ms(client, "rc:lease:some/key")  # a round trip the first time only
    """

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic = monotonic
        self._wall = wall
        #: Per node: the server's milliseconds, the local monotonic second they count from,
        #: and the wall clock's offset from the monotonic one then. No lock: one get or set
        #: of a dict is atomic, one reading of a clock is as good as another, and a fork
        #: finds no lock held.
        self._readings: dict[str, tuple[int, float, float]] = {}

    def sent(self) -> float:
        """The local monotonic second to pass to :meth:`heard` for a call sent now."""
        return self._monotonic()

    def heard(self, node: str, server_ms: int, sent: float) -> None:
        """Keep a reading of ``node``'s clock, ``server_ms``, from a call sent at the
        local monotonic second ``sent`` (:meth:`sent`)."""
        self._readings[node] = self._reading(server_ms, sent)

    def _reading(self, server_ms: int, sent: float) -> tuple[int, float, float]:
        return int(server_ms), sent, self._wall() - self._monotonic()

    def now_ms(self, client: Any, name: str | bytes) -> int:
        """Now on the clock of the server that holds ``name``, in milliseconds since the
        epoch; asks that server (one round trip, through ``client``) when it has no reading
        of its clock, or one older than :data:`RELEARN_SECONDS`, or one from before the
        machine slept. May raise what ``client`` raises."""
        node = node_of(client, name)
        reading = self._readings.get(node)
        if reading is None or self._outdated(reading):
            sent = self._monotonic()
            reading = self._readings[node] = self._reading(client.eval(_READ, 1, name), sent)
        server_ms, at, _ = reading
        return server_ms + int((self._monotonic() - at) * 1000)

    def _outdated(self, reading: tuple[int, float, float]) -> bool:
        _, at, offset = reading
        now = self._monotonic()
        return now - at > RELEARN_SECONDS or abs(self._wall() - now - offset) > JUMP_SECONDS
