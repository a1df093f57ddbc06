"""The one place that chooses an OpenCL device: the first one that can actually build.

A driver can list a device that cannot compile anything: pip's PoCL 3.0
(LLVM 14) names a CPU newer than it knows "generic" and fails every build
with ``unknown target CPU 'generic'``. So :func:`choose_device`:

1. takes an explicit choice (``spec``), else ``PYOPENCL_CTX``, as pyopencl
   reads it: ``"P"`` or ``"P:D"``, each an index or part of a name;
2. otherwise tries a tiny build on each device, in platform order, once per
   process, and takes the first that builds.

A chosen device that cannot build is never returned: when none can,
:class:`NoWorkingDeviceError` says, for each platform tried, its one-line
error, and what to install.

>>> from runtime_cache.opencl.devices import choose_device
>>> device = choose_device()          # doctest: +SKIP
>>> ctx = pyopencl.Context([device])  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import INSTALL_INTEL, RuntimeCacheError
from ..fork_locks import renew_in_child
from ._driver import import_pyopencl, original_build

__all__ = [
    "INSTALL_ADVICE",
    "DeviceTrial",
    "NoWorkingDeviceError",
    "choose_device",
    "driver_label",
    "try_devices",
]

ENV_CTX = "PYOPENCL_CTX"

INSTALL_ADVICE = (
    "install an OpenCL driver that can build for this machine: on Debian or Ubuntu "
    "`apt-get install pocl-opencl-icd`; Intel's CPU runtime with "
    f"`{INSTALL_INTEL}`; or your GPU vendor's driver"
)

_PROBE = "__kernel void runtime_cache_probe(__global float *a) { a[get_global_id(0)] += 1.0f; }"


class NoWorkingDeviceError(RuntimeCacheError):
    """No OpenCL device can build a program (or none matches the choice asked for)."""


@dataclass(frozen=True)
class DeviceTrial:
    """One device and the outcome of a tiny build on it."""

    index: int
    device: Any
    platform: str
    error: str | None

    @property
    def works(self) -> bool:
        """Whether the tiny build succeeded."""
        return self.error is None


_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_lock")  # (held at a fork: free in the child)
_trials: dict[int, str | None] = {}


def driver_label(platform: Any) -> str:
    """A short name that tells drivers apart, e.g. ``"PoCL 3.1+debian"``, ``"Intel(R) OpenCL 3.1"``.

    Debian's PoCL and pip's both call their platform "Portable Computing
    Language"; their version strings differ.
    """
    name = str(platform.name).strip()
    version = str(platform.version).strip()
    if name == "Portable Computing Language":
        words = version.split()
        at = words.index("PoCL") if "PoCL" in words else -1
        return f"PoCL {words[at + 1]}" if 0 <= at < len(words) - 1 else f"PoCL ({version})"
    words = version.split()
    number = words[1] if len(words) > 1 and words[0] == "OpenCL" else version
    return f"{name} {number}"


def _one_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    text = (errors or lines or [type(exc).__name__])[0]
    return text if len(text) <= 200 else text[:197] + "..."


def _probe(cl: Any, device: Any) -> str | None:
    """``None`` when a tiny program builds on ``device``, else a one-line error."""
    key = int(device.int_ptr)
    with _lock:
        if key in _trials:
            return _trials[key]
    try:
        context = cl.Context([device])
        with warnings.catch_warnings():  # a chatty compiler (Intel's) is not a failure
            warnings.simplefilter("ignore")
            # pyopencl's own build, past install()'s wrapper and its disk cache: a real compile.
            original_build(cl)(cl.Program(context, _PROBE), [], [device], cache_dir=False)
        error = None
    except Exception as exc:  # any driver failure means "cannot build here"
        error = _one_line(exc)
    with _lock:
        _trials[key] = error
    return error


def _platforms(cl: Any) -> list[Any]:
    try:
        return list(cl.get_platforms())
    except Exception as exc:  # no ICD loader, or no platform: pyopencl raises LogicError
        raise NoWorkingDeviceError(
            f"no OpenCL platform found ({_one_line(exc)}); {INSTALL_ADVICE}"
        ) from None


def try_devices(platform_spec: str | None = None, *, first: bool = False) -> list[DeviceTrial]:
    """Every device (of the platforms that match ``platform_spec``), each tried once per
    process with a tiny build; in platform order. ``first`` stops at the first that builds."""
    cl = import_pyopencl()
    trials: list[DeviceTrial] = []
    index = 0
    for p_index, platform in enumerate(_platforms(cl)):
        try:
            devices = list(platform.get_devices())
        except Exception as exc:
            devices, error = [], _one_line(exc)
        else:
            error = "the platform lists no device"
        if not devices:
            trials.append(DeviceTrial(-1, None, driver_label(platform), error))
        for device in devices:
            if platform_spec is None or _matches(platform_spec, p_index, platform):
                trial = DeviceTrial(index, device, driver_label(platform), _probe(cl, device))
                trials.append(trial)
                if first and trial.works:
                    return trials
            index += 1
    return trials


def _matches(spec: str, index: int, item: Any) -> bool:
    spec = spec.strip()
    if spec.isdigit():
        return int(spec) == index
    return spec.lower() in f"{item.name} {getattr(item, 'version', '')}".lower()


def _failure(trials: list[DeviceTrial], what: str) -> NoWorkingDeviceError:
    lines = [f"no OpenCL device {what} can build a program"]
    for trial in trials:
        name = str(trial.device.name).strip() if trial.device is not None else "(no device)"
        lines.append(f"  {trial.platform} / {name}: {trial.error}")
    if not trials:
        lines.append("  (no OpenCL device found)")
    lines.append(INSTALL_ADVICE)
    return NoWorkingDeviceError("\n".join(lines))


def _by_spec(spec: str) -> Any:
    """``spec`` as ``--device`` takes it: an index over all devices, or part of a name."""
    trials = [t for t in try_devices() if t.device is not None]
    spec = spec.strip()
    chosen = [
        t
        for t in trials
        if (t.index == int(spec) if spec.isdigit() else spec.lower() in str(t.device.name).lower())
    ]
    if not chosen:
        raise NoWorkingDeviceError(
            f"no OpenCL device matches {spec!r}; {_listing(trials) or 'there are none'}"
        )
    for trial in chosen:
        if trial.works:
            return trial.device
    others = [t for t in trials if t.works and t not in chosen]
    if others:  # another device works: say so, not "install a driver"
        lines = [f"the OpenCL device matching {spec!r} cannot build a program here"]
        lines += [f"  {t.platform} / {str(t.device.name).strip()}: {t.error}" for t in chosen]
        lines.append(_listing(trials))
        raise NoWorkingDeviceError("\n".join(lines))
    raise _failure(chosen, f"matching {spec!r}")


def _listing(trials: list[DeviceTrial]) -> str:
    """The devices by index, each marked whether it can build."""
    names = [
        f"{t.index}: {str(t.device.name).strip()}" + ("" if t.works else " (cannot build)")
        for t in trials
    ]
    return f"the devices are {', '.join(names)}" if names else ""


def _by_ctx(value: str) -> Any:
    """``PYOPENCL_CTX``: ``"P"`` or ``"P:D"``, each an index or part of a name."""
    platform_spec, _, device_spec = value.partition(":")
    trials = [t for t in try_devices(platform_spec or None) if t.device is not None]
    if device_spec:
        trials = [
            t for position, t in enumerate(trials) if _matches(device_spec, position, t.device)
        ]
    for trial in trials:
        if trial.works:
            return trial.device
    listing = "" if trials else _ctx_listing()
    if listing:  # a choice that names no device here: say which there are, not "install one"
        raise NoWorkingDeviceError(f"no OpenCL device matches {ENV_CTX}={value!r}; {listing}")
    raise _failure(trials, f"chosen by {ENV_CTX}={value!r}")


def _ctx_listing() -> str:
    """The devices as ``PYOPENCL_CTX`` names them: ``platform:device``, with the driver."""
    cl = import_pyopencl()
    names = []
    for p_index, platform in enumerate(_platforms(cl)):
        try:
            devices = list(platform.get_devices())
        except Exception:
            continue
        label = driver_label(platform)
        names += [
            f"{p_index}:{d_index} {label} / {str(device.name).strip()}"
            for d_index, device in enumerate(devices)
        ]
    return f"the devices are {', '.join(names)}" if names else ""


def choose_device(spec: str | None = None) -> Any:
    """The OpenCL device to use: ``spec``, else ``PYOPENCL_CTX``, else the first that builds.

    ``spec`` is an index counted over all platforms' devices, or part of a
    device's name. Raises :class:`NoWorkingDeviceError`, whose message lists
    each device tried with its error and what to install, when the choice
    (or every device) cannot build.
    """
    if spec and spec.strip():
        return _by_spec(spec)
    ctx = os.environ.get(ENV_CTX, "").strip()
    if ctx:
        return _by_ctx(ctx)
    trials = try_devices(first=True)
    if trials and trials[-1].works:
        return trials[-1].device
    raise _failure(trials, "here")
