"""The process-wide cache provider.

Selection order: :func:`set_cache_provider` wins; then the environment variable
``RUNTIME_CACHE`` (a URL, a comma-separated list of tiers, or ``off``); then
the embedded default, a directory in ``platformdirs.user_cache_dir("runtime-cache")``.

>>> import runtime_cache as rc
>>> with rc.cache_provider("memory://"):
...     rc.get_cache().enabled
True
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from . import environment
from .api import Backend
from .cache import Cache
from .codec import normalize_secret
from .errors import BackendError, RuntimeCacheError
from .fork_locks import renew_in_child
from .registry import open_backend, registry
from .trust import unsigned_refusal
from .urls import folder_url, redact, redact_url

__all__ = [
    "OFF",
    "Provider",
    "cache_provider",
    "default_folder_fallback",
    "get_cache",
    "preload_default_backend",
    "set_cache_provider",
]

log = logging.getLogger(__name__)

Provider = str | Backend | Cache | None

_lock = threading.RLock()
renew_in_child(sys.modules[__name__], "_lock")
_current: Cache | None = None
_explicit = False
_open_error: str | None = None  # why RUNTIME_CACHE's cache could not be opened


#: ``RUNTIME_CACHE`` values (and provider strings) that turn caching off.
OFF = ("off", "none", "0", "false", "disabled")


def cache_from_url(url: str, *, secret: list[str] | None, strict: bool = False) -> Cache:
    """A :class:`Cache` over :func:`open_backend` of ``url``. A store the cache refuses
    (a shared one without a secret) is closed: it was opened here, for this cache alone.
    One whose URL says it is shared is refused before it is opened, so that nothing is
    made or changed for a cache that cannot use it (a folder made group-writable)."""
    refuse_unsigned(url, secret)
    backend = open_backend(url)
    try:
        return Cache(backend, strict=strict, secret=secret)
    except BaseException:
        backend.close()
        raise


def refuse_unsigned(url: str, secret: list[str] | None) -> None:
    """Raise :class:`~runtime_cache.errors.InsecureStoreError` when ``url`` says its store
    is shared and no ``secret`` is given (read from the URL alone, nothing opened), and
    :class:`~runtime_cache.errors.InvalidSecretError` for a blank one, also before."""
    if normalize_secret(secret) is None:
        shared = registry.shared_parts(url)
        if shared:
            raise unsigned_refusal(shared)


def _to_cache(provider: Provider) -> Cache:
    secret = environment.read_secret()
    if provider is None:
        return Cache(None)
    if isinstance(provider, Cache):
        return provider
    if isinstance(provider, Backend):
        return Cache(provider, secret=secret)
    if isinstance(provider, str):
        if provider.strip().lower() in OFF:
            return Cache(None)
        refuse_unsigned(provider, secret)
        options = _default_folder_options(provider)
        if options is not None:  # the default folder: with the default's fallbacks
            return _embedded(options)
        return cache_from_url(provider, secret=secret)
    raise TypeError(
        f"a cache provider is a URL, a Backend, a Cache or None, not {type(provider).__name__}"
    )


def _default() -> Cache:
    url = environment.read(environment.ENV_CACHE)
    if url is None:
        return _embedded()
    try:
        return _to_cache(url)
    except Exception as exc:
        return _off(redact_url(url), exc)


def _off(where: str, exc: Exception) -> Cache:
    # A bad setting, or a folder someone filled with junk, must not crash the app: run on
    # without a cache, loudly (a RuntimeCacheError is the expected kind; any other is a bug
    # of ours, named by its type).
    global _open_error
    kind = "" if isinstance(exc, RuntimeCacheError) else f"{type(exc).__name__}: "
    log.error("runtime-cache: cannot open cache %s (%s%s); caching is off", where, kind, exc)
    _open_error = f"{kind}{exc}"
    return Cache(None)


def _default_folder_options(url: str) -> str | None:
    """The query (``""`` or ``"?..."``) of a ``dir://`` URL that names no folder: the
    default one's; ``None`` for any other URL."""
    text = url.strip()
    if text[:6].lower() != "dir://":
        return None
    path, mark, query = text[6:].partition("?")
    return None if path else mark + query


def _fallback_url(options: str) -> str:
    # The default's private temporary folder (made if missing, checked as this user's own:
    # OSError when not), with the default URL's options.
    return folder_url(environment.private_fallback("cache")) + options


