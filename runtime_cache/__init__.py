"""runtime-cache: one pluggable cache for GPU program binaries, tuning records and costly blobs.

Quick start::

    import runtime_cache as rc

    rc.set_cache_provider("dir:///var/cache/myapp")  # once, at startup
    key = rc.make_key(module_id="resnet18@3f2a", runtime="opencl", purpose="program-binary",
                      device={"vendor": "V", "name": "N", "driver": "1.2"})
    binary = rc.get_cache().get_or_build(key, compile_program)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import errors
from . import lazy_exports as _exports
from ._version import __version__
from .source_tree import attach_backends

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time they load on first use
    from .api import Backend, StoredItem
    from .cache import Cache
    from .codec import Entry, Limits
    from .keys import CacheKey, make_key, module_id_from_sources
    from .provider import cache_provider, get_cache, reset_cache_provider, set_cache_provider
    from .registry import open_backend, register_backend
    from .stats import CacheStats, EntryInfo

# A source checkout keeps runtime_cache.backends in backends/, beside this package.
attach_backends(__file__)

__all__ = [
    "Backend",
    "Cache",
    "CacheKey",
    "CacheStats",
    "Entry",
    "EntryInfo",
    "Limits",
    "StoredItem",
    "__version__",
    "cache_provider",
    "errors",
    "get_cache",
    "make_key",
    "module_id_from_sources",
    "open_backend",
    "register_backend",
    "reset_cache_provider",
    "set_cache_provider",
]

# Exported name -> the module (in this package) that defines it. Importing this package
# (as ``import runtime_cache.opencl`` does) loads none of them: a process pays for the
# front, the codec and the provider only when it first uses one of these names.
_MODULES = {
    "Backend": "api",
    "Cache": "cache",
    "CacheKey": "keys",
    "CacheStats": "stats",
    "Entry": "codec",
    "EntryInfo": "stats",
    "Limits": "codec",
    "StoredItem": "api",
    "cache_provider": "provider",
    "get_cache": "provider",
    "make_key": "keys",
    "module_id_from_sources": "keys",
    "open_backend": "registry",
    "register_backend": "registry",
    "reset_cache_provider": "provider",
    "set_cache_provider": "provider",
}


__getattr__, __dir__ = _exports.lazy_exports(__name__, _MODULES, globals())
