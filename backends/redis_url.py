"""``redis://`` URLs: the options they give, checked, as ``RedisBackend`` takes them.

Options are listed in :mod:`runtime_cache.backends.redis`. An unknown option, one given
twice, an empty ``prefix=`` or ``namespace=`` (a URL made from an unset variable would
cover the whole database), or a bad duration or size is an
:class:`~runtime_cache.errors.InvalidURLError`. :func:`import_redis` loads redis-py for the
backend, or says how to install it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from runtime_cache.errors import INSTALL_REDIS, InvalidURLError, MissingDependencyError
from runtime_cache.units import parse_duration, parse_size
from runtime_cache.urls import BackendURL, redact_url

__all__ = ["SSL_CERT_REQS", "check_database", "import_redis", "unix_address", "url_options"]

#: The values redis-py takes for ``ssl_cert_reqs`` (a typo failed every call, not the open).
SSL_CERT_REQS = ("none", "optional", "required")
_TLS = ("ssl_ca_certs", "ssl_cert_reqs")


def url_options(url: str) -> tuple[str, dict[str, Any]]:
    """The server's address (the URL without its query) and the backend's options."""
    parsed = BackendURL.parse(url)
    prefix = parsed.pop("prefix")
    namespace = parsed.pop("namespace")
    if prefix is not None and namespace is not None:
        raise InvalidURLError("give either prefix or namespace, not both")
    for name, given in (("prefix", prefix), ("namespace", namespace)):
        if given is not None and not given.strip():
            # (a URL made from an unset variable: it would cover the whole database,
            # and clear or verify --repair would remove other applications' keys)
            raise InvalidURLError(
                f"{name}= is empty: that would cover the whole database; leave it out "
                "for the default prefix 'rc:'"
            )
    prefix = f"{namespace}:" if namespace is not None else prefix
    ttl_text = parsed.pop("ttl", "") or ""
    ttl = None if ttl_text.lower() in ("", "0", "none", "off") else parse_duration(ttl_text)
    options: dict[str, Any] = {
        "prefix": "rc:" if prefix is None else prefix,
        "ttl": ttl,
        "connect_timeout": parse_duration(parsed.pop("connect_timeout", "200ms") or "200ms"),
        "timeout": parse_duration(parsed.pop("timeout", "500ms") or "500ms"),
        "backoff": parse_duration(parsed.pop("backoff", "500ms") or "500ms"),
        "max_backoff": parse_duration(parsed.pop("max_backoff", "30s") or "30s"),
    }
    max_connections = parsed.pop("max_connections", "64") or "64"
    if not max_connections.isdigit():
        raise InvalidURLError(f"max_connections must be a whole number: {max_connections!r}")
    options["max_connections"] = int(max_connections)
    options["max_entry_size"] = parse_size(parsed.pop("max_entry_size", "64MiB") or "64MiB")
    batch = parsed.pop("max_batch_size")
    options["max_batch_size"] = parse_size(batch) if batch else None
    database = parsed.pop("db") if parsed.scheme == "redis+unix" else None
    tls = {name: value for name in _TLS if (value := parsed.pop(name)) is not None}
    if tls and parsed.scheme != "rediss":  # (it said "unknown option")
        raise InvalidURLError(f"TLS options ({', '.join(tls)}) need rediss://, a TLS server's URL")
    if parsed.scheme == "rediss":
        options["ssl_options"] = tls
    reqs = options.get("ssl_options", {}).get("ssl_cert_reqs")
    if reqs is not None and reqs not in SSL_CERT_REQS:
        raise InvalidURLError(f"ssl_cert_reqs must be one of {', '.join(SSL_CERT_REQS)}: {reqs!r}")
    parsed.reject_unknown()
    if options["backoff"] <= 0 or options["max_backoff"] < options["backoff"]:
        raise InvalidURLError("need 0 < backoff <= max_backoff")
    query = "" if database is None else f"?db={database}"  # (checked: unix_address)
    return f"{parsed.scheme}://{parsed.netloc}{parsed.path}{query}", options


def check_database(url: str, path: str, cluster: bool) -> None:
    """Refuse a URL ``path`` that is not a database number (a cluster's: 0 only)."""
    database = unquote(path).replace("/", "")  # as redis-py reads it: /0/, /%31
    if database and not (database.isascii() and database.isdigit()):
        # redis-py reads "/abc" and "/3/x" as database 0: a typo would share another's data
        raise InvalidURLError(
            f"a Redis URL's path is a database number, e.g. /0: {redact_url(url)} (in a "
            "password, write '/' as %2F)"
        )
    if cluster and database not in ("", "0"):
        raise InvalidURLError("a Redis Cluster has only database 0")


def unix_address(parsed: BackendURL) -> tuple[str, str]:
    """redis-py's URL for a ``redis+unix://[[user]:password@]/path/to/redis.sock[?db=N]``
    (``unix://...?db=N``), and the name messages give it (no password). The socket's path
    is absolute and no host is given; the database is a number (none: 0)."""
    userinfo, _, host = parsed.netloc.rpartition("@")
    path = unquote(parsed.path)
    if not path.isprintable():  # (a NUL cut the path short; others garble messages)
        raise InvalidURLError(
            "a socket's path may hold no control, format or separator characters: "
            f"{redact_url(parsed.raw)}"
        )
    if host or not path.startswith("/") or path.endswith("/"):
        raise InvalidURLError(
            f"a redis+unix:// URL names a socket file by its absolute path, and no host: "
            f"{redact_url(parsed.raw)} (e.g. redis+unix:///run/redis/redis.sock?db=0)"
        )
    database = parsed.options.get("db", "0")
    if not (database.isascii() and database.isdigit() and int(database) < 1 << 31):
        raise InvalidURLError(f"db= is a database number, e.g. db=0: {redact_url(parsed.raw)}")
    at = f"{userinfo}@" if userinfo else ""
    name = f"redis+unix://{path}" + (f"?db={int(database)}" if int(database) else "")
    return f"unix://{at}{parsed.path}?db={int(database)}", name


def import_redis() -> Any:
    """The ``redis`` package (redis-py) with the submodules the backend uses, or
    :class:`~runtime_cache.errors.MissingDependencyError` saying how to install it."""
    try:
        import redis
        import redis.backoff
        import redis.cluster
        import redis.retry
    except ImportError as exc:
        raise MissingDependencyError(
            f"the Redis backend needs redis-py, which is not installed: {INSTALL_REDIS}"
        ) from exc
    return redis
