"""One tier of a :class:`~runtime_cache.backends.tiered.TieredBackend` and its counts."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from runtime_cache.api import Backend
from runtime_cache.errors import BackendError, EntryTooLargeError
from runtime_cache.failure_policy import FailurePolicy

from .write_behind import WriteBehind

__all__ = ["Tier", "TierStats", "raise_if_all_failed"]


@dataclass(frozen=True)
class TierStats:
    """What happened in one tier: errors absorbed, promotions, background writes."""

    backend: str
    remote: bool
    errors: int
    promoted: int
    queued_dropped: int
    queued_written: int
    queued_failed: int


class Tier:
    """A backend in a tiered stack: its failure policy, promotions and write-behind queue.

    Args:
        backend: The tier's store.
        log: Where the policy logs the tier's failures and recoveries.
    """

    def __init__(self, backend: Backend, log: logging.Logger) -> None:
        self.backend = backend
        self.writer: WriteBehind | None = None
        self.promoted = 0
        self.policy = FailurePolicy(
            log, f"tier {backend!r}", "skipping it", recovered_level=logging.INFO
        )

    def stats(self) -> TierStats:
        """This tier's counts now."""
        writer = self.writer
        return TierStats(
            repr(self.backend),
            writer is not None,
            self.policy.errors,
            self.promoted,
            writer.dropped if writer else 0,
            writer.written if writer else 0,
            writer.failed if writer else 0,
        )


def raise_if_all_failed(errors: list[Exception], tried: int) -> None:
    """Raise when each of the ``tried`` tiers failed (``errors``, one each): a value too
    large for every tier is :class:`EntryTooLargeError` (no outage), else
    :class:`BackendError`."""
    if errors and len(errors) == tried:
        sized = [e for e in errors if isinstance(e, EntryTooLargeError)]
        if len(sized) == len(errors):  # no outage: a value too large for every tier
            refused = frozenset().union(*(e.refused for e in sized))
            raise EntryTooLargeError(f"every tier refused it: {errors[-1]}", refused)
        raise BackendError(f"every tier failed; last error: {errors[-1]}") from errors[-1]
