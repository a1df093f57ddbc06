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
import threading
from importlib.metadata import entry_points
from typing import cast

from .api import Backend, BackendURL
from .errors import (
    BackendConflictError,
    InvalidURLError,
    MissingDependencyError,
    UnknownBackendError,
)

__all__ = ["ENTRY_POINT_GROUP", "Registry", "open_backend", "register_backend", "registry"]

ENTRY_POINT_GROUP = "runtime_cache.backends"

# Extras to name when a built-in backend's optional dependency is missing.
_EXTRA_HINTS = {"redis": "redis", "rediss": "redis", "redis+cluster": "redis"}


class Registry:
    """Maps names to ``"module:Class"`` strings or classes; resolves them on demand."""

    def __init__(self, group: str | None = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._targets: dict[str, str | type[Backend]] = {}
        self._loaded: dict[str, type[Backend]] = {}
        self._discovered = group is None
        self._lock = threading.RLock()

    def _discover(self) -> None:
        if self._discovered:
            return
        with self._lock:
            if self._discovered:
                return
            for ep in entry_points(group=cast(str, self._group)):
                self._targets.setdefault(ep.name.lower(), ep.value)
            self._discovered = True

    def register(self, name: str, target: str | type[Backend], *, replace: bool = False) -> None:
        """Register ``target`` (a class or ``"pkg.mod:Class"``) under ``name``."""
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
        """Return the backend class registered under ``name``, importing it if needed."""
        self._discover()
        key = name.lower()
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
            target = self._targets.get(key)
        if target is None:
            known = ", ".join(f"{n}://" for n in self.names()) or "(none)"
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
            extra = _EXTRA_HINTS.get(name)
            hint = f"; install it with: pip install 'runtime-cache[{extra}]'" if extra else ""
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
        if "," in url:  # each tier comes back here with its own options
            return self.resolve("tiered").from_url(url)
        url, insecure = _take_insecure(url)
        backend = self.resolve(BackendURL.parse(url).scheme).from_url(url)
        if insecure:
            backend.insecure = True
        return backend


registry = Registry()


def _take_insecure(url: str) -> tuple[str, bool]:
    """Take ``insecure=1`` (see :mod:`runtime_cache.trust`) out of a URL's query."""
    head, mark, query = url.partition("?")
    if not mark:
        return url, False
    kept, insecure = [], False
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if name != "insecure":
            kept.append(item)
        elif value.lower() in ("1", "true", "yes"):
            insecure = True
        elif value.lower() not in ("0", "false", "no"):
            raise InvalidURLError(f"insecure must be 1 or 0, not {value!r}")
    return (f"{head}?{'&'.join(kept)}" if kept else head), insecure


def register_backend(name: str, target: str | type[Backend], *, replace: bool = False) -> None:
    """Register a backend class under a URL scheme.

    ``target`` is a :class:`~runtime_cache.api.Backend` subclass or a lazy
    ``"package.module:Class"`` string. A name that is already taken raises
    :class:`~runtime_cache.errors.BackendConflictError` unless ``replace=True``.

    Example::

        rc.register_backend("s3", "mypkg.s3:S3Backend")
        backend = rc.open_backend("s3://bucket/prefix")
    """
    registry.register(name, target, replace=replace)


def open_backend(url: str) -> Backend:
    """Open a backend from a URL, e.g. ``"dir:///var/cache/app"`` or ``"redis://host:6379/0"``.

    A comma-separated list, e.g. ``"memory://,dir://"``, opens a tiered backend.
    """
    return registry.open_url(url)
