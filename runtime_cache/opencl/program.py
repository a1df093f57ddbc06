"""Build one OpenCL program through the cache: binaries per device, or source as a fallback.

The flow: plan the keys (one per device: module id, source digest, options
as the driver sees them, header digests, device fingerprint), fetch all of
them in one backend call, create the program from the binaries and build it;
on a miss or a rejected binary, build from source and store what the driver
returns. Cache content never raises to the caller: a binary the driver
refuses is evicted, logged, and replaced by a fresh source build.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from ..cache import Cache
from ..key_template import KeyTemplate
from ..keys import make_key, module_id_from_sources
from ..provider import get_cache
from ._driver import (
    create_and_build,
    driver_options_text,
    import_pyopencl,
    kernel_names,
    options_text,
    original_build,
    read_binaries,
)
from .build_inputs import macro_named, settle
from .build_time import names_build_time
from .capture import origins, remember
from .counters import counters
from .fingerprint import device_fingerprint
from .guard import KNOWN, Binary, binary_digest, bindings, guard
from .includes import HeaderReads, Options, include_digests, normalize_options, preprocessor_view
from .kernel_args import argument_kinds
from .plan import ProgramPlan
from .pocl_flags import pocl_flags_unknown, pocl_took_other_flags
from .vetting import screen_binaries, vet_unknown

__all__ = [
    "PURPOSE",
    "RUNTIME",
    "Binary",
    "ProgramPlan",
    "build_program",
    "create_and_build",
    "key_templates",
    "load_cached",
    "load_from_binaries",
    "options_text",
    "original_build",
    "origins",
    "plan_program",
    "read_binaries",
    "remember",
    "source_build",
    "store_binaries",
]

log = logging.getLogger(__name__)

RUNTIME = "opencl"
PURPOSE = "program-binary"


def plan_program(
    context: Any,
    source: str | bytes,
    options: Options = (),
    *,
    devices: Sequence[Any] | None = None,
    module_id: str | None = None,
    program: str | None = None,
    options_text: str | None = None,
    templates: Sequence[KeyTemplate] | None = None,
) -> ProgramPlan:
    """Work out the cache keys of one program, one per device (no cache access).

    ``options_text`` is the driver's option string when the caller already has it
    (a module computes it once for all its programs); ``templates`` are
    :func:`key_templates` of the same module id, option string and devices.
    """
    cl = import_pyopencl()
    tokens = normalize_options(options)
    text = options_text if options_text is not None else driver_options_text(cl, context, tokens)
    devs = list(devices) if devices is not None else list(context.devices)
    data = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    # Splitting the options costs more than the rest of the key: only when a file is read.
    reads = HeaderReads()
    headers = include_digests(data, text, reads)
    if headers is None or pocl_flags_unknown(devs) or _options_name_build_time(text):
        return ProgramPlan(source, tokens, text, devs, None)
    read = headers or None
    folder, stamps = (reads.root, reads.stamps) if read else (None, None)
    mark = reads.source_mark  # (the scan's digest of the source, where it took one)
    source_digest = f"{mark:032x}" if mark is not None else xxhash.xxh3_128_hexdigest(data)
    extra: dict[str, Any] = {"options": text, "source": source_digest}
    if headers:
        extra["includes"] = headers
    if program is not None:
        extra["program"] = program
    if templates is not None and len(templates) == len(devs):
        del extra["options"]  # a template's own
        keys = [t.key(**extra) for t in templates]
        return ProgramPlan(source, tokens, text, devs, keys, read, folder, stamps)
    mid = module_id or module_id_from_sources(data, name="program")
    keys = [
        make_key(
            module_id=mid,
            runtime=RUNTIME,
            purpose=PURPOSE,
            device=device_fingerprint(dev),
            **extra,
        )
        for dev in devs
    ]
    return ProgramPlan(source, tokens, text, devs, keys, read, folder, stamps)


def _options_name_build_time(text: str) -> bool:
    """Whether the options (PoCL's extra flags too) define a macro as the build's time
    (``-DWHEN=__TIME__``): each build differs."""
    extra = os.environ.get("POCL_EXTRA_BUILD_FLAGS", "")
    return "__" in text + extra and names_build_time(f"{text} {extra}".encode())


def key_templates(devices: Sequence[Any], module_id: str, options_text: str) -> list[KeyTemplate]:
    """The key template of each device's programs of one module, built with one option
    string: ``plan_program(..., templates=)`` then makes the same keys faster."""
    return [
        KeyTemplate(
            module_id=module_id,
            runtime=RUNTIME,
            purpose=PURPOSE,
            device=device_fingerprint(dev),
            options=options_text,
        )
        for dev in devices
    ]


def evict(
    cache: Cache, plan: ProgramPlan, reason: str, binaries: Sequence[Binary] | None = None
) -> None:
    """Delete a program's entries that the driver refused, with one warning.

    With the refused ``binaries`` (one per key), each entry is deleted only
    while it still holds that binary: one that another process stored since
    this one read it is kept (compare-and-delete).
    """
    assert plan.keys is not None
    if pocl_flags_unknown(plan.devices):  # (refused for PoCL's flags here: kept for others)
        return
    counters.add(rejected_binaries=1)
    log.warning(
        "runtime-cache: cached binaries %s rejected (%s); evicting them and building from source",
        ", ".join(str(k) for k in plan.keys),
        reason,
    )
    if binaries is None or len(binaries) != len(plan.keys):
        for key in plan.keys:
            cache.delete(key)
        return
    for key, binary in zip(plan.keys, binaries, strict=True):
        cache.delete_if_holds(key, bytes(binary))


def load_from_binaries(
    context: Any,
    plan: ProgramPlan,
    binaries: Sequence[Binary],
    digests: Sequence[str] | None = None,
    *,
    known: bool = False,
) -> Any | None:
    """Create and build a program from ``binaries``; ``None`` when the driver refuses them.

    ``digests`` are the binaries' :func:`binary_digest`, when the caller has them.
    ``known``: the caller found them known under these keys
    (:meth:`~runtime_cache.opencl.guard.LoadGuard.standing`), so a load records
    nothing new (the blocklist is still asked: it may have grown since).
    """
    cl = import_pyopencl()
    if len(binaries) != len(plan.devices) or not all(binaries):
        return None
    if digests is None:
        digests = [binary_digest(b) for b in binaries]
    if guard.blocked(digests) or guard.held_back(digests):
        log.debug("runtime-cache: binary blocklisted (or held back) by the crash guard")
        return None
    try:
        with guard.loading(digests):  # a driver crash here is remembered by the next process
            program = create_and_build(
                cl, context, plan.devices, binaries, plan.options, plan.options_text
            )
    except Exception as exc:  # any driver refusal is a miss, never the caller's error
        log.debug("runtime-cache: binary load failed: %s", exc)
        return None
    if pocl_took_other_flags(program, plan.devices, plan.options_text):
        return None  # PoCL holds other extra flags than the key names: built here instead
    # pyopencl's Kernel() reads its program's ``_source``; without it, Program.__getattr__
    # tries to make a kernel named "_source" in the driver (20-30 µs a kernel on CPU
    # drivers). Ours carries its source, as a program built from source does.
    program._source = plan.source
    if not known:  # loaded without harm: known from now on under these keys
        guard.vouch(bindings(plan.keys, digests))
    return program


def fetch(
    context: Any,
    plan: ProgramPlan,
    cache: Cache,
    found: Mapping[str, Binary],
    *,
    vet: bool = True,
    digests: list[str] | None = None,
    standing: str | None = None,
) -> Any | None:
    """Return the program built from the binaries in ``found``, or ``None`` (evicting bad ones).

    ``vet=False`` when the caller has already vetted ``found`` as a batch; ``digests``
    are the binaries' :func:`binary_digest` in the order of ``plan.keys``, and
    ``standing`` their standing with the crash guard when they were read, when the
    caller has them (only ``KNOWN`` is taken as it is: a known binary stays known).
    """
    if plan.keys is None:
        return None
    binaries = [found.get(str(key)) for key in plan.keys]
    if any(b is None for b in binaries):
        return None
    ready = [b for b in binaries if b is not None]
    if digests is None or len(digests) != len(ready):
        digests = [binary_digest(b) for b in ready]
    signed = cache.signed
    unknown, standing = screen_binaries(digests, trusted=signed, keys=plan.keys, standing=standing)
    if vet and unknown:  # tried in a child first
        item = (ready, plan.options, plan.options_text, plan.source)
        if not vet_unknown(plan.devices, [item], trusted=signed, keys=[plan.keys])[0]:
            return None  # could not vet here: a local miss, nothing evicted
    return load_cached(context, plan, cache, ready, digests, known=standing == KNOWN)


#: Preprocessor work that may change which kernels a source compiles to (in the text as
#: the preprocessor reads it: :func:`~.includes.preprocessor_view`).
_SHAPED = re.compile(rb"^\s*#\s*(?:if|ifdef|ifndef|elif|define)\b|##", re.MULTILINE)


def holds_its_kernels(
    cache: Cache, plan: ProgramPlan, program: Any, found: Mapping[str, Binary] | None = None
) -> bool:
    """Whether ``program``, loaded from cached binaries, holds every kernel that its source
    declares plainly; when it lacks one (another program's binary under this key, in a
    store nothing signs), its entries are evicted (those still holding the binaries in
    ``found``, the entries it was loaded from) and ``False`` returned. ``True`` when the
    source (one the preprocessor shapes, or whose kernel is named by a macro of a ``-D``
    option or a header) or the driver cannot tell. (``OpenCLModule`` checks the kernel it
    is asked for.)
    """
    source = plan.source if isinstance(plan.source, str) else plan.source.decode("utf-8", "replace")
    declared = argument_kinds(source)
    names = kernel_names(program) if declared else None
    if names is None or set(declared) <= set(names):
        return True
    # A mismatch: unless the preprocessor shapes the kernels (#if, #define, ##: the kernels
    # compiled are not the ones written) or a macro names one, another program's binary.
    data = plan.source.encode("utf-8") if isinstance(plan.source, str) else plan.source
    if _SHAPED.search(preprocessor_view(bytes(data))) or macro_named(list(declared), plan):
        return True
    keys = plan.keys or []
    binaries = [found.get(str(k)) for k in keys] if found is not None else []
    evict(
        cache,
        plan,
        "the program lacks a kernel its source declares",
        [b for b in binaries if b is not None] if all(b is not None for b in binaries) else None,
    )
    return False


def load_cached(
    context: Any,
    plan: ProgramPlan,
    cache: Cache,
    binaries: Sequence[Binary],
    digests: Sequence[str] | None = None,
    *,
    known: bool = False,
) -> Any | None:
    """Load a program from binaries fetched from ``cache``; evict them if the driver refuses.

    Returns the program, or ``None`` after evicting the entries (build from source then).
    ``known``: as :func:`load_from_binaries` takes it.
    """
    if digests is None:
        digests = [binary_digest(b) for b in binaries]
    program = load_from_binaries(context, plan, binaries, digests, known=known)
    if program is None:
        # Held back (a suspect not vetted here, or struck; found so meanwhile too): a
        # local miss, nothing evicted.
        if not guard.held_back(digests):
            evict(cache, plan, "clCreateProgramWithBinary or clBuildProgram failed", binaries)
        return None
    counters.add(binary_loads=1)
    remember(program, plan, cache, binaries, 0.0, digests)
    return program


def source_build(context: Any, plan: ProgramPlan) -> tuple[Any, float]:
    """Build from source with pyopencl's own error handling; return ``(program, seconds)``.

    A build failure raises pyopencl's own error, with the build log.
    """
    cl = import_pyopencl()
    started = time.perf_counter()
    program = cl.Program(context, plan.source)
    original_build(cl)(program, plan.options, plan.devices, cache_dir=False)
    counters.add(source_builds=1)
    pocl_took_other_flags(program, plan.devices, plan.options_text)  # (then stored nowhere)
    return program, time.perf_counter() - started


def store_binaries(
    cache: Cache,
    plan: ProgramPlan,
    program: Any,
    binaries: Sequence[bytes],
    seconds: float,
    made: Any = None,
) -> bool:
    """Store one program's binaries (one entry per device) in one backend call; ``program``
    (``None``: none) is noted for :func:`.recapture_binaries` (while it still holds
    ``made``, when given: see :func:`.capture.remember`)."""
    if plan.keys is None or pocl_flags_unknown(plan.devices):
        return False
    if len(binaries) != len(plan.keys) or not all(binaries):
        log.debug("runtime-cache: the driver returned no binary for some device; not storing")
        return False
    if plan.includes and settle(plan, program).keys is None:  # (callers settle it first)
        return False
    # The driver made or accepted these bytes, so they are no longer suspect (a build from
    # source can give the same bytes as a binary blocklisted after an unrelated crash).
    digests = [binary_digest(b) for b in binaries]
    guard.unblock(digests)
    guard.vouch(bindings(plan.keys, digests))
    if program is not None:
        remember(program, plan, cache, binaries, seconds, digests, made)
    return cache.put_many(dict(zip(plan.keys, binaries, strict=True)), build_seconds=seconds)


def build_program(
    context: Any,
    source: str | bytes,
    options: Options = (),
    *,
    devices: Sequence[Any] | None = None,
    module_id: str | None = None,
    cache: Cache | None = None,
) -> Any:
    """Return a built ``pyopencl.Program``, from cached binaries when possible.

    On a hit, the program is created from the cached binaries (one entry per
    device) and built. On a miss, it is built from source, and the binaries
    the driver returns are stored with the build time. A cached binary that
    the driver rejects is evicted and rebuilt from source, with a warning;
    cache content never raises. Build errors in the source raise pyopencl's
    own error with the build log.

    Example::

        import pyopencl as cl
        from runtime_cache.opencl import build_program
        ctx = cl.create_some_context()
        prg = build_program(ctx, "kernel void twice(global float *a)"
                                 "{ a[get_global_id(0)] *= 2; }")
        prg.twice
    """
    cl = import_pyopencl()
    store = cache if cache is not None else get_cache()
    plan = plan_program(context, source, options, devices=devices, module_id=module_id)
    if plan.keys is None:
        counters.add(uncacheable=1)
    else:
        found = store.get_many_views(plan.keys)
        program = fetch(context, plan, store, found)
        if program is not None and holds_its_kernels(store, plan, program, found):
            return program
    program, seconds = source_build(context, plan)
    plan = settle(plan, program)
    if plan.keys is not None:
        store_binaries(store, plan, program, read_binaries(cl, program, plan.devices), seconds)
    return program
