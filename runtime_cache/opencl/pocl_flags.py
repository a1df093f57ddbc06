"""Whether PoCL's extra build flags in this process are known: ``POCL_EXTRA_BUILD_FLAGS``.

PoCL adds the variable's options to every build's, and reads it once a process, at its
first build (PoCL 3.1: a build after ``os.environ`` set ``-DV=2.0f`` still multiplied by
1). The key names the variable's value (:func:`.fingerprint.device_fingerprint`), which
is right while the process has not changed it. Once it has (the value differs from the
one the process started with, at the import of :mod:`runtime_cache.opencl` or at a
build), PoCL may hold either value, and :func:`pocl_flags_unknown` says so: such builds
are neither cached nor handed to other processes. This module is imported with the
package, to see the value early.

A process can also set the variable, have PoCL build (PoCL then holds that value), and
take the variable back before runtime-cache looks: all three values then agree, and only
PoCL knows. PoCL says it, though: a program's ``CL_PROGRAM_BUILD_OPTIONS`` is the options
it was given with the extra flags PoCL held added at the end, after a build from source
and after a load from a binary alike. :func:`pocl_took_other_flags` reads them after each
build and load, and a mismatch makes :func:`pocl_flags_unknown` true from then on.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = [
    "VARIABLE",
    "flags_at_import",
    "pocl_flags_unknown",
    "pocl_took_other_flags",
    "values_seen",
]

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
    Once true, true for the rest of the process. Other drivers' devices never ask how the
    process started (a read of ``/proc/self/environ``: 70 µs of a first load)."""
    if not any(_is_pocl(d) for d in devices):
        return False
    if not _changed:
        start = _start_value()
        if os.environ.get(VARIABLE, "").strip() != start or flags_at_import != start:
            _changed.append(True)
    return bool(_changed)


_pocl: dict[int, bool] = {}  # by device handle: whether it is PoCL's


def _is_pocl(device: Any) -> bool:
    handle = getattr(device, "int_ptr", None)
    found = _pocl.get(handle) if isinstance(handle, int) else None
    if found is None:
        found = "pocl" in str(device.platform.version).lower()
        if isinstance(handle, int):
            _pocl[handle] = found
    return found


def pocl_took_other_flags(program: Any, devices: Sequence[Any], options_text: str) -> bool:
    """Whether PoCL built or loaded ``program`` (given ``options_text``) with extra flags
    other than this process's ``POCL_EXTRA_BUILD_FLAGS``, which the keys name: the options
    PoCL reports end in other flags. Then :func:`pocl_flags_unknown` is true from now on.
    ``False`` where PoCL reports options that do not begin with ``options_text`` (it cannot
    tell), and on other drivers."""
    if _changed:
        return pocl_flags_unknown(devices)
    for device in devices:
        if not _is_pocl(device):
            continue
        given, extra = options_text.split(), flags_at_import.split()
        try:
            import pyopencl as cl

            took = str(program.get_build_info(device, cl.program_build_info.OPTIONS)).split()
        except Exception:  # (no options to read: nothing to tell)
            continue
        if took[: len(given)] == given and took[len(given) :] != extra:
            _changed.append(True)
            return True
    return False
