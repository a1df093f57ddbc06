"""The one place that reads the process environment and the platform's cache folder.

Kept apart from the core so that the core stays free of ``os``.
"""

from __future__ import annotations

import os

import platformdirs

__all__ = ["ENV_CACHE", "ENV_SECRET", "default_directory", "read"]

#: A backend URL, a comma-separated list of tiers, or ``off``.
ENV_CACHE = "RUNTIME_CACHE"
#: A shared secret; when set, entries are signed and unsigned ones rejected.
ENV_SECRET = "RUNTIME_CACHE_SECRET"


def read(name: str) -> str | None:
    """Return the environment variable ``name``, or ``None`` when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def default_directory() -> str:
    """The embedded default cache folder: ``platformdirs.user_cache_dir("runtime-cache")``."""
    return platformdirs.user_cache_dir("runtime-cache", appauthor=False)
