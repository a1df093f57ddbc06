"""The backend registry: names and URL schemes to backend classes, loaded lazily.

Built-in backends are declared as entry points in the group
``runtime_cache.backends`` exactly like a third party's. Entry points are read
without importing them; a backend's module is imported on first use.

>>> import runtime_cache as rc
>>> rc.open_backend("memory://?max_size=1MB")  # doctest: +ELLIPSIS
<MemoryBackend ...>
"""

from __future__ import annotations

import importlib
import logging
import re
import threading
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote_plus

from .api import Backend
from .errors import (
    INSTALL_REDIS,
    BackendConflictError,
    InvalidURLError,
    InvalidValueError,
    MissingDependencyError,
    RuntimeCacheError,
    UnknownBackendError,
)
from .fork_locks import renew_in_child
from .urls import BackendURL, redact_url, tier_urls

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "Registry",
    "open_backend",
    "register_backend",
    "registry",
]

ENTRY_POINT_GROUP = "runtime_cache.backends"

log = logging.getLogger(__name__)

#: The distribution that declares the built-in backends; it wins their names.
OWN_DISTRIBUTION = "runtime-cache"

#: The built-in backends: the entry points that pyproject.toml declares in
#: :data:`ENTRY_POINT_GROUP` for the project's own distribution, which keeps these names
#: (``tests/test_registry_provider.py`` holds the two equal). A built-in scheme resolves
#: from here: reading the distribution's entry points imports ``importlib.metadata``,
#: 25-55 ms of imports in a process that has none of them yet (an app on the default
#: ``dir://`` cache without pyopencl, which imports it anyway).
BUILT_IN = {
    "memory": "runtime_cache.backends.memory:MemoryBackend",
    "dir": "runtime_cache.backends.directory:DirectoryBackend",
    "callback": "runtime_cache.backends.callback:CallbackBackend",
    "redis": "runtime_cache.backends.redis:RedisBackend",
    "rediss": "runtime_cache.backends.redis:RedisBackend",
    "redis+cluster": "runtime_cache.backends.redis:RedisBackend",
    "redis+unix": "runtime_cache.backends.redis:RedisBackend",
    "tiered": "runtime_cache.backends.tiered:TieredBackend",
}

# What to install when a built-in backend's optional dependency is missing.
_INSTALL_HINTS = dict.fromkeys(("redis", "rediss", "redis+cluster", "redis+unix"), INSTALL_REDIS)


def _distribution(ep: EntryPoint) -> str:
    """The normalized name of the distribution that declares ``ep`` ("?" if unknown).

    Read only when two entry points disagree: it parses the distribution's metadata.
    """
    try:
        dist = getattr(ep, "dist", None)
        name = dist.metadata["Name"] if dist is not None else None
    except Exception:  # unreadable metadata must not stop discovery
        name = None
    return re.sub(r"[-_.]+", "-", name).lower() if name else "?"


