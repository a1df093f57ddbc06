"""Batch reads that go on past a key that fails: one unreadable file costs its key only.

A backend whose ``get_many`` reads key by key (``dir://``) builds it with
:func:`read_each`; a reader of such batches that has no error counter of its own
(a tier of a tiered store) takes what was found with :func:`found_so_far`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from .errors import BackendError, PartialReadError

__all__ = ["found_so_far", "read_each"]

log = logging.getLogger(__name__)


def read_each(get: Callable[[str], bytes | None], keys: Iterable[str]) -> dict[str, bytes]:
    """``{key: get(key)}`` of the keys found. A :class:`BackendError` on some keys raises
    :class:`PartialReadError` with what was found; on every key, the first error."""
    found: dict[str, bytes] = {}
    failed: dict[str, BackendError] = {}
    for key in keys:
        try:
            value = get(key)
        except BackendError as exc:
            failed[key] = exc
            continue
        if value is not None:
            found[key] = value
    if failed:
        first = next(iter(failed.values()))
        if not found:
            raise first
        total = len(failed) + len(found)
        raise PartialReadError(f"{len(failed)} of {total} read: {first}", found, frozenset(failed))
    return found


def found_so_far(read: Callable[[], dict[str, bytes]]) -> dict[str, bytes]:
    """``read()``, or what it found when it failed on some keys only (the keys left out are
    then the front's counted misses)."""
    try:
        return read()
    except PartialReadError as exc:
        log.debug("runtime-cache: %s", exc)
        return exc.found
