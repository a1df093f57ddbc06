"""A reply that must keep coming: ``redis://``'s guard against a server that drips.

redis-py's ``socket_timeout`` bounds each ``recv``, not a reply: a server (or a link) that
sends a byte every 0.4 s kept one ``get`` waiting for over two minutes with a 500 ms
timeout. Here every connection's socket sits behind :class:`DeadlineSocket`, which gives a
reply ``timeout`` for its first bytes and then as long as its bytes take at
:data:`MIN_RATE` more. A reply that falls behind that raises ``socket.timeout``, which
redis-py reports as its ``TimeoutError`` (and the backend counts as an outage). A reply of
64 MiB may so take four minutes on a slow link; a drip is cut off within about one timeout.

A reply may also be no longer than the largest one the backend asks for (its value cap,
plus one batch's budget): a server that announces a 100 GB value and streams it fast grew
the client's memory without end (300 MiB in 10 s seen). Past that length the connection
is cut (``OSError(EMSGSIZE)``, which redis-py reports as its ``ConnectionError``).
"""

from __future__ import annotations

import errno
import functools
import ssl
import time
from typing import Any

__all__ = ["MIN_RATE", "DeadlineSocket", "connection_classes"]

#: What a read that may not wait raises when nothing has come (TLS has its own).
_NOTHING_YET = (BlockingIOError, ssl.SSLWantReadError)
#: Bytes per second a reply must average after its first ``timeout``.
MIN_RATE = 256 << 10


class DeadlineSocket:
    """A socket whose reads share one deadline per request (see the module's text).

    A request starts at each send; its reply may take ``timeout`` plus one second per
    :data:`MIN_RATE` bytes read so far. What has already arrived is always read: a
    deadline that passed while this thread was held up elsewhere (another thread holding
    the GIL) only stops the waiting. A poll (timeout 0: redis-py's check of a pooled
    connection) is never cut short. Everything but reading and sending passes through to
    the socket.
    """

    def __init__(self, sock: Any, timeout: float | None, max_reply: int | None = None) -> None:
        self._sock = sock
        self._max_reply = max_reply
        self._base = timeout
        self._timeout: float | None = sock.gettimeout()
        self._start = time.monotonic()
        self._got = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    # ---------------------------------------------------------------- the guard
    def _begin(self) -> None:
        self._start = time.monotonic()
        self._got = 0

    def _arm(self) -> bool:
        # Set the socket's timeout for the next read: what the caller set, but no later
        # than the reply's deadline. ``True`` once the deadline has passed: the read then
        # takes what is already there and waits for nothing (a reply that arrived while
        # this thread was held up elsewhere is still read). A poll (timeout 0, redis-py's
        # check of a pooled connection) is left as it is.
        if self._base is None or self._timeout == 0:
            return False
        left = self._start + self._base + self._got / MIN_RATE - time.monotonic()
        if left <= 0:
            self._sock.settimeout(0)
            return True
        self._sock.settimeout(left if self._timeout is None else min(left, self._timeout))
        return False

    def _late(self) -> TimeoutError:
        self._sock.settimeout(self._timeout)
        return TimeoutError("the reply fell behind its deadline")

    # ---------------------------------------------------------------- the calls
    def settimeout(self, value: float | None) -> None:
        """Set the timeout of one read (still capped by the reply's deadline)."""
        self._timeout = value
        self._sock.settimeout(value)

    def gettimeout(self) -> float | None:
        """The timeout last set (not the deadline's cap)."""
        return self._timeout

    def _read(self, call: Any, *args: Any) -> Any:
        late = self._arm()
        try:
            return call(*args)
        except _NOTHING_YET as exc:
            if late:
                raise self._late() from exc
            raise

    def _count(self, size: int) -> None:
        self._got += size
        if self._max_reply is not None and self._got > self._max_reply:
            self._sock.close()  # the rest of this reply is never read
            raise OSError(errno.EMSGSIZE, f"a reply longer than {self._max_reply} bytes")

    def recv(self, size: int, *flags: int) -> bytes:
        """``socket.recv`` within the reply's deadline and length."""
        data: bytes = self._read(self._sock.recv, size, *flags)
        self._count(len(data))
        return data

    def recv_into(self, buffer: Any, *args: int) -> int:
        """``socket.recv_into`` within the reply's deadline and length."""
        count: int = self._read(self._sock.recv_into, buffer, *args)
        self._count(count)
        return count

    def sendall(self, data: Any, *flags: int) -> None:
        """``socket.sendall``; a new request's reply starts its clock here."""
        self._sock.settimeout(self._timeout)
        self._sock.sendall(data, *flags)
        self._begin()

    def send(self, data: Any, *flags: int) -> int:
        """``socket.send``; a new request's reply starts its clock here."""
        self._sock.settimeout(self._timeout)
        sent: int = self._sock.send(data, *flags)
        self._begin()
        return sent


@functools.cache
def connection_classes(redis: Any, max_reply: int | None = None) -> tuple[type[Any], type[Any]]:
    """redis-py's plain and TLS connection classes, each with its socket behind a
    :class:`DeadlineSocket` whose replies may be ``max_reply`` bytes long (made once per
    process and length)."""

    class _Deadline:
        socket_timeout: float | None

        def _connect(self) -> Any:
            sock = super()._connect()  # type: ignore[misc]
            return DeadlineSocket(sock, self.socket_timeout, max_reply)

    plain = type("DeadlineConnection", (_Deadline, redis.connection.Connection), {})
    tls = type("DeadlineSSLConnection", (_Deadline, redis.connection.SSLConnection), {})
    return plain, tls