class Registry:
    """Maps names to ``"module:Class"`` strings or classes; resolves them on demand."""

    def __init__(self, group: str | None = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._targets: dict[str, str | type[Backend]] = {}
        self._hints: dict[str, str] = dict(_INSTALL_HINTS)
        self._loaded: dict[str, type[Backend]] = {}
        self._discovered = group is None
        self._own: dict[str, str] | None = None
        self._lock = threading.RLock()
        renew_in_child(self, "_lock")

    def _own_targets(self) -> dict[str, str]:
        """The names the project's own distribution declares (it keeps them in discovery):
        :data:`BUILT_IN` for the built-in group.

        Reading one distribution's entry points costs about 1 ms once ``importlib.metadata``
        is imported; discovering every distribution's costs 5-20 ms, which a process's
        first cached program would pay.
        """
        if self._own is None and self._group == ENTRY_POINT_GROUP:
            self._own = dict(BUILT_IN)
        if self._own is None:
            from importlib.metadata import distribution

            try:
                eps = distribution(OWN_DISTRIBUTION).entry_points.select(group=str(self._group))
                own = {ep.name.lower(): ep.value for ep in eps}
            except Exception:  # not installed as a distribution: discover as usual
                own = {}
            self._own = own
        return self._own

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            from importlib.metadata import entry_points

            found: dict[str, EntryPoint] = {}
            for ep in entry_points(group=cast(str, self._group)):
                name = ep.name.lower()
                held = found.get(name)
                if held is None:
                    found[name] = ep
                elif held.value != ep.value:
                    # The project's own distribution keeps its built-in names;
                    # otherwise the first one found keeps the name.
                    kept, dropped = held, ep
                    if _distribution(ep) == OWN_DISTRIBUTION != _distribution(held):
                        kept, dropped = ep, held
                    found[name] = kept
                    log.warning(
                        "backend scheme %r is declared twice: %s by %s (used) and %s by %s "
                        "(ignored)",
                        name,
                        kept.value,
                        _distribution(kept),
                        dropped.value,
                        _distribution(dropped),
                    )
            for name, ep in found.items():
                self._targets.setdefault(name, ep.value)
            self._discovered = True

    def register(
        self,
        name: str,
        target: str | type[Backend],
        *,
        replace: bool = False,
        hint: str | None = None,
    ) -> None:
        """Register ``target`` (a class or ``"pkg.mod:Class"``) under ``name``.

        ``hint`` says what to install when ``target``'s module cannot be
        imported, e.g. ``"pip install 'mypkg[s3]'"``; the ImportError shows it.
        """
        if hint is not None and (not isinstance(hint, str) or not hint.strip()):
            raise ValueError(f"hint must be a non-empty str, not {hint!r}")
        if not isinstance(name, str) or not name or "://" in name:
            raise ValueError(f"a backend name must be a non-empty scheme, not {name!r}")
        if isinstance(target, str):
            if ":" not in target:
                raise ValueError(f"target must look like 'package.module:Class', not {target!r}")
        elif not (isinstance(target, type) and issubclass(target, Backend)):
            raise TypeError(f"target must be a Backend subclass or 'module:Class', not {target!r}")
        self._discover()
        key = name.lower()
        with self._lock:
            old = self._targets.get(key)
            if old is not None and old != target and not replace:
                raise BackendConflictError(
                    f"a backend named {name!r} is already registered ({old!r}); "
                    "pass replace=True to override it"
                )
            self._targets[key] = target
            self._loaded.pop(key, None)
            if hint is not None:
                self._hints[key] = hint.strip()

    def unregister(self, name: str) -> None:
        """Forget the backend registered under ``name`` (no error if absent)."""
        self._discover()
        with self._lock:
            self._targets.pop(name.lower(), None)
            self._loaded.pop(name.lower(), None)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        self._discover()
        with self._lock:
            return sorted(self._targets)

    def resolve(self, name: str) -> type[Backend]:
        """Return the backend class registered under ``name``, importing it if needed.

        A built-in name is resolved from the project's own entry points without
        discovering every distribution's: discovery would keep the same target
        (the own distribution wins its names, and registering discovers first).
        """
        key = name.lower()
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
            fast = not self._discovered and self._group is not None
        target: str | type[Backend] | None = self._own_targets().get(key) if fast else None
        if target is None:
            self._discover()
            with self._lock:
                target = self._targets.get(key)
        if target is None:
            # callback:// is a name only: a CallbackBackend is made in code, not from a URL.
            known = ", ".join(f"{n}://" for n in self.names() if n != "callback") or "(none)"
            raise UnknownBackendError(f"no backend for scheme {name!r}; known schemes: {known}")
        cls = target if isinstance(target, type) else self._import(key, target)
        with self._lock:
            self._loaded[key] = cls
        return cls

    def _import(self, name: str, target: str) -> type[Backend]:
        module_name, _, attr = target.partition(":")
        attr = attr.split("[")[0].strip()
        try:
            module = importlib.import_module(module_name.strip())
        except MissingDependencyError:
            raise
        except ImportError as exc:
            hint = self._hints.get(name)
            hint = f"; install it with: {hint}" if hint else ""
            raise MissingDependencyError(
                f"backend {name!r} needs {exc.name or module_name}, which is not installed{hint}"
            ) from exc
        cls = getattr(module, attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise UnknownBackendError(f"{target!r} is not a runtime_cache Backend subclass")
        return cls

    def open_url(self, url: str) -> Backend:
        """Open a backend from a URL; a comma-separated list opens tiers, fastest first."""
        if not isinstance(url, str):
            raise InvalidURLError(f"a backend URL must be a str, not {type(url).__name__}")
        # Blanks around it are no part of it (as around each tier, and in RUNTIME_CACHE): a
        # folder whose name ends in one is written %20.
        url = url.strip()
        insecure, given = False, url
        if "," in url:  # each tier comes back here with its own options
            scheme = "tiered"
        else:
            url, insecure = take_insecure(url)
            scheme = BackendURL.parse(url).scheme
        try:
            backend = self.resolve(scheme).from_url(url)
        except InvalidValueError as exc:
            # A bad size or duration inside a URL is, for whoever wrote the URL, a URL error.
            raise InvalidURLError(f"{exc} in backend URL {redact_url(url)}") from None
        if insecure:
            backend.insecure = True
        backend.opened_from = given
        return backend

    def shared_parts(self, url: str) -> list[str]:
        """The parts of ``url`` (a tier each) that say, before anything is opened, that
        their store is shared and not opened unsigned on purpose (``insecure=1``), redacted.
        A URL this cannot read gives none: opening it says what is wrong."""
        url = url.strip() if isinstance(url, str) else ""
        if "," in url or url.lower().startswith("tiered://"):
            try:
                parts = tier_urls(url)
            except InvalidURLError:
                return []
            return [shared for part in parts for shared in self.shared_parts(part)]
        try:
            url, insecure = take_insecure(url)
            shared = not insecure and self.resolve(BackendURL.parse(url).scheme).url_is_shared(url)
        except (RuntimeCacheError, ImportError, ValueError):
            return []
        return [redact_url(url)] if shared else []


registry = Registry()


def take_insecure(url: str) -> tuple[str, bool]:
    """Take ``insecure=1`` (see :mod:`runtime_cache.trust`) out of a URL's query: the URL
    its backend is opened from, and whether it was there."""
    head, mark, query = url.partition("?")
    if not mark:
        return url, False
    kept, insecure, seen = [], False, False
    for item in query.split("&"):
        name, _, value = (unquote_plus(part) for part in item.partition("="))
        if name != "insecure":
            kept.append(item)
            continue
        if seen:  # which one counts would be a guess, as for any other option
            raise InvalidURLError("option(s) insecure given more than once")
        seen = True
        if value.lower() in ("1", "true", "yes"):
            insecure = True
        elif value.lower() not in ("0", "false", "no"):
            raise InvalidURLError(f"insecure must be 1 or 0, not {value!r}")
    return (f"{head}?{'&'.join(kept)}" if kept else head), insecure


def register_backend(
    name: str,
    target: str | type[Backend],
    *,
    replace: bool = False,
    hint: str | None = None,
) -> None:
    """Register a backend class under a URL scheme.

    ``target`` is a :class:`~runtime_cache.api.Backend` subclass or a lazy
    ``"package.module:Class"`` string. A name that is already taken raises
    :class:`~runtime_cache.errors.BackendConflictError` unless ``replace=True``.
    ``hint`` says what to install when the target's module (or a module it
    needs) is missing; :class:`~runtime_cache.errors.MissingDependencyError`
    shows it.

    Example::

        rc.register_backend("s3", "mypkg.s3:S3Backend", hint="pip install 'mypkg[s3]'")
        backend = rc.open_backend("s3://bucket/prefix")
    """
    registry.register(name, target, replace=replace, hint=hint)


def open_backend(url: str) -> Backend:
    """Open a backend from a URL, e.g. ``"dir:///var/cache/app"`` or ``"redis://host:6379/0"``.

    A comma-separated list, e.g. ``"memory://,dir://"``, opens a tiered backend.
    """
    return registry.open_url(url)
