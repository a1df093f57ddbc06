"""Device fingerprints: what makes an OpenCL program binary specific to one device.

A binary is only ever loaded on a device whose fingerprint equals the one in
its cache key, and a driver update changes the fingerprint (and so the key).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ..fork_locks import renew_in_child
from ._driver import import_pyopencl

__all__ = ["device_fingerprint", "open_devices"]

_memo: dict[int, dict[str, Any]] = {}
_memo_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_memo_lock")  # (held at a fork: free in the child)

# Optional properties: read when the driver has them, left out when it raises. A
# vendor's properties are asked for only when the device reports the extension that
# defines them (elsewhere they raise, which costs 20 us each in a process's first load).
_OPTIONAL = (
    ("opencl_c_version", "opencl_c_version", ""),
    ("il_version", "il_version", ""),
    ("compute_capability_major_nv", "nv_cc_major", "cl_nv_device_attribute_query"),
    ("compute_capability_minor_nv", "nv_cc_minor", "cl_nv_device_attribute_query"),
    ("board_name_amd", "amd_board", "cl_amd_device_attribute_query"),
    ("gfxip_major_amd", "amd_gfxip_major", "cl_amd_device_attribute_query"),
    ("gfxip_minor_amd", "amd_gfxip_minor", "cl_amd_device_attribute_query"),
)


def _read(device: Any) -> dict[str, Any]:
    platform = device.platform
    fingerprint: dict[str, Any] = {
        "platform_vendor": str(platform.vendor),
        "platform_name": str(platform.name),
        "platform_version": str(platform.version),
        "vendor": str(device.vendor),
        "vendor_id": int(device.vendor_id),
        "name": str(device.name),
        "version": str(device.version),
        "driver_version": str(device.driver_version),
        "type": int(device.type),
        "address_bits": int(device.address_bits),
        "endian_little": bool(device.endian_little),
    }
    try:
        extensions = str(device.extensions).split()
    except Exception:  # no extension list: ask for every property
        extensions = [needs for _, _, needs in _OPTIONAL]
    for attribute, name, needs in _OPTIONAL:
        if needs and needs not in extensions:
            continue
        try:
            value = getattr(device, attribute)
        except Exception:  # an optional property the driver lacks raises
            continue
        if isinstance(value, (str, int, bool)):
            fingerprint[name] = value
    return fingerprint


def device_fingerprint(device: Any) -> dict[str, Any]:
    """Return a dict that identifies ``device``'s binary format, for cache keys.

    It holds the platform's vendor, name and version; the device's vendor,
    vendor id, name, version and driver version; its type, address bits and
    byte order; and, where the driver reports them, the OpenCL C and IL
    versions and vendor-specific architecture ids (NVIDIA compute capability,
    AMD gfx ip); on PoCL, ``POCL_EXTRA_BUILD_FLAGS`` where it is set. The result is
    memoized per device handle.

    Example::

        import pyopencl as cl
        from runtime_cache.opencl import device_fingerprint
        fp = device_fingerprint(cl.get_platforms()[0].get_devices()[0])
        fp["driver_version"]
    """
    import_pyopencl()
    handle = int(device.int_ptr)
    with _memo_lock:
        found = _memo.get(handle)
    if found is None:
        found = _read(device)
        with _memo_lock:
            _memo[handle] = found
    # PoCL adds this variable's options to every build's (it can name -D and -I): what it
    # builds then differs. Only where it is set: no key changes else. (PoCL reads it once a
    # process: a process that changed it caches no PoCL build, see pocl_flags.py.)
    extra = os.environ.get("POCL_EXTRA_BUILD_FLAGS", "").strip()
    if extra and "pocl" in found["platform_version"].lower():
        return {**found, "pocl_extra_build_flags": extra}
    return dict(found)


def open_devices(fingerprints: list[dict[str, Any]]) -> tuple[Any, list[Any]] | None:
    """A context on the devices whose fingerprints are ``fingerprints``, and those devices
    in that order; ``None`` when one of them is not here (a child process opening its
    parent's devices)."""
    cl = import_pyopencl()
    available = [d for p in cl.get_platforms() for d in p.get_devices()]
    chosen = []
    for wanted in fingerprints:
        match = next((d for d in available if device_fingerprint(d) == wanted), None)
        if match is None:
            return None
        chosen.append(match)
    return cl.Context(chosen), chosen
