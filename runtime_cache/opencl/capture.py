"""Re-read program binaries after the first launch, and re-store those that changed.

Some drivers (ARM Mali, some Adreno and Intel versions) finish compiling only
when a kernel is created or first enqueued, and only then return the final
code in ``CL_PROGRAM_BINARIES``. Call :func:`recapture_binaries` (or
:meth:`OpenCLModule.recapture_binaries`) once after the first launch of every
kernel; on drivers whose binaries do not change it stores nothing.

The builders note each program they build or load with :func:`remember` (the
program-origins registry), so that it can be found again here.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..cache import Cache
from ..fork_locks import renew_in_child
from ._driver import import_pyopencl, read_binaries
from .counters import counters
from .guard import Binary, binary_digest
from .plan import ProgramPlan

__all__ = ["forget", "origins", "recapture_binaries", "remember"]


@dataclass
class _Origin:
    plan: ProgramPlan
    cache: Cache
    digests: list[str]  # binary_digest of each device's binary
    build_seconds: float


# Programs we built or loaded, so their binaries can be re-read after launch.
origins: weakref.WeakKeyDictionary[Any, _Origin] = weakref.WeakKeyDictionary()
_origins_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_origins_lock")  # (held at a fork: free in the child)


def remember(
    program: Any,
    plan: ProgramPlan,
    cache: Cache,
    binaries: Sequence[Binary],
    build_seconds: float,
    digests: Sequence[str] | None = None,
    made: Any = None,
) -> None:
    """Note where ``program``'s binaries live, for :func:`recapture_binaries`.

    ``digests`` are the binaries' :func:`binary_digest`, when the caller has them.
    ``made``, when given, is the driver's program the binaries came from: nothing is
    noted once ``program`` holds another (built again: :func:`forget`). Looked at under
    the same lock as :func:`forget`, so a store that ran late never notes a program's
    earlier build after its build again forgot it.
    """
    if plan.keys is None:
        return
    known = list(digests) if digests is not None else [binary_digest(b) for b in binaries]
    with _origins_lock:
        if made is not None and (getattr(program, "_prg", None) or program) is not made:
            return
        origins[program] = _Origin(plan, cache, known, build_seconds)


def forget(program: Any) -> None:
    """Drop what :func:`remember` noted of ``program`` (it is being built again)."""
    try:
        with _origins_lock:
            origins.pop(program, None)
    except TypeError:  # not weakly referenceable, so never noted
        pass


def recapture_binaries(program: Any) -> int:
    """Re-read ``program``'s binaries; re-store those that changed; return how many did.

    ``program`` must come from :func:`build_program`, :class:`OpenCLModule` or
    a build routed through :func:`install`; for any other program it returns 0.

    Example::

        prg = build_program(ctx, src)
        prg.my_kernel(queue, (n,), None, buf)   # first launch
        queue.finish()
        recapture_binaries(prg)                 # 0 on PoCL and NVIDIA
    """
    cl = import_pyopencl()
    try:
        with _origins_lock:
            origin = origins.get(program)
    except TypeError:  # not weakly referenceable, so not a program of ours
        return 0
    if origin is None or origin.plan.keys is None:
        return 0
    binaries = read_binaries(cl, program, origin.plan.devices)
    changed = {
        key: binary
        for key, binary, old in zip(origin.plan.keys, binaries, origin.digests, strict=True)
        if binary and binary_digest(binary) != old
    }
    if not changed:
        return 0
    if origin.cache.put_many(changed, build_seconds=origin.build_seconds):
        origin.digests = [binary_digest(b) for b in binaries]
        counters.add(recaptured=len(changed))
        return len(changed)
    return 0
