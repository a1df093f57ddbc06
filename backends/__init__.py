"""Storage backends, imported as ``runtime_cache.backends``.

Each backend lives in its own module and is found through the registry by URL
scheme (entry-point group ``runtime_cache.backends``). The classes are also
exported here, lazily (PEP 562): importing this package imports none of them,
and ``from runtime_cache.backends import DirectoryBackend`` imports only
:mod:`runtime_cache.backends.directory`.

>>> from runtime_cache.backends import MemoryBackend
>>> MemoryBackend(max_size="1MB")  # doctest: +ELLIPSIS
<MemoryBackend ...>
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime_cache.lazy_exports import lazy_exports as _lazy_exports

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time they load on first use
    from .callback import CallbackBackend
    from .directory import DirectoryBackend
    from .memory import MemoryBackend
    from .redis import RedisBackend
    from .tiered import TieredBackend

__all__ = ["CallbackBackend", "DirectoryBackend", "MemoryBackend", "RedisBackend", "TieredBackend"]

# Exported name -> the module (in this package) that defines it.
_MODULES = {
    "CallbackBackend": "callback",
    "DirectoryBackend": "directory",
    "MemoryBackend": "memory",
    "RedisBackend": "redis",
    "TieredBackend": "tiered",
}


__getattr__, __dir__ = _lazy_exports(__name__, _MODULES, globals())
