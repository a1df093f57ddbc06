"""A package's exported names, loaded on first use (PEP 562).

``runtime_cache`` and ``runtime_cache.backends`` export names defined in many
modules; importing the package imports none of those modules, and the first
look-up of a name imports only the module that defines it::

    __getattr__, __dir__ = lazy_exports(__name__, {"Cache": "cache"}, globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str,
    modules: Mapping[str, str | tuple[str, str]],
    namespace: dict[str, Any],
    loaded: Callable[[str], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` (its ``globals()`` are
    ``namespace``), which exports each name of ``modules`` from the submodule named there
    (or, for ``(module, attribute)``, that attribute of it under the exported name).
    ``loaded(name)``, when given, runs after a name's first look-up."""

    def __getattr__(name: str) -> Any:
        where = modules.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = (where, name) if isinstance(where, str) else where
        value = getattr(importlib.import_module(f".{module}", package), attribute)
        if loaded is not None:
            loaded(name)
        namespace[name] = value  # later look-ups skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
