"""Which drivers' caches travel, and the folders runtime-cache points them at.

:func:`prepare` points each driver whose cache travels (PoCL's kernel cache,
NVIDIA's ComputeCache) at ``<RUNTIME_CACHE_DRIVER_DIR or user cache dir>/<driver>``
before the driver starts; :func:`managed_folder` says whether a driver's folder is that
one now, and :func:`trusted_source` whether a cache may supply files for it.
:mod:`.driver_cache` carries the files.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from .. import environment
from ..cache import Cache
from .driver_files import private_folder

__all__ = [
    "ENV_DIR",
    "ENV_SWITCH",
    "driver_cache_enabled",
    "driver_kind",
    "driver_variables",
    "known_drivers",
    "managed_folder",
    "per_module",
    "prepare",
    "tell_unmanaged",
    "trusted_source",
    "unmanaged_reason",
]

log = logging.getLogger(__name__)

ENV_SWITCH = "RUNTIME_CACHE_DRIVER_CACHE"
ENV_DIR = "RUNTIME_CACHE_DRIVER_DIR"


@dataclass(frozen=True)
class _Driver:
    variable: str  # the driver's folder variable
    switch: tuple[str, str]  # the variable and value that turn its cache on
    per_module: bool  # files can be told apart per module (else one set per device)
    platform: str  # a substring of the OpenCL platform name


_DRIVERS = {
    "pocl": _Driver("POCL_CACHE_DIR", ("POCL_KERNEL_CACHE", "1"), True, "Portable Computing"),
    "nvidia": _Driver("CUDA_CACHE_PATH", ("CUDA_CACHE_DISABLE", "0"), False, "NVIDIA"),
}


def driver_cache_enabled(flag: bool | None = None) -> bool:
    """``flag`` when given, else whether ``RUNTIME_CACHE_DRIVER_CACHE`` says on (1/true/yes/on)."""
    if flag is not None:
        return bool(flag)
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def _root() -> str | None:
    """The folder the drivers' caches go under; ``None`` when none is this user's own (no
    home, and another user made the temporary folder's name first: see prepare)."""
    env = os.environ.get(ENV_DIR, "").strip()
    if env:
        return environment.from_start(os.path.expanduser(env))
    import platformdirs

    try:
        return platformdirs.user_cache_dir("runtime-cache-driver", appauthor=False)
    except RuntimeError as exc:  # no HOME and no passwd entry: one warning, as for the cache
        environment.warn_no_home(str(exc))
    try:
        return environment.private_fallback("driver")  # made 0700, or checked as ours
    except OSError as exc:
        log.warning("runtime-cache: drivers' caches left alone: %s", exc)
        return None


def prepare() -> dict[str, str]:
    """Point each driver at its folder under runtime-cache's root; return ``{driver: folder}``.

    Call it before the driver starts: NVIDIA and PoCL read their variables
    once, when the platform is first listed. A variable already set to a
    folder outside the root is the user's own choice and is left alone (that
    driver's cache is then neither restored nor captured). It also turns the
    drivers' caches on (``POCL_KERNEL_CACHE=1``, ``CUDA_CACHE_DISABLE=0``),
    since there is nothing to carry otherwise.

    Example::

        from runtime_cache.opencl import prepare_driver_cache
        prepare_driver_cache()          # first, before pyopencl lists platforms
        import pyopencl as cl
        ctx = cl.create_some_context()
    """
    root = _root()
    chosen: dict[str, str] = {}
    for kind, driver in _DRIVERS.items():
        if root is None:
            break
        mine = os.path.join(root, kind)
        current = os.environ.get(driver.variable, "").strip()
        if current and os.path.abspath(current) != mine:
            log.debug("runtime-cache: %s is set by the user; its driver cache is left alone", kind)
            continue
        if not private_folder(mine):  # the driver loads native code from it: left alone
            log.warning("runtime-cache: %s is not this user's private folder; not used", mine)
            continue
        os.environ[driver.variable] = mine
        os.environ[driver.switch[0]] = driver.switch[1]
        chosen[kind] = mine
    return chosen


def driver_kind(fingerprint: dict[str, Any]) -> str | None:
    """``"pocl"``, ``"nvidia"``, or ``None`` for a driver whose cache is not carried."""
    name = str(fingerprint.get("platform_name", ""))
    for kind, driver in _DRIVERS.items():
        if driver.platform in name:
            return kind
    return None


def driver_variables(kind: str, folder: str) -> dict[str, str]:
    """The environment that points the driver ``kind`` at ``folder``, with its cache on."""
    driver = _DRIVERS[kind]
    return {driver.variable: folder, driver.switch[0]: driver.switch[1]}


def managed_folder(kind: str) -> str | None:
    """The folder the driver ``kind`` uses, if runtime-cache manages it (else ``None``)."""
    driver = _DRIVERS[kind]
    current = os.environ.get(driver.variable, "").strip()
    root = _root()
    mine = None if root is None else os.path.join(root, kind)
    if mine is None or not current or os.path.abspath(current) != mine:
        return None
    if os.environ.get(driver.switch[0], driver.switch[1]) != driver.switch[1]:
        return None  # the driver's cache is off: it neither reads nor writes the folder
    return mine


def unmanaged_reason(kind: str) -> str:
    """Why the driver ``kind``'s folder is not one runtime-cache manages (for a warning)."""
    driver = _DRIVERS[kind]
    current = os.environ.get(driver.variable, "").strip()
    if not current:
        return (
            f"{driver.variable} is not set: call runtime_cache.opencl.prepare_driver_cache() "
            f"(or set {ENV_SWITCH}=1) before the OpenCL platforms are first listed"
        )
    if os.environ.get(driver.switch[0], driver.switch[1]) != driver.switch[1]:
        return f"the driver's own cache is off ({driver.switch[0]} is not {driver.switch[1]})"
    return f"{driver.variable} names a folder of yours, which runtime-cache never writes"


_told: set[str] = set()


def tell_unmanaged(kind: str) -> None:
    """Say once per process and driver why its cache files do not travel: a module asked
    for them (``driver_cache=True``) and got nothing, silently (an operator review)."""
    if kind in _told:
        return
    _told.add(kind)
    reason = unmanaged_reason(kind)
    unset = not os.environ.get(_DRIVERS[kind].variable, "").strip()
    (log.warning if unset else log.info)(
        "runtime-cache: the %s driver's cache files are not carried: %s", kind, reason
    )


def trusted_source(cache: Cache) -> bool:
    """Whether ``cache`` may supply driver files: it signs entries, or only this user writes it."""
    return cache.signed or bool(getattr(cache.backend, "private", False))


def per_module(kind: str) -> bool:
    """Whether the driver ``kind``'s files can be told apart per module (else one set per
    device)."""
    return _DRIVERS[kind].per_module


def known_drivers() -> list[str]:
    """The drivers whose caches travel, by name."""
    return sorted(_DRIVERS)
