"""What the method groups of :class:`~runtime_cache.opencl.OpenCLModule` share of it.

The module is assembled from mixins (:mod:`.module_ahead`, :mod:`.module_bundles`);
:class:`ModuleCore` is the part of the module that each of them uses, so that each
mixin's own protocol names only what it adds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from ..cache import Cache
from .plan import ProgramPlan

__all__ = ["ModuleCore"]


class ModuleCore(Protocol):
    """The state and steps of a module that its method groups share."""

    context: Any
    _lock: threading.RLock
    _programs: dict[str, Any]

    @property
    def sources(self) -> Mapping[str, str]: ...

    @property
    def cache(self) -> Cache: ...

    def _plan(self, name: str) -> ProgramPlan: ...

    def _adopt(self, name: str, program: Any, seconds: float, *, cached: bool = False) -> None: ...
