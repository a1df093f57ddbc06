"""Whether PoCL's extra build flags in this process are known: ``POCL_EXTRA_BUILD_FLAGS``.

PoCL adds the variable's options to every build's, and reads it once a process, at its
first build (PoCL 3.1: a build after ``os.environ`` set ``-DV=2.0f`` still multiplied by
1). The key names the variable's value (:func:`.fingerprint.device_fingerprint`), which
is right while the process has not changed it. Once it has (the value differs from the
one the process started with, at the import of :mod:`runtime_cache.opencl` or at a
build), PoCL may hold either value, and :func:`pocl_flags_unknown` says so: such builds
are neither cached nor handed to other processes. This module is imported with the
package, to see the value early.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = ["VARIABLE", "flags_at_import", "pocl_flags_unknown", "values_seen"]

VARIABLE = "POCL_EXTRA_BUILD_FLAGS"
#: What else PoCL reads once a process: where it writes the source it compiles.
_FOLDERS = ("POCL_CACHE_DIR", "XDG_CACHE_HOME", "HOME")

#: The variables' values when this module was imported.
_at_import = {name: os.environ.get(name) for name in (VARIABLE, *_FOLDERS)}
flags_at_import = (_at_import[VARIABLE] or "").strip()
_started: list[dict[str, str | None]] = []  # their values when the process started
_changed: list[bool] = []  # (set once it differed: what PoCL took is unknown from then on)


def _start() -> dict[str, str | None]:
    if not _started:
        found = dict(_at_import)
        try:  # the environment the process was started with (os.environ changes leave it)
            with open("/proc/self/environ", "rb") as handle:
                start = dict(v.partition(b"=")[::2] for v in handle.read().split(b"\0"))
            for name in found:
                value = start.get(name.encode())
                found[name] = None if value is None else value.decode("utf-8", "surrogateescape")
        except OSError:
            pass  # (no /proc: the values at the import)
        _started.append(found)
    return _started[0]


def _start_value() -> str:
    return (_start()[VARIABLE] or "").strip()


def values_seen(name: str) -> list[str]:
    """The values ``name`` (one of PoCL's folder variables) had when the process started,
    at the import and now, as set (blanks kept, as PoCL keeps them): PoCL took one."""
    seen = (_start().get(name), _at_import.get(name), os.environ.get(name))
    return [value for value in dict.fromkeys(seen) if value is not None]


def pocl_flags_unknown(devices: Sequence[Any]) -> bool:
    """Whether PoCL builds on ``devices`` use extra flags that no key can name: this
    process changed ``POCL_EXTRA_BUILD_FLAGS`` since it started (see the module's notes).
    Once true, true for the rest of the process."""
    if not _changed:
        start = _start_value()
        if os.environ.get(VARIABLE, "").strip() != start or flags_at_import != start:
            _changed.append(True)
    if not _changed:
        return False
    return any("pocl" in str(d.platform.version).lower() for d in devices)
