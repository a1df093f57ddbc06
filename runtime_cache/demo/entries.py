"""The demo's entries in the cache: listed for the report, removed before and after."""

from __future__ import annotations

import sys
from typing import Any

from ..cache import Cache
from ..errors import BackendUnavailableError, RuntimeCacheError
from ..urls import redact

__all__ = ["demo_entries", "remove_entries"]


def demo_entries(cache: Cache, module_id: str) -> list[Any]:
    """The entries of the demo's model (its programs, tuning records, driver files)."""
    return list(cache.entries(runtime="opencl", module_id=module_id))


def remove_entries(cache: Cache, module_id: str, *, before: bool = False) -> int:
    """Remove the demo's entries; how many. What cannot go (a tier down: its entries stay
    there) is said in one line on stderr, and stops nothing: the runs and their figures
    matter more than the tidying. ``before`` the runs, a store that cannot be reached at
    all (:class:`~runtime_cache.errors.BackendUnavailableError`) raises: the runs would
    only miss, and say so late (a dead Redis gave two warnings and an error after 5 s)."""
    removed, failed, listed = 0, [], True
    try:
        for info in demo_entries(cache, module_id):
            try:
                removed += cache.delete(info.key)
            except RuntimeCacheError as exc:
                failed.append(exc)
    except RuntimeCacheError as exc:  # (the listing itself: how many are there is unknown)
        if before and isinstance(exc, BackendUnavailableError):
            raise
        failed.append(exc)
        listed = False
    if failed:
        what = (
            f"{len(failed)} of the demo's entries could not be removed, and stay in the cache"
            if listed
            else "the demo's entries could not be listed, so any there stay in the cache"
        )
        print(
            f"runtime-cache demo: warning: {what} (the first error: {redact(str(failed[0]))})",
            file=sys.stderr,
        )
    return removed
