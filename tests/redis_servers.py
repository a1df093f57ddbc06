"""Real Redis servers for tests and benchmarks: one standalone server, or a 3-node cluster.

Servers run from ``redis-server`` on PATH, on free loopback ports, with no
persistence (``--save '' --appendonly no``), in a temporary folder that is
removed afterwards. Test modules load the fixtures with::

    pytest_plugins = ["redis_servers"]

A test that needs a server skips when ``redis-server`` (or ``redis-cli`` for
the cluster) is missing, and fails instead when RUNTIME_CACHE_REQUIRE_REDIS=1.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REQUIRE_ENV = "RUNTIME_CACHE_REQUIRE_REDIS"


def free_port() -> int:
    """A loopback port that is free now, and whose cluster bus port (+10000) is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port found")


def _ping(port: int, unix: Path | None = None) -> bool:
    try:
        if unix is None:
            s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        else:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(0.2)
            s.connect(str(unix))
        with s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """One ``redis-server`` on loopback that a test can kill, pause and restart on the same port;
    with ``unix``, one that listens on a Unix socket in its folder only (no TCP port)."""

    def __init__(
        self, folder: Path, *, port: int | None = None, cluster: bool = False, unix: bool = False
    ) -> None:
        self.folder = folder
        self.port = 0 if unix else port or free_port()
        self.cluster = cluster
        self.unix = folder / "redis.sock" if unix else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``, or ``redis+unix://<socket>`` (database 0)."""
        if self.unix is not None:
            return f"redis+unix://{self.unix}"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        self.folder.mkdir(parents=True, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(self.folder)]
        args += ["--protected-mode", "no", "--logfile", str(self.folder / "redis.log")]
        if self.unix is not None:
            args += ["--unixsocket", str(self.unix), "--unixsocketperm", "700"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"]
            args += ["--cluster-config-file", str(self.folder / "nodes.conf")]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not _ping(self.port, self.unix):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.folder / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server ({self.url}) did not start:\n{log}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP the server: it accepts connections but never answers (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server (resuming it first if paused)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


class RedisCluster:
    """Three cluster-enabled ``redis-server`` nodes joined with ``redis-cli --cluster create``."""

    def __init__(self, folder: Path, size: int = 3) -> None:
        self.nodes = [RedisProcess(folder / f"node{i}", cluster=True) for i in range(size)]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<first port>``."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the nodes, create the cluster, and wait until every node reports ``ok``."""
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=timeout,
        )
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while b"cluster_state:ok" not in self._cli(node.port, "cluster", "info"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the Redis cluster did not become ready")
                time.sleep(0.05)

    @staticmethod
    def _cli(port: int, *args: str) -> bytes:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args], capture_output=True, timeout=10
        ).stdout

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()


def _have(*programs: str) -> str | None:
    missing = [p for p in programs if shutil.which(p) is None]
    return ", ".join(missing) or None


def require_redis(*programs: str) -> None:
    """Skip (or fail under RUNTIME_CACHE_REQUIRE_REDIS=1) when a program is not on PATH."""
    from conftest import need

    missing = _have(*programs)
    if missing:
        need("Redis", REQUIRE_ENV, f"{missing} not found on PATH")
    try:
        import redis  # noqa: F401
    except ImportError:
        need("Redis", REQUIRE_ENV, "redis-py is not installed (pip install '.[redis]')")


@contextlib.contextmanager
def running_server(folder: Path | None = None, *, unix: bool = False) -> Iterator[RedisProcess]:
    """A started standalone server, stopped and removed on exit (also used by benchmarks);
    with ``unix``, one reached by a Unix socket only."""
    with tempfile.TemporaryDirectory(prefix="rc-redis-") as tmp:
        server = RedisProcess(Path(folder or tmp), unix=unix)
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """One standalone server shared by the session; tests isolate themselves by key prefix."""
    require_redis("redis-server")
    with running_server() as server:
        yield server


@pytest.fixture
def redis_process() -> Iterator[RedisProcess]:
    """A private server for one test, which the test may kill, pause and restart."""
    require_redis("redis-server")
    with running_server() as server:
        yield server


@pytest.fixture(scope="session")
def redis_unix_server() -> Iterator[RedisProcess]:
    """One standalone server reached by a Unix socket only, shared by the session."""
    require_redis("redis-server")
    with running_server(unix=True) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-node Redis Cluster (no replicas) shared by the session."""
    require_redis("redis-server", "redis-cli")
    with tempfile.TemporaryDirectory(prefix="rc-cluster-") as tmp:
        cluster = RedisCluster(Path(tmp))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture
def unique_prefix() -> str:
    """A key prefix no other test uses, so tests can share one server."""
    return f"t{uuid.uuid4().hex[:12]}:"