def default_folder_fallback(url: str, exc: Exception) -> str | None:
    """Where the default cache goes when ``url``, the default folder's (``dir://``, maybe
    with options), could not be opened (``exc``): the URL of this user's private temporary
    folder, as :func:`get_cache` opens it then, said once a process as it says it
    (:func:`~runtime_cache.environment.warn_no_home`). ``None`` for any other URL, or
    where that folder is not this user's own either.

    A caller that opens the default cache itself (the demo, strict) falls back the same way.
    """
    options = _default_folder_options(url)
    if options is None:
        return None
    environment.warn_no_home(str(exc))
    try:
        return _fallback_url(options)
    except OSError:
        return None


def _embedded(options: str = "") -> Cache:
    """The user cache folder; with no usable home, a private temporary one, else memory.
    ``options``: a ``dir://`` URL's query (``"?max_size=1GiB"``), for either folder."""
    try:  # a bad secret is a bad setting (as above), not a home folder's trouble
        environment.read_secret()
    except RuntimeCacheError as exc:
        return _off("(the default)", exc)
    try:
        return cache_from_url("dir://" + options, secret=environment.read_secret())
    except BackendError as exc:  # the home folder's trouble: the temporary folder instead
        environment.warn_no_home(str(exc))
    except RuntimeCacheError as exc:
        if options:  # a setting of the URL's (a typo; shared=1 and no secret): the caller's
            raise
        environment.warn_no_home(str(exc))
    except Exception as exc:  # never the app's crash (see _default)
        log.error("runtime-cache: cannot open the default cache (%s: %s)", type(exc).__name__, exc)
    try:
        return _to_cache(_fallback_url(options))
    except Exception as exc:
        global _open_error
        log.debug("runtime-cache: no temporary cache folder either (%s); using memory", exc)
        _open_error = f"no cache folder could be opened, the cache is in memory: {exc}"
        return _to_cache("memory://")


def preload_default_backend() -> None:
    """Import the class of the backend that :func:`get_cache` will open; open nothing.

    A consumer calls it when it is imported, so that a process's first cached
    program does not also pay for importing the backend's modules (about 5 ms for
    ``dir://``). Only a single URL's scheme is looked at (``RUNTIME_CACHE``, else
    the embedded default ``dir://``); any trouble is left for :func:`get_cache`
    to report, where it always was.
    """
    url = environment.read(environment.ENV_CACHE) or "dir://"
    scheme, mark, _ = url.partition("://")
    if not mark or "," in url:
        return
    try:
        registry.resolve(scheme.strip().lower())
    except (RuntimeCacheError, ImportError):
        pass


def set_cache_provider(provider: Provider) -> Cache:
    """Set the process-wide cache: a URL, a :class:`Backend`, a :class:`Cache`, or ``None`` (off).

    Call it once at startup. It wins over ``RUNTIME_CACHE`` and the default.
    Returns the :class:`Cache` now in use.

    A URL that is wrong wherever it runs (a typo, an unknown option or scheme, a
    shared store without a secret) raises, so the mistake shows at once. A store
    this machine cannot open now (a folder it may not create, a full or read-only
    disk) is logged as an error and caching is off, as for ``RUNTIME_CACHE``: the
    cache never stops the app.

    Example::

        rc.set_cache_provider("dir:///var/cache/myapp")
    """
    global _current, _explicit
    try:
        cache = _to_cache(provider)
    except BackendError as exc:
        where = redact_url(provider) if isinstance(provider, str) else repr(provider)
        log.error("runtime-cache: cannot open cache %s (%s); caching is off", where, exc)
        cache = Cache(None)
    with _lock:
        _current, _explicit = cache, True
    return cache


def open_error() -> str | None:
    """Why the cache ``RUNTIME_CACHE`` names could not be opened (caching is then off), or
    ``None``: for a command line to say, after the log line."""
    return redact(_open_error) if _open_error is not None else None


def reset_cache_provider() -> None:
    """Forget any provider set, so the next :func:`get_cache` reads the environment again."""
    global _current, _explicit, _open_error
    with _lock:
        _current, _explicit, _open_error = None, False, None


def get_cache() -> Cache:
    """Return the process-wide :class:`Cache`, opening the default on first use."""
    global _current
    cache = _current
    if cache is not None:
        return cache
    with _lock:
        if _current is None:
            _current = _default()
        return _current


@contextmanager
def cache_provider(provider: Provider) -> Iterator[Cache]:
    """Temporarily use another provider within a ``with`` block (restored afterwards)."""
    global _current, _explicit
    cache = _to_cache(provider)
    with _lock:
        saved = (_current, _explicit)
        _current, _explicit = cache, True
    try:
        yield cache
    finally:
        with _lock:
            _current, _explicit = saved
