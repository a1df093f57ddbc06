"""The demo's one error: it cannot run here, or one of its runs failed."""

from __future__ import annotations

from ..errors import RuntimeCacheError

__all__ = ["DemoError"]


class DemoError(RuntimeCacheError):
    """The demo cannot run here (exit code 2) or one of its runs failed (``code=1``)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
