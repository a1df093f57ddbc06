"""When :mod:`.write_behind` stores: its three delays, read from the environment.

* ``RUNTIME_CACHE_OPENCL_STORE_DELAY`` (default 1 s): how long the caller's builds
  must be quiet before ``install(store="background")`` reads a program back.
* ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS`` (default 10 s; ``0`` or ``off``: never): how
  long they must be quiet before the deferred programs are handed to a detached store
  (:mod:`.detached_store`), so that a service stopped by ``SIGTERM`` (which runs no
  exit handler) has them stored all the same.
* ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS`` (default 60 s): the bound on the flush at exit.
"""

from __future__ import annotations

import logging
import os

__all__ = [
    "ENV_FLUSH_SECONDS",
    "ENV_IDLE_SECONDS",
    "ENV_STORE_DELAY",
    "flush_seconds",
    "idle_seconds",
    "store_delay",
]

log = logging.getLogger(__name__)

ENV_FLUSH_SECONDS = "RUNTIME_CACHE_OPENCL_FLUSH_SECONDS"
ENV_STORE_DELAY = "RUNTIME_CACHE_OPENCL_STORE_DELAY"
ENV_IDLE_SECONDS = "RUNTIME_CACHE_OPENCL_IDLE_SECONDS"
_DEFAULT_FLUSH_SECONDS = 60.0
_DEFAULT_STORE_DELAY = 1.0
#: Long enough that a pause in an app's work (a test run's, a benchmark's) seldom starts
#: a detached store (a process that builds the programs again, at nice 10) beside it.
_DEFAULT_IDLE_SECONDS = 10.0
_OFF = frozenset({"0", "off", "never", "no"})


def _seconds(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        log.warning("runtime-cache: %s=%r is not a number; using %s", name, text, default)
        return default
    return max(0.0, value)


def flush_seconds() -> float:
    """The bound on the flush at exit, from ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS``."""
    return _seconds(ENV_FLUSH_SECONDS, _DEFAULT_FLUSH_SECONDS)


def store_delay() -> float:
    """How long the caller's builds must be quiet before a store, from
    ``RUNTIME_CACHE_OPENCL_STORE_DELAY``."""
    return _seconds(ENV_STORE_DELAY, _DEFAULT_STORE_DELAY)


def idle_seconds() -> float | None:
    """How long the caller's builds must be quiet before the deferred programs are handed
    off, from ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS``; ``None``: never (``0`` or ``off``)."""
    if os.environ.get(ENV_IDLE_SECONDS, "").strip().lower() in _OFF:
        return None
    return _seconds(ENV_IDLE_SECONDS, _DEFAULT_IDLE_SECONDS) or None
