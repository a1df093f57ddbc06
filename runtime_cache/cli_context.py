"""What every ``runtime-cache`` subcommand shares: its context, its errors, quiet reads."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from .api import Backend
from .cache import Cache

__all__ = ["CommandContext", "KeyNotFound", "UsageError", "reads_not_counted"]


class UsageError(Exception):
    """A command line that parses but cannot be run as given (exit code 2)."""


class KeyNotFound(LookupError):
    """No stored key matches what the user typed."""


@dataclass
class CommandContext:
    """What a subcommand works with: the cache, output streams, the secret and the clock."""

    cache: Cache
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    secret: str | None = None
    now: float = field(default_factory=time.time)

    def emit_json(self, value: Any) -> None:
        """Write ``value`` as JSON to the output stream."""
        json.dump(value, self.out, indent=2, sort_keys=False, default=str)
        self.out.write("\n")


@contextmanager
def reads_not_counted(backend: Backend) -> Iterator[None]:
    """Within the block, reads by maintenance (verify, export) are not counted as uses.

    A backend that tracks access on ``get`` through a ``track_access`` switch
    (the directory backend) has it turned off meanwhile, so exporting or
    verifying a cache neither adds hits nor makes every entry "recently used"
    for LRU pruning. Other backends are left as they are.
    """
    saved = getattr(backend, "track_access", None)
    if isinstance(saved, bool):
        backend.track_access = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if isinstance(saved, bool):
            backend.track_access = saved  # type: ignore[attr-defined]
