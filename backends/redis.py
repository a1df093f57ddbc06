"""``redis://``, ``rediss://``, ``redis+cluster://``, ``redis+unix://``: a fleet's shared cache.

One machine compiles a program and stores it; every other machine loads it. Values are
plain Redis strings under ``<prefix><key>``; the entry format (and its signature) is the
front's business.

URLs::

    redis://[[user]:password@]host[:port][/db][?options]
    rediss://...                       (TLS)
    redis+cluster://host:port[?options] (Redis Cluster; one seed node, the rest is discovered)
    redis+unix://[[user]:password@]/path/to/redis.sock[?db=N&options] (a Unix socket)

Options: ``prefix`` (default ``rc:``) or ``namespace`` (``namespace=team`` means prefix
``team:``), ``ttl`` (``30d``, ``12h``; default none), ``connect_timeout`` (default
``200ms``), ``timeout`` (per operation, default ``500ms``), ``max_connections`` (per pool,
default 64), ``max_entry_size`` (the largest value read or written, default ``64MiB``: a
larger one is never sent, see :class:`~.redis_scripts.CappedReads`), ``max_batch_size``
(the most bytes of values one ``get_many`` holds, default four times ``max_entry_size``;
the values past it are misses), ``backoff`` and ``max_backoff`` (the circuit breaker's
first and longest window, default ``500ms`` and ``30s``), and for ``rediss://``
``ssl_ca_certs`` and ``ssl_cert_reqs``. Unknown options are rejected.

Keys are at most 1024 characters (:data:`~runtime_cache.api.MAX_TEXT_KEY`); listings
never receive a longer name (:mod:`.redis_listing`).

Failures become :class:`~runtime_cache.errors.BackendUnavailableError` (server down,
timeout; these open the circuit breaker) or :class:`~runtime_cache.errors.BackendError`
(the server answered with an error, or a reply longer than any asked for: these do not).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from runtime_cache.api import Backend, Lease, StoredItem, check_text_key
from runtime_cache.errors import (
    BackendError,
    BackendUnavailableError,
    InvalidURLError,
    ReadOnlyBackendError,
)
from runtime_cache.fork_locks import renew_in_child
from runtime_cache.urls import BackendURL, redact_url

from .breaker import CircuitBreaker
from .redis_clock import ServerClock
from .redis_deadline import connection_classes
from .redis_listing import Listing
from .redis_scripts import DELETE_IF, DELETE_IF_UNCHANGED, CappedReads, refuse_over_cap
from .redis_url import check_database, import_redis, unix_address, url_options

__all__ = ["RedisBackend"]

T = TypeVar("T")
_SCHEMES = ("redis", "rediss", "redis+cluster", "redis+unix")
#: Which of :func:`~.redis_deadline.connection_classes` a scheme connects with.
_TRANSPORT = {"rediss": 1, "redis+unix": 2}
#: The largest value read or written by default, and the most one reply of ``get_many``
#: brings (more comes in further round trips).
MAX_ENTRY_SIZE = 64 << 20
_REPLY_BUDGET = 32 << 20
#: A server's answer to the connection's SELECT of a database it does not have (Redis,
#: Valkey; a cluster takes only database 0).
_REFUSED_DB = re.compile(r"DB index is out of range|invalid DB index|SELECT is not allowed")


class RedisBackend(Backend):
    """Values in Redis (standalone or cluster), pooled, with timeouts and a circuit breaker.

    Args:
        url: the server, e.g. ``"redis://cache.internal:6379/0"`` or
            ``"redis+unix:///run/redis/redis.sock?db=0"``; query options (but a Unix
            socket's ``db``) are read by :meth:`from_url`, not here.
        prefix: prepended to every key, so several apps can share a database; it ends
            with ``:`` (``InvalidURLError`` otherwise), so no other app's starts with it.
        ttl: seconds each stored value lives (``None``: until evicted).
        connect_timeout: seconds to wait for a connection.
        timeout: seconds to wait for any one reply.
        max_connections: size limit of the connection pool (per node in a cluster).
        max_entry_size: the largest value read or written, in bytes; a larger one is
            a miss on reads (never sent over the wire) and refused on writes.
        max_batch_size: the most bytes of values one ``get_many`` holds (``None``: four
            times ``max_entry_size``); the values past it (the largest) are misses.
        backoff: the circuit breaker's first window after a failure.
        max_backoff: the longest window the breaker grows to.
        ssl_options: extra ``ssl_*`` arguments for redis-py (``rediss://``).

    Example::

        backend = RedisBackend.from_url("redis://cache.internal:6379/0?ttl=30d&namespace=ml")
        rc.set_cache_provider(backend)
    """

    scheme = "redis"
    remote: ClassVar[bool] = True
    shared = True
    exact_sizes = True  # (STRLEN: its blobs' own sizes)

    def __init__(
        self,
        url: str = "redis://localhost:6379/0",
        *,
        prefix: str = "rc:",
        ttl: float | None = None,
        connect_timeout: float = 0.2,
        timeout: float = 0.5,
        max_connections: int = 64,
        max_entry_size: int = MAX_ENTRY_SIZE,
        max_batch_size: int | None = None,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        ssl_options: Mapping[str, str] | None = None,
    ) -> None:
        self._redis = import_redis()
        parsed = BackendURL.parse(url)
        if parsed.scheme not in _SCHEMES:
            raise InvalidURLError(
                f"not a Redis URL: {redact_url(url)} (redis://, rediss://, redis+cluster://, "
                "redis+unix://)"
            )
        self.cluster = parsed.scheme == "redis+cluster"
        if parsed.scheme == "redis+unix":
            self._server_url, self.name = unix_address(parsed)
        else:
            check_database(url, parsed.path, self.cluster)
            netloc = parsed.netloc or "localhost:6379"
            server_scheme = "redis" if self.cluster else parsed.scheme
            self._server_url = f"{server_scheme}://{netloc}{parsed.path}"
            host = netloc.rpartition("@")[2]  # never log a password
            self.name = f"{parsed.scheme}://{host}{parsed.path}"
        if ttl is not None and ttl <= 0:
            ttl = None
        if min(connect_timeout, timeout, max_connections, max_entry_size) <= 0 or (
            max_batch_size is not None and max_batch_size < 1
        ):
            raise InvalidURLError("timeouts, connections and sizes must be positive")
        if not prefix.endswith(":") or "/" in prefix:
            # Else another application's prefix may start with this one (``app`` and
            # ``app2``): a listing matches ``<prefix>*``, and clear or verify --repair would
            # remove that application's keys too.
            raise InvalidURLError(
                f"prefix {prefix!r} must end with ':' and hold no '/' (e.g. prefix=app: or "
                "namespace=app), so that no other prefix starts with it"
            )
        if prefix == "lease:" or prefix.endswith(":lease:"):  # the parent's leases live there
            raise InvalidURLError(f"prefix {prefix!r}: no namespace may be named 'lease'")
        self.prefix = prefix
        self.ttl = ttl
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.max_connections = max_connections
        self._ssl_options = dict(ssl_options or {})
        self._transport = _TRANSPORT.get(parsed.scheme, 0)
        # No reply is longer than a value at the cap plus a batch's budget (see .redis_deadline).
        max_reply = max_entry_size + _REPLY_BUDGET + (1 << 20)
        self._connection_classes = connection_classes(self._redis, max_reply)
        self._has_password = bool(parsed.netloc.rpartition("@")[0].partition(":")[2])
        self.breaker = CircuitBreaker(self.name, backoff=backoff, max_backoff=max_backoff)
        self.max_entry_size = max_entry_size
        self._reads = CappedReads(
            max_entry_size, _REPLY_BUDGET, self.name, self.cluster, max_batch_size
        )
        self._listing = Listing(prefix, self.name, self.cluster)
        errors = self._redis.exceptions
        self._unavailable: tuple[type[BaseException], ...] = (
            *(errors.ConnectionError, errors.TimeoutError, errors.ClusterDownError),
            *(errors.TryAgainError, errors.RedisClusterException, errors.InvalidResponse, OSError),
        )
        self._client: Any = None
        self._lease_keys: tuple[bytes, ...] = ()
        # The server's clock signed leases count in, learned once for all of them.
        self._lease_clock = ServerClock()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        renew_in_child(self, "_lock")

    @classmethod
    def from_url(cls, url: str) -> RedisBackend:
        """Open from ``redis://host:port/db?ttl=30d&namespace=app`` (options: see module doc)."""
        address, options = url_options(url)
        return cls(address, **options)

    # ------------------------------------------------------------ connection
    def _connect(self) -> Any:
        redis = self._redis
        retry = redis.retry.Retry(
            redis.backoff.NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)
        )
        common: dict[str, Any] = {
            "socket_connect_timeout": self.connect_timeout,
            "socket_timeout": self.timeout,
            "max_connections": self.max_connections,
            "retry": retry,
            # Each reply must keep coming (see .redis_deadline): a drip is a timeout.
            "connection_class": self._connection_classes[self._transport],
            **self._ssl_options,
        }
        if self.cluster:
            # One attempt per call: the breaker, not a retry loop, handles outages.
            return redis.cluster.RedisCluster.from_url(
                self._server_url,
                retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
                **{k: v for k, v in common.items() if k != "retry"},
            )
        pool = redis.ConnectionPool.from_url(self._server_url, **common)
        return redis.Redis(connection_pool=pool, retry=retry)

    def _get_client(self) -> Any:
        if self._pid != os.getpid():
            # A forked child must not share its parent's sockets: drop (not close)
            # the inherited pool and start afresh.
            with self._lock:
                if self._pid != os.getpid():
                    self._client = None
                    self._pid = os.getpid()
                    self.breaker.reset()
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    def _run(self, op: str, call: Callable[[Any], T]) -> T:
        self.breaker.before_call()
        errors = self._redis.exceptions
        started = self.breaker.now()
        try:
            result = call(self._get_client())
        except errors.MaxConnectionsError as exc:
            self.breaker.success()
            raise BackendError(f"{op} on {self.name}: connection pool exhausted ({exc})") from exc
        except errors.AuthenticationError as exc:  # (a ConnectionError to redis-py)
            self.breaker.failure(exc, started)  # every call would fail alike: fail fast
            advice = (
                "check the URL's password"
                if self._has_password
                else "the URL gives no password: add 'USER:PASSWORD@' (or ':PASSWORD@') "
                f"before the {'socket path' if self._transport == 2 else 'host'}"
            )
            raise BackendUnavailableError(
                f"{op} on {self.name}: the server refused the login ({advice}): {exc}"
            ) from exc
        except self._unavailable as exc:
            self.breaker.failure(exc, started)
            raise BackendUnavailableError(f"{op} on {self.name} failed: {exc}") from exc
        except errors.ReadOnlyError as exc:
            self.breaker.success()
            raise ReadOnlyBackendError(f"{op} on {self.name}: server is read-only") from exc
        except errors.ResponseError as exc:
            if not _REFUSED_DB.search(str(exc)):
                self.breaker.success()
                raise BackendError(f"{op} on {self.name} failed: {exc}") from exc
            self.breaker.failure(exc, started)  # every connection is refused alike: fail fast
            raise BackendUnavailableError(
                f"{op} on {self.name}: the server refused the URL's database number: {exc}"
            ) from exc
        except errors.RedisError as exc:
            self.breaker.success()
            raise BackendError(f"{op} on {self.name} failed: {exc}") from exc
        except Exception as exc:  # e.g. a reply redis-py cannot parse: still a typed error
            self.breaker.success()
            raise BackendError(f"{op} on {self.name} failed: {exc!r}") from exc
        except BaseException:
            # Not the server's fault (e.g. KeyboardInterrupt): still end a probe.
            self.breaker.success()
            raise
        self.breaker.success()
        return result

    def _full(self, key: str) -> str:
        # (redis-py would raise on a lone surrogate; a listing leaves longer names out)
        return self.prefix + check_text_key(key)

    def _px(self) -> int | None:
        return None if self.ttl is None else max(1, int(self.ttl * 1000))

    # -------------------------------------------------------------- contract
    def get(self, key: str) -> bytes | None:
        full = self._full(key)
        value: bytes | None = self._run("get", lambda c: self._reads.get(c, full))
        return value

    def set(self, key: str, value: bytes) -> None:
        full, data, px = self._full(key), bytes(value), self._px()
        refuse_over_cap(self.name, self.max_entry_size, {key: len(data)})
        self._run("set", lambda c: c.set(full, data, px=px))

    def add(self, key: str, value: bytes) -> bool:
        full, data, px = self._full(key), bytes(value), self._px()
        refuse_over_cap(self.name, self.max_entry_size, {key: len(data)})
        return bool(self._run("set", lambda c: c.set(full, data, px=px, nx=True)))

    def delete(self, key: str) -> bool:
        full = self._full(key)
        return bool(self._run("delete", lambda c: c.delete(full)))

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Remove ``key`` only if it holds ``expected`` (compared by SHA-1 on the server, in
        one Lua script), or holds something other than a string."""
        full, digest = self._full(key), hashlib.sha1(expected).hexdigest()
        return bool(self._run("delete_if", lambda c: c.eval(DELETE_IF, 1, full, digest)))

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        """Remove ``key`` only while it is ``listed.size`` bytes long and begins with ``head``
        (on the server, in one Lua script); Redis keeps no last use to compare."""
        full, size, first = self._full(key), listed.size, bytes(head)
        script = DELETE_IF_UNCHANGED
        return bool(self._run("delete_if", lambda c: c.eval(script, 1, full, size, first)))

    def keys(self, prefix: str = "") -> Iterator[str]:
        # Strings only: a foreign hash or list under our prefix is not an entry, and reading
        # it (STRLEN, GETRANGE) would fail the whole listing with WRONGTYPE.
        return iter(self._run("keys", lambda c: self._listing.keys(c, prefix)))

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        fulls = [self._full(k) for k in wanted]

        # The sizes (and the small values) first, then the larger values in replies of
        # about 32 MiB, up to max_batch_size in all (see CappedReads).
        values = self._run("get_many", lambda c: self._reads.get_many(c, fulls))
        return {k: v for k, v in zip(wanted, values, strict=True) if v is not None}

    def set_many(self, items: Mapping[str, bytes]) -> None:
        if not items:
            return
        cap = self.max_entry_size
        pairs = [(self._full(k), data) for k, v in items.items() if len(data := bytes(v)) <= cap]
        px = self._px()

        def store(client: Any) -> None:
            pipe = client.pipeline(transaction=False)
            for full, data in pairs:
                pipe.set(full, data, px=px)
            pipe.execute()

        if pairs:
            self._run("set_many", store)
        # What fits is stored; the rest is refused with an error naming it.
        refuse_over_cap(self.name, cap, {k: len(v) for k, v in items.items()})

    def head(self, key: str, size: int) -> bytes | None:
        full = self._full(key)

        def read(client: Any) -> bytes | None:
            part: bytes = client.getrange(full, 0, size - 1) if size > 0 else b""
            # GETRANGE answers b"" for a missing key too.
            if part == b"" and not client.exists(full):
                return None
            return part

        return self._run("head", read)

    def stored_size(self, key: str) -> int | None:
        """The length of ``key``'s value by ``STRLEN`` (none read), ``None`` where empty."""
        full = self._full(key)
        return self._run("head", lambda client: int(client.strlen(full)) or None)

    def lease(self, key: str, ttl: float) -> Lease:
        """A lease under ``<prefix>lease:<key>``: inside the namespace (an ACL on ``<prefix>*``
        allows it), left out of listings (its first component holds a ``:``)."""
        from .redis_lease import RedisLease

        self._full(key)  # the key rules of entries
        name = f"{self.prefix}lease:{key}"
        return RedisLease(self._run, name, key, ttl, self._lease_keys, self._lease_clock)

    def sign_leases(self, keys: tuple[bytes, ...]) -> None:
        # The newest cache's first key signs (a rotated secret); earlier keys verify (8 at most).
        self._lease_keys = (*keys, *(k for k in self._lease_keys if k not in keys))[:8]

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        """List keys and sizes with SCAN and STRLEN; no value is transferred."""
        return iter(self._run("scan", lambda c: self._listing.sizes(c, prefix)))

    def close(self) -> None:
        """Disconnect the pool; a later call connects again."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None and self._pid == os.getpid():
            try:
                client.close()
                if not self.cluster:
                    client.connection_pool.disconnect()
            except Exception:  # closing a dead connection is not worth an error
                pass

    def __repr__(self) -> str:
        held = "" if self.breaker.state == "closed" else f", breaker {self.breaker.state}"
        return f"<RedisBackend {self.name} prefix={self.prefix!r}{held}>"  # (not "closed")
