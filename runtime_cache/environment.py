"""The one place that reads the process environment and the platform's cache folder.

Kept apart from the core so that the core stays free of ``os``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading

import platformdirs

__all__ = [
    "ENV_CACHE",
    "ENV_SECRET",
    "default_directory",
    "fallback_directory",
    "read",
    "state_directory",
    "warn_no_home",
]

log = logging.getLogger(__name__)
_warned = threading.Event()

#: A backend URL, a comma-separated list of tiers, or ``off``.
ENV_CACHE = "RUNTIME_CACHE"
#: A shared secret; when set, entries are signed and unsigned ones rejected.
ENV_SECRET = "RUNTIME_CACHE_SECRET"


def read(name: str) -> str | None:
    """Return the environment variable ``name``, or ``None`` when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def fallback_directory(kind: str) -> str:
    """Where ``kind`` (``"cache"`` or ``"state"``) goes when the home folder is unusable:
    ``<temporary folder>/runtime-cache-<uid>-<kind>``, private to this user."""
    getuid = getattr(os, "getuid", None)
    user = getuid() if getuid is not None else os.getpid()
    return os.path.join(tempfile.gettempdir(), f"runtime-cache-{user}-{kind}")


def warn_no_home(reason: str) -> None:
    """Warn, once per process, that the home folder is unusable and temporary folders serve."""
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "runtime-cache: no usable home folder (%s); using private folders %s-* instead "
            "(set RUNTIME_CACHE to choose the cache)",
            reason,
            fallback_directory("")[:-1],
        )


def default_directory() -> str:
    """The embedded default cache folder: ``platformdirs.user_cache_dir("runtime-cache")``,
    or :func:`fallback_directory` when there is no home folder (no ``HOME``, no passwd entry)."""
    try:
        return platformdirs.user_cache_dir("runtime-cache", appauthor=False)
    except RuntimeError as exc:  # no HOME and no passwd entry
        warn_no_home(str(exc))
        return fallback_directory("cache")


def state_directory() -> str:
    """The folder for state such as the OpenCL crash guard's:
    ``platformdirs.user_state_dir("runtime-cache")``, or :func:`fallback_directory`
    (with :func:`warn_no_home`) when there is no home folder."""
    try:
        return platformdirs.user_state_dir("runtime-cache", appauthor=False)
    except RuntimeError as exc:
        warn_no_home(str(exc))
        return fallback_directory("state")
