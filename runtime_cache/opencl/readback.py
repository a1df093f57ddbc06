"""Read a program's binaries back from the driver without holding Python's GIL.

pyopencl's ``Program.get_info(BINARIES)`` calls ``clGetProgramInfo`` while it
holds the GIL, and on PoCL that call compiles every kernel of the program
(seconds for a scan). :func:`read_binaries_released` makes the same three
``clGetProgramInfo`` calls through :mod:`ctypes`, which releases the GIL, so
a background thread can read while the caller's Python code runs on. It
calls the ICD loader that pyopencl itself loaded (found in
``/proc/self/maps``), else the system's ``libOpenCL``; ``clGetProgramInfo``
is thread-safe by the OpenCL specification. Where neither can be found, or
a call fails, it falls back to pyopencl's own read: the bytes are the same,
only the GIL is held.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from typing import Any

from ._driver import read_binaries

__all__ = ["read_binaries_released"]

_NUM_DEVICES = 0x1162
_DEVICES = 0x1163
_BINARY_SIZES = 0x1165
_BINARIES = 0x1166
_MAX_BINARY = 1 << 31


@functools.cache
def _get_program_info() -> Any | None:
    """``clGetProgramInfo`` of the loader pyopencl uses, or ``None``."""
    path: str | None = None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                name = line.rsplit(" ", 1)[-1].strip()
                if "/libOpenCL" in name:
                    path = name
                    break
    except OSError:
        path = None
    path = path or ctypes.util.find_library("OpenCL")
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).clGetProgramInfo
    except (OSError, AttributeError):
        return None
    function.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    function.restype = ctypes.c_int32
    return function


def _read_raw(handle: int) -> dict[int, bytes] | None:
    """``{device handle: binary}`` of the program ``handle``; ``None`` if a call fails."""
    info = _get_program_info()
    if info is None:
        return None
    count = ctypes.c_uint32()
    if info(handle, _NUM_DEVICES, ctypes.sizeof(count), ctypes.byref(count), None) != 0:
        return None
    devices = (ctypes.c_void_p * count.value)()
    sizes = (ctypes.c_size_t * count.value)()
    if info(handle, _DEVICES, ctypes.sizeof(devices), devices, None) != 0:
        return None
    if info(handle, _BINARY_SIZES, ctypes.sizeof(sizes), sizes, None) != 0:
        return None
    if any(size > _MAX_BINARY for size in sizes):
        return None
    buffers = [ctypes.create_string_buffer(max(size, 1)) for size in sizes]
    pointers = (ctypes.c_void_p * count.value)(*(ctypes.addressof(b) for b in buffers))
    if info(handle, _BINARIES, ctypes.sizeof(pointers), pointers, None) != 0:
        return None
    return {
        int(device or 0): buffer.raw[:size]
        for device, buffer, size in zip(devices, buffers, sizes, strict=True)
    }


def read_binaries_released(cl: Any, program: Any, devices: Sequence[Any]) -> list[bytes]:
    """``program``'s binaries in the order of ``devices``, read with the GIL released.

    The caller keeps ``program`` alive for the call. Falls back to pyopencl's read.
    """
    raw = getattr(program, "_prg", program)
    handle = getattr(raw, "int_ptr", None)
    found = _read_raw(int(handle)) if isinstance(handle, int) and handle else None
    if found is None:
        return read_binaries(cl, program, devices)
    return [found.get(int(d.int_ptr), b"") for d in devices]
