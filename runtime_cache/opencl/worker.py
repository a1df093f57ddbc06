"""A build worker process: ``python -m runtime_cache.opencl.worker``.

Protocol over stdin/stdout, each message an 8-byte little-endian length and
a msgpack body (plain types only):

* parent -> worker, first: ``[fingerprints]``; worker -> parent: ``true``
  when it opened those devices, else ``false`` (and exits);
* then per job, either a build, ``["build", name, source, options, folder]`` (built in
  ``folder``, where the parent made its keys and relative ``-I`` folders resolve) ->
  ``[name, binaries or nil, seconds, options text, CPU seconds, driver files or nil]``
  (driver files: what the build added to the worker's private driver folder,
  named by ``RUNTIME_CACHE_WORKER_DRIVER_DIR``; see
  :mod:`runtime_cache.opencl.program_files`) (a failed build answers
  ``nil`` binaries; the parent then builds that program itself, so the error
  is pyopencl's own); or a trial load, ``["load", name, binaries, options,
  options text]`` -> ``[name, ok]`` (``ok`` is ``"local"`` when the child could
  not vet for reasons of its own, such as a full disk): create the program from
  the binaries, build it, and launch each kernel once on one work-item with zeroed arguments (see
  :mod:`runtime_cache.opencl.vetting`). A driver
  that crashes on a binary takes the worker down with it, not the parent.

The worker ends at end of input.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .driver_files import WORKER_ENV, capture_build, snapshot
from .wire import read_message, write_message

__all__ = ["LOADED", "main", "read_message", "scratch_usable", "write_message"]

#: What a vetting child says once a binary loaded, before its kernels' trial launches.
LOADED = "loaded"


def _build(context: Any, devices: list[Any], job: list[Any]) -> list[Any]:
    from ._driver import driver_options_text, import_pyopencl, original_build, read_binaries

    cl = import_pyopencl()
    name, source, options, *rest = job
    try:
        if rest and rest[0]:
            os.chdir(rest[0])  # the parent's folder: relative -I folders resolve as there
    except OSError:
        return [name, None, 0.0, "", 0.0, None]  # the parent builds it itself
    # A private driver folder (see .program_files): what one build adds there is its files.
    folder = os.environ.get(WORKER_ENV)
    before = snapshot(folder) if folder else {}
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        program = cl.Program(context, source)
        original_build(cl)(program, options, devices, cache_dir=False)
        binaries = read_binaries(cl, program, devices)
    except Exception:
        return [name, None, 0.0, "", 0.0, None]
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    try:
        files = capture_build(folder, before) if folder else None
    except OSError:
        files = None
    return [name, binaries, seconds, driver_options_text(cl, context, options), cpu, files]


#: Global sizes of the trial launches (the buffer holds 64 items of up to 1 KiB).
_LAUNCH_SIZES = (1, 64)
#: Sizes tried for a by-value argument whose type the binary does not say.
_SCALAR_SIZES = (4, 8, 2, 1, 16, 32, 64, 128, 256)


def _fill_args(cl: Any, kernel: Any, buffer: Any, kinds: list[str] | None) -> bool:
    """Give every argument a harmless value: a zeroed buffer, local memory, or the value 1.

    ``kinds`` are the arguments' kinds as the source declares them
    (:func:`.kernel_args.argument_kinds`). Without them (no source, a kernel made by
    a macro), the first value the driver takes is used: binaries carry no argument
    info, and most drivers check each argument's kind and size. ``False`` when none
    fits (images, samplers): that kernel is created but not launched.
    """
    import numpy as np

    from .kernel_args import BUFFER, LOCAL, VALUE

    if kinds is not None and len(kinds) != kernel.num_args:
        kinds = None  # the source says otherwise than the binary: guess as before
    scalars = [np.array(list((1).to_bytes(size, "little")), np.uint8) for size in _SCALAR_SIZES]
    by_kind = {BUFFER: [buffer], LOCAL: [cl.LocalMemory(1024)], VALUE: scalars}
    for index in range(kernel.num_args):
        if kinds is None:
            candidates = [buffer, cl.LocalMemory(1024), *scalars]
        else:
            candidates = by_kind.get(kinds[index], [])  # an image or a sampler: none
        for value in candidates:
            try:
                kernel.set_arg(index, value)
                break
            except Exception:  # the driver refused this kind or size: try the next
                continue
        else:
            return False
    return True


class LaunchFailed(Exception):
    """A trial launch failed after the binary loaded: the kernel's doing on made-up
    arguments as much as the binary's, so nothing is condemned for it."""


