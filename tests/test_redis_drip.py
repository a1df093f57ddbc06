"""A server that answers, but not as Redis does: a byte at a time, too much, the wrong type.

redis-py's timeout bounds each read, so a reply dripped a byte every 0.2 s never timed out:
one ``get`` waited for as long as the server liked (over 120 s seen). The server here is a
real TCP listener that speaks just enough of the Redis protocol.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

import runtime_cache as rc
from runtime_cache.errors import BackendUnavailableError

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

pytestmark = pytest.mark.redis


def _command(stream: socket.SocketIO) -> list[bytes] | None:
    """One command (a RESP array of bulk strings) from ``stream``; None at its end."""
    line = stream.readline()
    if not line.startswith(b"*"):
        return None
    args = []
    for _ in range(int(line[1:])):
        length = int(stream.readline()[1:])
        args.append(stream.read(length + 2)[:-2])
    return args


class HostileServer:
    """Accepts connections; answers ``GET``/``GETRANGE`` with ``answer(conn, stopping)``
    (which sends what it likes), the client's hello as Redis would, anything else with OK."""

    def __init__(
        self, answer: Callable[[socket.socket, threading.Event], None], *, every: bool = False
    ) -> None:
        self.answer = answer
        self.every = every  # answer every command but the hello so
        self.scans = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        stream = conn.makefile("rb")
        try:
            while (args := _command(stream)) is not None:
                if args[0].upper() in (b"GET", b"GETRANGE") or (
                    self.every and args[0].upper() != b"HELLO"
                ):
                    self.answer(conn, self.stopping)
                elif args[0].upper() in (b"SCAN", b"EVALSHA"):  # a cursor never back to 0
                    self.scans += 1
                    conn.sendall(b"*2\r\n$1\r\n7\r\n*0\r\n")
                elif args[0].upper() == b"HELLO":  # redis-py 8 speaks RESP3
                    proto = args[1] if len(args) > 1 else b"2"
                    conn.sendall(b"%1\r\n+proto\r\n:" + proto + b"\r\n")
                else:
                    conn.sendall(b"+OK\r\n")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()


def _drip(size: int, gap: float) -> Callable[[socket.socket, threading.Event], None]:
    # A value of ``size`` bytes sent one byte every ``gap`` seconds.
    def answer(conn: socket.socket, stopping: threading.Event) -> None:
        reply = b"$%d\r\n" % size + b"x" * size + b"\r\n"
        for i in range(len(reply)):
            if stopping.is_set():
                return
            conn.sendall(reply[i : i + 1])
            time.sleep(gap)

    return answer


@pytest.fixture
def dripping() -> Iterator[HostileServer]:
    server = HostileServer(_drip(size=100, gap=0.2))
    yield server
    server.close()


def test_a_dripped_reply_is_cut_off_within_about_one_timeout(dripping: HostileServer) -> None:
    backend = rc.open_backend(f"redis://127.0.0.1:{dripping.port}/0?timeout=300ms&insecure=1")
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError, match=r"[Tt]imeout"):
        backend.get("demo/t/k")
    took = time.monotonic() - started
    # The whole reply would take 110 x 0.2 s = 22 s; each read came within the 300 ms.
    assert took < 2.0, took
    # Then the breaker is open: the next call costs nothing.
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        backend.get("demo/t/k")
    assert time.monotonic() - started < 0.1
    backend.close()


def test_through_the_front_a_drip_is_a_miss(dripping: HostileServer) -> None:
    cache = rc.Cache(
        rc.open_backend(f"redis://127.0.0.1:{dripping.port}/0?timeout=300ms&insecure=1"),
        insecure=True,
    )
    key = rc.make_key(module_id="m", runtime="demo", purpose="t")
    started = time.monotonic()
    assert cache.get(key) is None
    assert time.monotonic() - started < 2.0
    assert cache.stats().errors == 1
    cache.close()


