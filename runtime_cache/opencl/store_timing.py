"""When :mod:`.write_behind` stores: its three delays, read from the environment.

* ``RUNTIME_CACHE_OPENCL_STORE_DELAY`` (default 1 s): how long the caller's builds
  must be quiet before ``install(store="background")`` reads a program back.
* ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS`` (unset, ``0`` or ``off``: never, the default):
  how long they must be quiet before the deferred programs are handed to a detached
  store (:mod:`.detached_store`), so that a service stopped by ``SIGTERM`` (which runs
  no exit handler) has them stored all the same. Off unless set: the detached process
  builds the programs again, and an app that builds at its start and then computes for
  longer than that shared the CPU with it (a 2-core machine: half its kernel launches
  for a minute, in the review of session 41), where the exit's hand-off costs it nothing.
* ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS`` (default 60 s): the bound on the flush at exit.
"""

from __future__ import annotations

import logging
import math
import os
import threading

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
_OFF = frozenset({"", "0", "off", "never", "no"})
_warned: set[tuple[str, str]] = set()  # (each bad setting said once: a thread reads it often)


def _seconds(name: str, default: float) -> float:
    """The setting ``name`` in seconds, ``default`` where unset; a value that is no number,
    negative or not finite is said once and ``default`` taken; one past what a wait can
    take (``threading.TIMEOUT_MAX``), that."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        if (name, text) not in _warned:
            _warned.add((name, text))
            taken = "taken as off" if default == 0 else f"using {default}"
            log.warning("runtime-cache: %s=%r is no number of seconds; %s", name, text, taken)
        return default
    return min(value, threading.TIMEOUT_MAX)


def flush_seconds() -> float:
    """The bound on the flush at exit, from ``RUNTIME_CACHE_OPENCL_FLUSH_SECONDS``."""
    return _seconds(ENV_FLUSH_SECONDS, _DEFAULT_FLUSH_SECONDS)


def store_delay() -> float:
    """How long the caller's builds must be quiet before a store, from
    ``RUNTIME_CACHE_OPENCL_STORE_DELAY``."""
    return _seconds(ENV_STORE_DELAY, _DEFAULT_STORE_DELAY)


def idle_seconds() -> float | None:
    """How long the caller's builds must be quiet before the deferred programs are handed
    off, from ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS``; ``None``: never (unset, ``0``,
    ``off``, or a value that is no number of seconds)."""
    if os.environ.get(ENV_IDLE_SECONDS, "").strip().lower() in _OFF:
        return None
    return _seconds(ENV_IDLE_SECONDS, 0.0) or None