def _trial(
    cl: Any, context: Any, devices: list[Any], job: list[Any], loaded: Callable[[], None]
) -> Any:
    import numpy as np

    from ._driver import create_and_build
    from .kernel_args import argument_kinds

    _, binaries, options, options_text, *rest = job
    kinds = argument_kinds(rest[0]) if rest and isinstance(rest[0], str) else {}
    program = create_and_build(cl, context, devices, binaries, options, options_text)
    kernels = program.all_kernels()
    loaded()  # the parent now knows a crash from here on is a launch's
    # Some drivers (PoCL, Mali) compile a kernel only at its first launch, and may crash
    # there on a bad binary. PoCL compiles a work-group function per local size, with a
    # special case for one work-item: launch each kernel twice, on one work-item and on 64
    # with the local size the driver picks, on a zeroed buffer and scalars of 1 (a count
    # of 0 makes "n - 1" wrap: a good kernel then reads far out of bounds, or loops on).
    zeros = np.zeros(1 << 16, np.uint8)
    flags = cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR
    try:
        buffer = cl.Buffer(context, flags, hostbuf=zeros)
        for device in devices:
            queue = cl.CommandQueue(context, device)
            for kernel in kernels:
                if _fill_args(cl, kernel, buffer, kinds.get(kernel.function_name)):
                    for size in _LAUNCH_SIZES:
                        cl.enqueue_nd_range_kernel(queue, kernel, (size,), None)
            queue.finish()
    except Exception as exc:
        raise LaunchFailed(str(exc)) from exc
    return program, kernels, buffer


#: Programs of trial loads, alive until the process ends (module globals outlive ``main``).
_KEPT: list[Any] = []


#: A program any working compiler builds: the child's own health check.
_PROBE = "kernel void runtime_cache_probe(global int *a) { a[0] = 1; }"


def scratch_usable(folder: str) -> bool:
    """Whether a process can write its scratch files in ``folder`` (space, descriptors)."""
    import tempfile

    try:
        fd, path = tempfile.mkstemp(dir=folder)
        try:
            os.write(fd, bytes(1 << 16))
        finally:
            os.close(fd)
            os.unlink(path)
    except OSError:
        return False
    return True


def _local_trouble(cl: Any, context: Any, devices: list[Any]) -> bool:
    """Whether this child itself cannot work (no scratch space or file descriptors, a
    missing scratch folder), as opposed to the binary being refused."""
    import tempfile

    if not scratch_usable(os.environ.get("POCL_CACHE_DIR") or tempfile.gettempdir()):
        return True
    try:
        from ._driver import original_build

        program = cl.Program(context, _PROBE)
        original_build(cl)(program, [], devices, cache_dir=False)
    except Exception:
        return True
    return False


def _load(
    context: Any, devices: list[Any], job: list[Any], loaded: Callable[[], None]
) -> list[Any]:
    from ._driver import import_pyopencl

    cl = import_pyopencl()
    try:
        # Kept until this process exits, as an app keeps its programs: a driver that
        # trips over the binary only when tearing down (PoCL can abort releasing its
        # LLVM context) does it in this process's exit status.
        _KEPT.append(_trial(cl, context, devices, job, loaded))
    except LaunchFailed:
        # Loaded, and the launches failed: built from source, and set aside on this machine
        # (unless this child itself cannot work, which passes).
        return [job[0], "local" if _local_trouble(cl, context, devices) else "launch"]
    except Exception:
        # "local": this child could not vet (its own setup failed), not a refusal.
        return [job[0], "local" if _local_trouble(cl, context, devices) else False]
    return [job[0], True]


def main() -> int:
    """Serve build jobs from stdin until it closes."""
    from .child import follow_parent

    follow_parent()  # a parent killed mid-job leaves no child running on
    stdin = sys.stdin.buffer
    # Driver chatter must not corrupt the protocol stream: the replies go out on a copy of
    # descriptor 1, and 1 itself goes to stderr (a kernel's printf() writes to descriptor 1
    # from the driver, which Python's sys.stdout never sees).
    sys.stdout.flush()
    stdout = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        from .fingerprint import open_devices

        opened = open_devices(read_message(stdin))
    except EOFError:
        return 0
    write_message(stdout, opened is not None)
    if opened is None:
        return 1
    context, devices = opened
    while True:
        try:
            job = read_message(stdin)
        except EOFError:
            return 0
        kind, rest = job[0], job[1:]
        if kind == "load":
            reply = _load(context, devices, rest, lambda: write_message(stdout, [LOADED]))
        else:
            reply = _build(context, devices, rest)
        write_message(stdout, reply)


if __name__ == "__main__":
    os.environ.setdefault("PYOPENCL_NO_CACHE", "1")
    sys.exit(main())