def test_what_has_arrived_is_read_after_the_deadline_and_polls_are_left_alone() -> None:
    """A reply already in the socket's buffer is read even when this thread was held up
    past the deadline; a poll (timeout 0, redis-py's check of a pooled connection) reports
    "nothing yet", never a timeout; with nothing there once the deadline has passed, the
    read is a timeout at once."""
    from runtime_cache.backends.redis_deadline import DeadlineSocket

    ours, theirs = socket.socketpair()
    sock = DeadlineSocket(ours, 0.2)
    sock.settimeout(0.2)
    try:
        sock.sendall(b"PING\r\n")
        assert theirs.recv(64) == b"PING\r\n"
        theirs.sendall(b"+PONG\r\n")
        time.sleep(0.4)  # held up elsewhere: the reply came meanwhile
        assert sock.recv(64) == b"+PONG\r\n"
        sock.settimeout(0)
        with pytest.raises(BlockingIOError):
            sock.recv(64)  # a poll, past the deadline: "nothing yet"
        sock.settimeout(0.2)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="deadline"):
            sock.recv(64)
        assert time.monotonic() - started < 0.1
        assert sock.gettimeout() == 0.2
    finally:
        ours.close()
        theirs.close()


def test_a_pooled_connection_the_server_closed_is_replaced_not_an_outage(
    redis_process: RedisProcess,
) -> None:
    """An idle server's timeout, a restart or a NAT cut closes pooled connections. redis-py
    (5-7) checks a pooled connection with a read that may not wait; the deadline once made
    that check say "nothing to read" and a closed connection was handed out: an outage."""
    import redis

    backend = rc.open_backend(f"{redis_process.url}?timeout=300ms&insecure=1")
    backend.set("demo/t/k", b"v")
    assert backend.get("demo/t/k") == b"v"
    time.sleep(0.5)  # past the last reply's deadline
    admin = redis.Redis(port=redis_process.port)
    admin.client_kill_filter(_type="normal", skipme=True)
    admin.close()
    assert backend.get("demo/t/k") == b"v"
    assert backend.breaker.state == "closed"
    backend.close()


def _huge(sent: list[int]) -> Callable[[socket.socket, threading.Event], None]:
    # Announces a 100 GB value and streams it as fast as the client takes it (up to 400 MiB).
    def answer(conn: socket.socket, stopping: threading.Event) -> None:
        conn.sendall(b"$100000000000\r\n")
        chunk = b"A" * (1 << 20)
        while sent[0] < 400 << 20 and not stopping.is_set():
            conn.sendall(chunk)
            sent[0] += len(chunk)

    return answer


def test_a_reply_longer_than_any_asked_for_is_cut_off() -> None:
    """A server announcing a 100 GB value and streaming it fast grew the client's memory
    without end (the attacker review: 300 MiB in 10 s, still reading); a reply may be no
    longer than a value at the cap plus one batch's budget (here 1 + 32 + 1 MiB). That is a
    bad reply, not an outage: the breaker stays closed, and it is not retried."""
    sent = [0]
    started = time.monotonic()
    breaker = _a_get_is_a_counted_error(
        HostileServer(_huge(sent)), "max_entry_size=1MiB&insecure=1"
    )
    assert time.monotonic() - started < 20
    assert sent[0] < 40 << 20, sent  # cut once, not 400 MiB
    assert breaker == "closed"


def _a_get_is_a_counted_error(server: HostileServer, options: str, secret: str = "s") -> str:
    # Through the front: a miss and one error, nothing raised; then the server stops. The
    # breaker's state after it.
    cache = rc.Cache(rc.open_backend(f"{server.url}?{options}"), secret=secret)
    try:
        assert cache.get(rc.make_key(module_id="m", runtime="demo", purpose="t")) is None
        assert cache.stats().errors == 1
        return str(cache.backend.breaker.state)  # type: ignore[attr-defined]
    finally:
        server.close()
        cache.close()


