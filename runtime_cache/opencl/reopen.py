"""Describe a cache so that another process can open the very same store.

The detached store (:mod:`.detached_store`) finishes the parent's stores
after the parent has exited, so it must open the parent's store itself.
:func:`reopen_spec` describes a :class:`~runtime_cache.Cache`'s backend as plain
data (msgpack-able), and :func:`open_spec` opens it again:

* a ``dir://`` folder by its absolute path and options (never relative to a
  working folder, which the other process does not share);
* a tiered store by its tiers, less any ``memory://`` tier (it would die with
  the other process anyway);
* any other backend by the URL :func:`~runtime_cache.open_backend` opened it
  from (Redis, say), which may hold a password: hand the spec over a pipe.

A store that lives only in this process (``memory://``, a callback backend, a
backend made in code without a URL) has no spec: ``None``. Nor has an unsigned
shared store that only ``Cache(insecure=True)`` lets this process use: the
other process would refuse it, as it must.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..api import Backend
from ..cache import Cache
from ..errors import InvalidURLError
from ..registry import open_backend

__all__ = ["open_spec", "reopen_spec"]

Spec = dict[str, Any]


def _backend_spec(backend: Backend) -> Spec | None:
    if backend.scheme == "dir":
        folder: Any = backend
        options = {
            "max_size": folder.max_size,
            "max_files": folder.max_files,
            "fsync": folder.fsync,
            "track_access": folder.track_access,
            "shared": folder.shared,
        }
        return {"dir": str(folder.root), "options": options, "insecure": backend.insecure}
    if backend.scheme == "tiered":
        tiers = [t for t in getattr(backend, "tiers", []) if t.scheme != "memory"]
        specs = [_backend_spec(t) for t in tiers]
        if not specs or any(s is None for s in specs):
            return None
        return {"tiers": specs}
    url = backend.opened_from
    if url is None or backend.scheme == "memory" or url.strip().lower().startswith("dir:"):
        return None  # memory dies with us; a dir:// URL may be relative (handled above)
    return {"url": url}


def reopen_spec(cache: Cache) -> Spec | None:
    """Plain data from which :func:`open_spec` opens ``cache``'s store in another
    process, or ``None`` when it cannot be opened there (see the module's notes).

    The spec holds no secret (:meth:`~runtime_cache.Cache.secret_keys` gives it)
    but may hold a server password in a URL: keep it off command lines and logs.
    """
    if not cache.enabled:
        return None
    backend = cache.backend
    if backend.shared and not cache.signed and not backend.insecure:
        return None  # unsigned by Cache(insecure=True): the other process would refuse
    return _backend_spec(backend)


def _backend_class(module: str, name: str) -> Any:
    # Imported, not looked up in the registry: a checkout run through PYTHONPATH has the
    # package but not its entry points.
    return getattr(importlib.import_module(f"runtime_cache.backends.{module}"), name)


def open_spec(spec: Spec) -> Backend:
    """Open the backend that ``spec`` (from :func:`reopen_spec`) describes.

    Raises :class:`~runtime_cache.errors.InvalidURLError` for a malformed spec,
    and the backend's own errors when it cannot be opened.
    """
    if not isinstance(spec, dict):
        raise InvalidURLError(f"not a store spec: {type(spec).__name__}")
    if "dir" in spec:
        options = spec.get("options")
        if not isinstance(spec["dir"], str) or not isinstance(options, dict):
            raise InvalidURLError("malformed dir spec")
        folder: Any = _backend_class("directory", "DirectoryBackend")
        backend: Backend = folder(spec["dir"], **options)
        backend.insecure = bool(spec.get("insecure", False))
        return backend
    if "tiers" in spec:
        tiers = spec["tiers"]
        if not isinstance(tiers, list) or not tiers:
            raise InvalidURLError("malformed tiered spec")
        tiered: Any = _backend_class("tiered", "TieredBackend")
        opened: Backend = tiered([open_spec(t) for t in tiers])
        return opened
    url = spec.get("url")
    if not isinstance(url, str):
        raise InvalidURLError("malformed store spec")
    return open_backend(url)
