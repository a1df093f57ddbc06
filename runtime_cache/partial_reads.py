"""Batch reads that go on past a key that fails: one unreadable file costs its key only.

A backend whose ``get_many`` reads key by key (``dir://``) builds it with
:func:`read_each`; a reader of such batches that has no error counter of its own
(a tier of a tiered store) takes what was found with :func:`found_so_far`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from .errors import BackendError, PartialReadError

__all__ = ["found_so_far", "read_each"]

log = logging.getLogger(__name__)

#: A value, or its pieces.
T = TypeVar("T", bytes, tuple[bytes, ...])


def read_each(get: Callable[[str], T | None], keys: Iterable[str]) -> dict[str, T]:
    """``{key: get(key)}`` of the keys found (values, or the pieces ``get_parts`` gives). A
    :class:`BackendError` on some keys raises :class:`PartialReadError` with what was found
    (pieces joined); on every key, the first error."""
    found: dict[str, T] = {}
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
        whole = {k: v if isinstance(v, bytes) else b"".join(v) for k, v in found.items()}
        raise PartialReadError(f"{len(failed)} of {total} read: {first}", whole, frozenset(failed))
    return found


def found_so_far(read: Callable[[], dict[str, bytes]]) -> dict[str, bytes]:
    """``read()``, or what it found when it failed on some keys only (the keys left out are
    then the front's counted misses)."""
    try:
        return read()
    except PartialReadError as exc:
        log.debug("runtime-cache: %s", exc)
        return exc.found
