"""Finding the demo's OpenCL device, and building its programs through the cache.

Every program the demo builds goes through :func:`build`, which hands it to
the OpenCL consumer (:func:`runtime_cache.opencl.build_program`), so binaries
are fetched from the cache or built from source and stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..cache import Cache
from ..errors import INSTALL_OPENCL, MissingDependencyError, RuntimeCacheError

__all__ = [
    "INSTALL_HINT",
    "NoDeviceError",
    "build",
    "choose",
    "fingerprint",
    "list_devices",
    "select_device",
]

INSTALL_HINT = INSTALL_OPENCL


class NoDeviceError(RuntimeCacheError):
    """No OpenCL platform or no device that matches the request."""


def _pyopencl() -> Any:
    try:
        import pyopencl
    except ImportError as exc:
        raise MissingDependencyError(
            f"the demo needs pyopencl and an OpenCL driver; install them with: {INSTALL_HINT}"
        ) from exc
    return pyopencl


def list_devices() -> list[Any]:
    """Every OpenCL device of every platform, in platform order.

    Raises :class:`NoDeviceError` naming the install command when there is none.
    """
    cl = _pyopencl()
    try:
        platforms = cl.get_platforms()
    except Exception as exc:  # no ICD loader or no platform: pyopencl raises LogicError
        raise NoDeviceError(
            f"no OpenCL platform found ({exc}); install PoCL, a CPU driver, with: {INSTALL_HINT}"
        ) from None
    devices = [device for platform in platforms for device in platform.get_devices()]
    if not devices:
        raise NoDeviceError(
            f"no OpenCL device found; install PoCL, a CPU driver, with: {INSTALL_HINT}"
        )
    return devices


def choose(spec: str | None = None) -> tuple[Any, int]:
    """The device the demo runs on, and its index over all platforms' devices.

    The OpenCL consumer's one chooser decides (:func:`runtime_cache.opencl.choose_device`):
    ``spec``, else ``PYOPENCL_CTX``, else the first device that can build. Raises
    :class:`~runtime_cache.opencl.NoWorkingDeviceError` with what to install when none can.
    """
    _pyopencl()
    from ..opencl import choose_device

    device = choose_device(spec)
    index = [int(d.int_ptr) for d in list_devices()].index(int(device.int_ptr))
    return device, index


def select_device(spec: str | None = None) -> Any:
    """The device at index ``spec`` (counting over all platforms), or the first whose
    name contains ``spec`` (case-insensitive); the first device when ``spec`` is None.

    No trial build: the demo's runs get the index :func:`choose` found."""
    devices = list_devices()
    if not spec:
        return devices[0]
    if spec.isdigit():
        index = int(spec)
        if index < len(devices):
            return devices[index]
    else:
        for device in devices:
            if spec.lower() in str(device.name).lower():
                return device
    names = ", ".join(f"{i}: {str(d.name).strip()}" for i, d in enumerate(devices))
    raise NoDeviceError(f"no OpenCL device matches {spec!r}; the devices are {names}")


def fingerprint(device: Any) -> dict[str, Any]:
    """The device's fingerprint for cache keys, as the OpenCL consumer computes it."""
    from ..opencl import device_fingerprint

    return device_fingerprint(device)


def build(
    context: Any,
    source: str,
    options: Sequence[str] = (),
    *,
    module_id: str,
    cache: Cache,
) -> Any:
    """Return a built ``pyopencl.Program`` for ``source``, from the cache when it can."""
    from ..opencl import build_program

    return build_program(context, source, tuple(options), module_id=module_id, cache=cache)
