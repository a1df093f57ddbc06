"""Make Intel's CPU OpenCL runtime from PyPI visible to pyopencl, beside the system's drivers.

The ``intel-opencl-rt`` wheel (the ``intel`` extra) installs ``libintelocl.so``
into the environment's ``lib/`` folder, but the ``.icd`` file it ships names
a placeholder path (``/opt/anaconda1anaconda2anaconda3/lib/...``), so the ICD
loader finds nothing. pyopencl's wheel bundles the ocl-icd loader, which
reads ``OCL_ICD_VENDORS``: a folder whose ``.icd`` files each name a driver
library. That folder *replaces* the default ``/etc/OpenCL/vendors`` (this
loader has no variable that adds to it), so :func:`expose_intel_runtime` makes a
folder holding a copy of every system ``.icd`` file plus one with the real path
of ``libintelocl.so``, and points ``OCL_ICD_VENDORS`` at it. Every platform stays
visible (pip's PoCL is found through ``PYOPENCL_HOME``, apart from this folder).

It runs when :mod:`runtime_cache.opencl` is imported, before the loader reads
its platform list (at the first ``get_platforms``), and children inherit the
variable. It does nothing when ``OCL_ICD_VENDORS`` is already set (the user's
choice wins), when the runtime is not installed, or when
``RUNTIME_CACHE_OPENCL_ICD=off``. The folder is
``$TMPDIR/runtime-cache-icd-<uid>-<digest of its contents>``, made once.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from importlib import metadata

__all__ = ["ENV_SWITCH", "expose_intel_runtime", "intel_library"]

log = logging.getLogger(__name__)

ENV_VENDORS = "OCL_ICD_VENDORS"
ENV_SWITCH = "RUNTIME_CACHE_OPENCL_ICD"
_SYSTEM_VENDORS = "/etc/OpenCL/vendors"
_DISTRIBUTION = "intel-opencl-rt"


def intel_library() -> str | None:
    """The absolute path of ``libintelocl.so`` from the installed ``intel-opencl-rt``, if any."""
    try:
        files = metadata.distribution(_DISTRIBUTION).files or []
    except metadata.PackageNotFoundError:
        return None
    for item in files:
        if item.name == "libintelocl.so":
            path = os.path.realpath(str(item.locate()))
            if os.path.isfile(path):
                return path
    return None


def _system_icds() -> dict[str, str]:
    """The system's ``.icd`` files: name -> contents."""
    folder = os.environ.get("OPENCL_VENDOR_PATH", "").strip() or _SYSTEM_VENDORS
    found: dict[str, str] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found
    for name in names:
        if name.endswith(".icd"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    found[name] = handle.read().strip()
            except (OSError, UnicodeDecodeError):
                continue
    return found


def _owned_folder(path: str) -> bool:
    """Whether ``path`` is a real folder of this user that no one else may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _write_folder(icds: dict[str, str]) -> str:
    import xxhash  # here: a process without Intel's runtime never needs it at import

    text = "\n".join(f"{name}={body}" for name, body in sorted(icds.items()))
    digest = xxhash.xxh3_64_hexdigest(text.encode("utf-8"))
    folder = os.path.join(tempfile.gettempdir(), f"runtime-cache-icd-{os.getuid()}-{digest}")
    if _owned_folder(folder):
        return folder
    staging = tempfile.mkdtemp(prefix=".runtime-cache-icd-")
    for name, body in icds.items():
        with open(os.path.join(staging, name), "w", encoding="utf-8") as handle:
            handle.write(body + "\n")
    try:
        os.rename(staging, folder)
    except OSError:
        for name in icds:
            os.unlink(os.path.join(staging, name))
        os.rmdir(staging)
    if not _owned_folder(folder):  # someone else's folder under our name: do not trust it
        raise OSError(f"{folder} is not a private folder of this user")
    return folder


def expose_intel_runtime() -> str | None:
    """Point ``OCL_ICD_VENDORS`` at a folder with the system's drivers and Intel's CPU runtime.

    Returns the folder, or ``None`` when there was nothing to do.
    """
    if os.environ.get(ENV_VENDORS, "").strip():
        return None
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "no", "false"):
        return None
    try:
        library = intel_library()
        if library is None:
            return None
        icds = _system_icds()
        if library in icds.values():
            return None
        icds["runtime-cache-intel-cpu.icd"] = library
        folder = _write_folder(icds)
    except Exception as exc:  # a broken installation must not break importing the package
        log.warning("runtime-cache: cannot expose Intel's OpenCL CPU runtime (%s)", exc)
        return None
    os.environ[ENV_VENDORS] = folder
    return folder
