"""Thin pyopencl helpers: import it on first use, build, and read binaries.

pyopencl is imported on first use, with an error that names the pip extra
when it is missing. Nothing here touches the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import INSTALL_OPENCL, MissingDependencyError

if TYPE_CHECKING:
    from .guard import Binary
    from .includes import Options

__all__ = [
    "create_and_build",
    "driver_options_text",
    "import_pyopencl",
    "kernel_names",
    "options_text",
    "original_build",
    "read_binaries",
]


def import_pyopencl() -> ModuleType:
    """Return the ``pyopencl`` module, or raise :class:`MissingDependencyError`."""
    try:
        import pyopencl
    except ImportError as exc:
        raise MissingDependencyError(
            f"runtime_cache.opencl needs pyopencl: {INSTALL_OPENCL} ({exc})"
        ) from exc
    return pyopencl


def original_build(cl: Any) -> Callable[..., Any]:
    """pyopencl's own ``Program.build``, also while :func:`install` has wrapped it."""
    build = cl.Program.build
    return getattr(build, "__wrapped__", build)  # type: ignore[no-any-return]


def driver_options_text(cl: Any, context: Any, tokens: list[str]) -> str:
    """The option string the driver gets for ``tokens`` in ``context``.

    The exact option string the driver gets (pyopencl adds its include path,
    PYOPENCL_BUILD_OPTIONS and per-platform flags), so any of those changes the key.
    """
    process = getattr(cl.Program, "_process_build_options", None)
    if process is None:
        return " ".join(tokens)
    options_bytes = process(context, tokens)[0]
    return options_bytes.decode("utf-8", "replace") if isinstance(options_bytes, bytes) else ""


def options_text(context: Any, options: Options = ()) -> str:
    """The option string the driver receives for ``options`` in ``context``."""
    from .includes import normalize_options

    return driver_options_text(import_pyopencl(), context, normalize_options(options))


def create_and_build(
    cl: Any,
    context: Any,
    devices: Sequence[Any],
    binaries: Sequence[Binary],
    options: list[str],
    options_text: str,
) -> Any:
    """``clCreateProgramWithBinary`` + ``clBuildProgram``; raises what the driver raises.

    ``options_text`` is the string pyopencl's ``_process_build_options`` makes of
    ``options``: it goes straight to ``clBuildProgram``, skipping pyopencl's Python
    wrapper, which derives it again and fetches the build logs each time (about
    0.1 ms a program). A pyopencl without these internals gets the public call.
    """
    program = cl.Program(context, list(devices), list(binaries))
    raw = getattr(program, "_prg", None)
    if raw is None or not hasattr(raw, "_build"):
        original_build(cl)(program, options, list(devices))
    else:
        raw._build(options=options_text.encode("utf-8"), devices=list(devices))
    return program


def kernel_names(program: Any) -> list[str] | None:
    """The kernels ``program`` holds (``CL_PROGRAM_KERNEL_NAMES``); ``None`` where the driver
    cannot say."""
    cl = import_pyopencl()
    try:
        names = program.get_info(cl.program_info.KERNEL_NAMES)
    except Exception:  # an OpenCL 1.1 driver, or a program the driver cannot list
        return None
    return [n for n in str(names).split(";") if n] or None  # none listed: can't tell


def read_binaries(cl: Any, program: Any, devices: Sequence[Any]) -> list[bytes]:
    """Return ``program``'s binaries in the order of ``devices``."""
    program_devices = list(program.get_info(cl.program_info.DEVICES))
    binaries = list(program.get_info(cl.program_info.BINARIES))
    by_device = dict(zip((int(d.int_ptr) for d in program_devices), binaries, strict=False))
    return [bytes(by_device.get(int(d.int_ptr), b"")) for d in devices]
