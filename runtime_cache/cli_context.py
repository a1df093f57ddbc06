"""What every ``runtime-cache`` subcommand shares: its context, its errors, quiet reads."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from .cache import Cache

__all__ = ["CommandContext", "KeyNotFound", "UsageError"]


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
    secret: str | list[str] | None = None
    now: float = field(default_factory=time.time)

    def emit_json(self, value: Any) -> None:
        """Write ``value`` as JSON to the output stream."""
        json.dump(value, self.out, indent=2, sort_keys=False, default=str)
        self.out.write("\n")