@pytest.mark.parametrize(
    "reply",
    [b"*2147483647\r\n", b"*2\r\n$4\r\n*9\r\n\r\n*2147483647\r\n"],
    ids=["array", "nested"],
)
def test_an_array_header_no_reply_could_hold_is_cut_at_once(reply: bytes) -> None:
    """hiredis makes an array's list at its header: ``*2147483647`` had it take 2**31 slots,
    and freeing them held the GIL for about 4.5 s on every call and breaker probe (the
    attacker review: another thread stalled 4.2 s). A ``$4`` payload that looks like a
    header is skipped, not read as one."""
    gaps: list[float] = []
    done = threading.Event()

    def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    started = time.monotonic()
    server = HostileServer(lambda conn, _: conn.sendall(reply), every=True)
    _a_get_is_a_counted_error(server, "insecure=1")
    gc.collect()  # (the parser's list is freed with the connection, when the cache goes)
    took = time.monotonic() - started
    done.set()
    ticker.join()
    assert took < 2.0 and max(gaps) < 1.0, (took, max(gaps))


def test_a_peek_is_not_counted_as_read() -> None:
    """redis-py peeks at a pooled connection (``recv(1, MSG_PEEK)``) when data waits; the
    peeked byte, followed twice, hid a header (``**2147483647``) or made a payload's line
    look like one (the review of the guard: a pushed ``>2147483647`` took 60 s and 16 GiB)."""
    from runtime_cache.backends.redis_deadline import DeadlineSocket

    for reply, cut in ((b"*2147483647\r\n", True), (b"$14\r\nx\n*9999999\r\n\r\n", False)):
        near, far = socket.socketpair()
        try:
            sock = DeadlineSocket(near, 5.0, 1 << 20)
            far.sendall(reply)
            assert sock.recv(1, socket.MSG_PEEK) == reply[:1]
            if cut:
                with pytest.raises(OSError, match="announcing 2147483647 elements"):
                    sock.recv_into(bytearray(65536))
            else:
                assert sock.recv_into(bytearray(65536), 0, socket.MSG_PEEK) == len(reply)
                assert sock.recv_into(bytearray(65536)) == len(reply)
        finally:
            near.close()
            far.close()


def test_reply_counts_follow_headers_split_across_reads() -> None:
    from runtime_cache.backends.redis_reply_counts import ReplyCounts

    stream = b"*3\r\n$4\r\n*999\r\n$-1\r\n+OK *999999999\r\n*2\r\n:1\r\n:2\r\n" + b"*99"
    for cut in range(1, len(stream)):
        counts = ReplyCounts(1000)
        for piece in (stream[:cut], stream[cut:]):
            counts.feed(bytearray(piece), len(piece))  # every header within the limit
        with pytest.raises(OSError, match="announcing 99999 elements"):
            counts.feed(memoryview(b"999\r\n"), 5)


@pytest.mark.parametrize(
    "reply", [b"*1\r\n$3\r\nabc\r\n", b"%1\r\n$1\r\na\r\n$1\r\nb\r\n"], ids=["array", "map"]
)
def test_a_reply_of_the_wrong_type_is_a_counted_error(reply: bytes) -> None:
    """A GETRANGE answered with an array or a map raised TypeError out of Cache.get."""
    _a_get_is_a_counted_error(HostileServer(lambda conn, _: conn.sendall(reply)), "insecure=1")


