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
is cut and :class:`ReplyTooLongError` raised: no ``OSError``, so redis-py neither retries
it nor reports it as its ``ConnectionError``, and the backend counts it as a bad reply
(a ``BackendError``), not an outage: a server that holds planted names of 100 MiB is up.
A connection is cut too at an array header announcing more elements than that length
could hold (:mod:`.redis_reply_counts`: ``OSError(EMSGSIZE)``, no Redis sends one).

A request is sent the same way: each wait for room within ``timeout``, the whole request
within ``timeout`` plus its bytes at :data:`MIN_RATE` (Python's own ``sendall`` bounds all
of it by ``timeout``, so a large value could not be stored over a slow link).
"""

from __future__ import annotations

import functools
import socket
import ssl
import sys
import time
from typing import Any

from .redis_reply_counts import ReplyCounts

try:  # the bytes a TCP socket has sent that its peer has not acknowledged (Linux)
    import fcntl
    import termios

    _OUTQ: int | None = termios.TIOCOUTQ
except (ImportError, AttributeError):  # pragma: no cover (not Linux)
    _OUTQ = None

__all__ = ["MIN_RATE", "DeadlineSocket", "ReplyTooLongError", "connection_classes"]

#: What a read that may not wait raises when nothing has come (TLS has its own).
_NOTHING_YET = (BlockingIOError, ssl.SSLWantReadError)
#: Bytes per second a reply must average after its first ``timeout``.
MIN_RATE = 256 << 10
#: A request of fewer bytes is taken to have arrived when sent (its allowance is small).
_ASK_QUEUE_FROM = MIN_RATE // 16
#: The most bytes one ``send`` is given: TLS bounds a whole write by one timeout.
_SLICE = 64 << 10


class ReplyTooLongError(Exception):
    """A reply longer than the connection's cap: cut off (the connection is closed)."""


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
        self._counts = ReplyCounts(max_reply) if max_reply is not None else None
        self._base = timeout
        self._timeout: float | None = sock.gettimeout()
        self._start = time.monotonic()
        self._got = 0
        #: Bytes of the request still on their way when its sending ended, and when last asked.
        self._queued = 0
        self._unacked = 0
        #: When this request's sending began (None: its reply was read from), and its bytes.
        self._sending: float | None = None
        self._sent = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    # ---------------------------------------------------------------- the guard
    def _begin(self, queued: int = 0) -> None:
        self._start = time.monotonic()
        self._got = 0
        self._queued = self._unacked = queued

    def _unacked_now(self) -> int | None:
        # The bytes sent that the peer has not acknowledged yet; None where that cannot be
        # told (not Linux).
        if _OUTQ is None:
            return None
        try:
            answer = fcntl.ioctl(self._sock.fileno(), _OUTQ, b"\0\0\0\0")
        except (OSError, ValueError):
            return None
        return max(0, int.from_bytes(answer, sys.byteorder, signed=True))

    def _on_its_way(self) -> int:
        # Of the request's bytes, those the server has not yet acknowledged: the reply cannot
        # start before they arrive (a large value over a slow link). 0 where that cannot be
        # told.
        if self._sent < _ASK_QUEUE_FROM:
            return 0
        return min(self._sent, self._unacked_now() or 0)

    def _draining(self) -> bool:
        # Whether the request's bytes on their way went down since last asked: a link that
        # is slow, not one that stopped (a read waits ``timeout`` at most for either).
        # The deadline stays where the request's end set it (its bytes at MIN_RATE): a
        # peer that acknowledged a byte at a time would else hold the reply off for good.
        if not self._unacked or self._got:
            return False
        left = self._on_its_way()
        if left >= self._unacked:
            return False
        self._unacked = left
        return True

    def _arm(self) -> bool:
        # Set the socket's timeout for the next read: what the caller set, but no later
        # than the reply's deadline. ``True`` once the deadline has passed: the read then
        # takes what is already there and waits for nothing (a reply that arrived while
        # this thread was held up elsewhere is still read). A poll (timeout 0, redis-py's
        # check of a pooled connection) is left as it is.
        if self._base is None or self._timeout == 0:
            return False
        left = self._start + self._base + (self._got + self._queued) / MIN_RATE - time.monotonic()
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
        self._sending = None
        while True:
            late = self._arm()
            try:
                return call(*args)
            except _NOTHING_YET as exc:
                if late:
                    raise self._late() from exc
                raise
            except TimeoutError:
                if late or not self._draining():
                    raise

    def _count(self, size: int) -> None:
        self._got += size
        if self._max_reply is not None and self._got > self._max_reply:
            self._sock.close()  # the rest of this reply is never read
            raise ReplyTooLongError(f"a reply longer than {self._max_reply} bytes: cut off")

    def _watch(self, data: Any, size: int) -> None:
        try:
            self._counts.feed(data, size)  # type: ignore[union-attr]
        except OSError:
            self._sock.close()  # the rest of this reply is never read
            raise

    def recv(self, size: int, *flags: int) -> bytes:
        """``socket.recv`` within the reply's deadline and length (a peek, redis-py's look
        at a pooled connection, is read again later: not counted)."""
        data: bytes = self._read(self._sock.recv, size, *flags)
        if flags and flags[0] & socket.MSG_PEEK:
            return data
        self._count(len(data))
        if self._counts is not None:
            self._watch(data, len(data))
        return data

    def recv_into(self, buffer: Any, *args: int) -> int:
        """``socket.recv_into`` within the reply's deadline and length (a peek: not counted)."""
        count: int = self._read(self._sock.recv_into, buffer, *args)
        if len(args) > 1 and args[1] & socket.MSG_PEEK:
            return count
        self._count(count)
        if self._counts is not None:
            self._watch(buffer, count)
        return count

    def sendall(self, data: Any, *flags: int) -> None:
        """``socket.sendall`` within the request's deadline; its reply starts its clock here.

        Python bounds a whole ``sendall`` by the timeout, so a value that took longer
        to upload than ``timeout`` (24 MiB at 50 MB/s, with 500 ms) could never be
        stored, and each try counted as an outage. A request now sends as its reply
        reads: each wait for room is bounded by the timeout, and the request (all its
        ``sendall`` calls until a read) by ``timeout`` plus one second per
        :data:`MIN_RATE` bytes.
        """
        if self._base is None or not self._timeout:  # no timeout, or a poll's
            self._sock.settimeout(self._timeout)
            self._sock.sendall(data, *flags)
            self._begin()
            return
        view = memoryview(data).cast("B")
        if self._sending is None:
            self._sending, self._sent = time.monotonic(), 0
        self._sent += len(view)
        deadline = self._sending + self._base + self._sent / MIN_RATE
        done = 0
        large = len(view) >= _ASK_QUEUE_FROM
        try:
            while done < len(view):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the request fell behind its deadline")
                self._sock.settimeout(min(left, self._timeout))
                before = self._unacked_now() if large else None
                try:
                    done += self._sock.send(view[done : done + _SLICE], *flags)
                except TimeoutError:
                    # The kernel says "room" only once half its buffer (up to megabytes) is
                    # free, and TLS bounds a whole write by one timeout: a wait that ran out
                    # while bytes kept leaving this host is a slow link, not a stopped one.
                    after = None if before is None else self._unacked_now()
                    if after is None or before is None or after >= before:
                        raise
        finally:
            self._sock.settimeout(self._timeout)
        self._begin(self._on_its_way())

    def send(self, data: Any, *flags: int) -> int:
        """``socket.send``; a new request's reply starts its clock here."""
        self._sock.settimeout(self._timeout)
        sent: int = self._sock.send(data, *flags)
        self._begin()
        return sent


@functools.cache
def connection_classes(
    redis: Any, max_reply: int | None = None
) -> tuple[type[Any], type[Any], type[Any]]:
    """redis-py's plain, TLS and Unix-socket connection classes, each with its socket behind
    a :class:`DeadlineSocket` whose replies may be ``max_reply`` bytes long (made once per
    process and length)."""

    class _Deadline:
        socket_timeout: float | None

        def _connect(self) -> Any:
            sock = super()._connect()  # type: ignore[misc]
            return DeadlineSocket(sock, self.socket_timeout, max_reply)

    plain = type("DeadlineConnection", (_Deadline, redis.connection.Connection), {})
    tls = type("DeadlineSSLConnection", (_Deadline, redis.connection.SSLConnection), {})
    unix = type(
        "DeadlineUnixConnection", (_Deadline, redis.connection.UnixDomainSocketConnection), {}
    )
    return plain, tls, unix
