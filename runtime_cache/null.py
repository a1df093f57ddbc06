"""The backend of a disabled cache: stores nothing, finds nothing."""

from __future__ import annotations

from collections.abc import Iterator

from .api import Backend

__all__ = ["NullBackend"]


class NullBackend(Backend):
    """Stores nothing: the backend of ``Cache(None)`` (caching off)."""

    scheme = "off"

    def get(self, key: str) -> bytes | None:
        return None

    def set(self, key: str, value: bytes) -> None:
        return None

    def delete(self, key: str) -> bool:
        return False

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter(())