def test_a_scan_that_never_ends_is_cut_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose SCAN cursor never came back to 0 made ls, verify, clear, prune and
    TuningCache.symbols endless (the attacker review: still listing after 20 s)."""
    from runtime_cache.backends import redis_listing

    monkeypatch.setattr(redis_listing, "MAX_EMPTY_SCANS", 2000)  # 100,000 by default
    server = HostileServer(lambda conn, _: conn.sendall(b"$-1\r\n"))
    cache = rc.Cache(rc.open_backend(f"{server.url}?insecure=1"), insecure=True)
    started = time.monotonic()
    try:
        assert list(cache.entries()) == []
        assert cache.stats().errors == 1
    finally:
        server.close()
        cache.close()
    assert server.scans == 2000 and time.monotonic() - started < 20


class _SlowLink:
    """A TCP proxy to a local ``port`` carrying at most ``rate`` bytes a second each way, or
    nothing at all once ``stalled`` is set (a link that hangs)."""

    def __init__(self, port: int, rate: int) -> None:
        self.target, self.rate = port, rate
        self.stalled = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                near, _ = self.listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(16 << 10):
                while self.stalled.is_set():
                    time.sleep(0.05)
                sink.sendall(data)
                time.sleep(len(data) / self.rate)
        except OSError:
            pass
        for end in (source, sink):
            end.close()

    def close(self) -> None:
        self.listener.close()


def test_a_large_value_is_stored_over_a_slow_link(
    redis_process: RedisProcess, unique_prefix: str
) -> None:
    """The operator review: Python bounds a whole ``sendall`` by the timeout, so a value
    that took longer than the timeout to upload could never be stored (24 MiB at 50 MB/s
    with 500 ms), and every try opened the breaker; reads of the same size passed."""
    link = _SlowLink(redis_process.port, rate=4 << 20)
    url = f"redis://127.0.0.1:{link.port}/0?timeout=300ms&insecure=1&prefix={unique_prefix}"
    backend = rc.open_backend(url)
    value = bytes(range(256)) * (12 << 10)  # 3 MiB: about 0.4 s over the link, and more
    try:
        backend.set("demo/t/big", value)
        assert backend.get("demo/t/big") == value
        assert backend.breaker.state == "closed"
        # A link that hangs mid-upload still fails within about one timeout.
        link.stalled.set()
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match=r"[Tt]imeout"):
            backend.set("demo/t/big2", value)
        assert time.monotonic() - started < 2.0
    finally:
        link.stalled.clear()
        backend.close()
        link.close()


class _SlowPeer:
    """A loopback TCP connection whose far end takes ``chunk`` bytes every ``pause`` s; the
    near end is a :class:`DeadlineSocket` with ``timeout``."""

    def __init__(
        self, chunk: int, pause: float, timeout: float, *, window: int = 0, room: int = 0
    ) -> None:
        from runtime_cache.backends.redis_deadline import DeadlineSocket

        self.listener = socket.socket()
        if window:  # the far end's receive buffer: a small window
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.client = socket.socket()
        if room:  # the near end's send buffer
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, room)
        self.client.connect(self.listener.getsockname())
        self.server, _ = self.listener.accept()
        self.got = 0
        self.chunk, self.pause = chunk, pause
        threading.Thread(target=self._take, daemon=True).start()
        self.sock = DeadlineSocket(self.client, timeout)
        self.sock.settimeout(timeout)

    def _take(self) -> None:
        try:
            while data := self.server.recv(self.chunk):
                self.got += len(data)
                time.sleep(self.pause)
        except OSError:
            pass

    def close(self) -> None:
        for end in (self.client, self.server, self.listener):
            end.close()


def test_a_peer_that_takes_a_request_slowly_cannot_hold_its_reply_off() -> None:
    """The reply of a request whose end is still on its way may start later, but no later
    than its bytes at the minimum rate allow: a peer taking 8 KiB every 0.25 s (so each
    wait sees progress) must not extend that for as long as it likes."""
    peer = _SlowPeer(1 << 16, 0.25, 0.5, window=8192)
    try:
        peer.sock.sendall(b"x" * (128 << 10))  # 0.5 s at the minimum rate; about 2 s here
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            peer.sock.recv(64)  # no reply ever comes
        # 0.5 + 0.5 s; a clock started again at each sign of progress took 2.5 s.
        assert time.monotonic() - started < 1.8
    finally:
        peer.close()


def test_a_send_to_a_peer_slower_than_the_timeout_allows_goes_on() -> None:
    """The review of the send rule: the kernel says "room" only once half its send buffer is
    free, so a peer taking 512 KiB/s made one wait for room run out (a "timeout") though bytes
    kept leaving; below about 4 MiB/s a large value still could not be stored."""
    peer = _SlowPeer(32 << 10, 0.06, 0.3, room=256 << 10)  # about 512 KiB/s
    try:
        peer.sock.sendall(b"x" * (1 << 20))  # 2 s here; allowed 0.3 + 4 s
        deadline = time.monotonic() + 10
        while peer.got < 1 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert peer.got == 1 << 20
    finally:
        peer.close()
