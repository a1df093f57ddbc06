"""A module's pre-compiled programs: pack the built ones, and load a bundle's.

:meth:`OpenCLModule.get_precompiled_programs
<runtime_cache.opencl.OpenCLModule.get_precompiled_programs>` packs with
:func:`pack_built`; :meth:`~runtime_cache.opencl.OpenCLModule.set_precompiled_programs`
decodes a bundle (:mod:`.bundle`), and :func:`load_bundle` matches its entries to the
module's plans, vets the unsigned ones in a child, loads and stores them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..bundles import LoadResult
from ..cache import Cache
from ..codec import Entry, SecretKeys
from ..errors import CorruptEntryError
from ..keys import CacheKey
from ._driver import import_pyopencl, read_binaries
from .build_inputs import unkeyed
from .bundle import pack_programs
from .cached_load import Claim, held
from .capture import remember
from .counters import counters
from .guard import Binary, binary_digest, guard
from .plan import ProgramPlan
from .program import load_from_binaries, store_binaries
from .vetting import Item, vet_unknown

__all__ = ["load_bundle", "match_programs", "pack_built"]

log = logging.getLogger(__name__)


def _verifies(cache: Cache, key: str, blob: bytes) -> bool:
    """Whether ``blob`` passes ``cache``'s entry check, signature included."""
    try:
        cache.check(key, blob)
    except CorruptEntryError:  # SignatureError included
        return False
    return True


def match_programs(
    entries: Sequence[tuple[Entry, bytes]],
    cache: Cache,
    plans: Mapping[str, ProgramPlan],
    refused: list[str] | None = None,
) -> dict[str, tuple[list[bytes], float, bool]]:
    """The programs of ``plans`` that a bundle's ``entries`` supply for every device.

    Returns ``{name: (binaries in device order, build seconds, signed)}``; ``signed``
    when the cache has a secret and it verified every one of the program's entries.
    Entries no plan expects (another device, options or source) are ignored. With a
    secret, an expected entry it does not verify is refused (its key goes into
    ``refused``): a signed cache never takes, and so never signs, what it did not sign.
    """
    expected: dict[str, tuple[str, int]] = {}
    for name, plan in plans.items():
        for index, key in enumerate(plan.keys or ()):
            expected[str(key)] = (name, index)
    chosen: dict[str, dict[int, tuple[bytes, float, bool]]] = {}
    for entry, blob in entries:
        slot = expected.get(entry.key)
        if slot is not None:
            signed = cache.signed and _verifies(cache, entry.key, blob)
            if cache.signed and not signed:
                if refused is not None:
                    refused.append(entry.key)
                continue
            chosen.setdefault(slot[0], {})[slot[1]] = (entry.value, entry.build_seconds, signed)
    complete: dict[str, tuple[list[bytes], float, bool]] = {}
    for name, by_index in chosen.items():
        plan = plans[name]
        assert plan.keys is not None
        if len(by_index) == len(plan.keys):
            complete[name] = (
                [by_index[i][0] for i in range(len(plan.keys))],
                max(s for _, s, _ in by_index.values()),
                all(signed for _, _, signed in by_index.values()),
            )
    return complete


def load_bundle(
    context: Any,
    cache: Cache,
    entries: Sequence[tuple[Entry, bytes]],
    plans: Mapping[str, ProgramPlan],
    adopt: Callable[[str, Any, float], None],
    claim: Claim | None = None,
) -> LoadResult:
    """Load the programs of ``plans`` that ``entries`` supply; ``adopt(name, program, seconds)``
    takes each one loaded. See :meth:`OpenCLModule.set_precompiled_programs
    <runtime_cache.opencl.OpenCLModule.set_precompiled_programs>` for the rules. With
    ``claim``, each program's name is held while it is loaded, and one built meanwhile (by
    ``program()`` or ``build_all()`` on another thread) is left as it is, not supplied.
    """
    refused: list[str] = []
    complete = match_programs(entries, cache, plans, refused)
    if refused:
        log.warning(
            "runtime-cache: %d bundled entries failed the cache's check (not signed with its "
            "secret, or over its limits); refused",
            len(refused),
        )
    # A bundle is outside data: unless our secret signed it, each program is tried in a
    # child first, so a binary that crashes the driver never reaches this process.
    # Signed ones are tried too where a process died loading them (suspects: see .guard).
    skip: set[str] = set()
    for trusted in (False, True):
        names = [name for name, (_, _, signed) in complete.items() if signed == trusted]
        load = vet_unknown(
            list(context.devices),
            [_item(complete[n][0], plans[n]) for n in names],
            trusted=trusted,
            keys=[plans[n].keys for n in names],
        )
        skip.update(n for n, ok in zip(names, load, strict=True) if not ok)
    unsigned = [name for name, (_, _, signed) in complete.items() if not signed]
    accepted = withheld = 0
    for name, (binaries, seconds, signed) in complete.items():
        if name in skip or guard.held_back([binary_digest(b) for b in binaries]):
            continue  # could not vet here, or held back by the crash guard: built later
        plan = plans[name]
        with held(claim, name) as needed:
            if not needed:
                continue  # built meanwhile on another thread: kept, and not supplied here
            program = load_from_binaries(context, plan, binaries)
            if program is None:
                counters.add(rejected_binaries=1)
                log.warning("runtime-cache: the driver rejected bundled binaries of %r", name)
                continue
            counters.add(binary_loads=1)
            if signed or not cache.backend.shared:
                store_binaries(cache, plan, program, binaries, seconds)
            else:  # unsigned: never into a store that others trust
                withheld += 1
            remember(program, plan, cache, binaries, seconds)
            adopt(name, program, seconds)
        accepted += 1
    if withheld:
        log.warning(
            "runtime-cache: %d programs of an unsigned bundle were loaded but not stored "
            "in the shared cache",
            withheld,
        )
    return LoadResult(
        accepted,
        offered=len(entries),
        rejected=len(refused),
        unsigned=sum(1 for n in unsigned if n not in skip),
        withheld=withheld,
    )


def pack_built(
    programs: Mapping[str, Any],
    seconds: Mapping[str, float],
    plan_of: Callable[[str], ProgramPlan],
    secret: SecretKeys | None = None,
) -> bytes:
    """A bundle of the binaries of ``programs`` (by name), with their build ``seconds``;
    signed with ``secret`` when given.

    Programs that cannot be cached (an unresolvable ``#include``), or whose
    binaries the driver does not return for every device, are left out.
    """
    cl = import_pyopencl()
    items: list[tuple[CacheKey, bytes, float]] = []
    for name in sorted(programs):
        plan = plan_of(name)
        if plan.keys is None or programs[name] in unkeyed:
            continue  # (a program built while a header changed: its binary has no key)
        binaries = read_binaries(cl, programs[name], plan.devices)
        if not all(binaries):
            continue
        took = seconds.get(name, 0.0)
        items.extend((k, b, took) for k, b in zip(plan.keys, binaries, strict=True))
    return pack_programs(items, secret=secret)


def _item(binaries: Sequence[Binary], plan: ProgramPlan) -> Item:
    """What a vetting child is given of one program."""
    return (binaries, plan.options, plan.options_text, plan.source)
