"""Bundles: many entries in one blob (``Cache.dumps``), screened one by one when loaded.

Every entry of a bundle passes :func:`runtime_cache.check.check_entry`, as an
entry read from storage does. What a load did is a :class:`LoadResult`: an
``int`` (the entries accepted, as before) that also says how many came
unsigned, and how many were kept out of a shared store for that reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .check import check_entry
from .codec import Limits, SecretKeys
from .errors import CorruptEntryError, RejectedEntryError

__all__ = ["LoadResult", "Screened", "good_blobs", "screen_bundle"]


class LoadResult(int):
    """How many entries (or programs) a bundle load accepted, with what else happened.

    It is an ``int``, so ``cache.loads(data) == 3`` keeps working. The extra
    attributes:

    * ``offered``: entries in the bundle;
    * ``rejected`` and ``corrupt``: entries refused by the entry check;
    * ``unsigned``: accepted entries that no secret of this cache verified;
    * ``withheld``: unsigned entries not written because the store is shared
      (others would trust them): they were used, or reported, but not stored.
    """

    offered: int
    rejected: int
    corrupt: int
    unsigned: int
    withheld: int

    def __new__(
        cls,
        accepted: int,
        *,
        offered: int = 0,
        rejected: int = 0,
        corrupt: int = 0,
        unsigned: int = 0,
        withheld: int = 0,
    ) -> LoadResult:
        result = super().__new__(cls, accepted)
        result.offered = offered
        result.rejected = rejected
        result.corrupt = corrupt
        result.unsigned = unsigned
        result.withheld = withheld
        return result

    @property
    def accepted(self) -> int:
        """The entries accepted (the ``int`` value itself)."""
        return int(self)

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for ``--json`` output)."""
        return {
            "accepted": int(self),
            "offered": self.offered,
            "rejected": self.rejected,
            "corrupt": self.corrupt,
            "unsigned": self.unsigned,
            "withheld": self.withheld,
        }


@dataclass
class Screened:
    """The entries of a bundle that passed the check, by key, and the counts of the others."""

    accepted: dict[str, bytes] = field(default_factory=dict)
    rejected: int = 0
    corrupt: int = 0
    unsigned: int = 0


def screen_bundle(blobs: list[bytes], secret: SecretKeys | None, limits: Limits) -> Screened:
    """Keep the bundle entries that pass :func:`~runtime_cache.check.check_entry`.

    An entry counts as unsigned unless ``secret`` verified it.
    """
    screened = Screened()
    for blob in blobs:
        try:
            checked = check_entry(None, blob, secret=secret, limits=limits)
        except RejectedEntryError:
            screened.rejected += 1
            continue
        except CorruptEntryError:  # a newer format too: nothing here can use it
            screened.corrupt += 1
            continue
        if secret is None:
            screened.unsigned += 1
        screened.accepted[checked.key] = blob
    return screened


def good_blobs(
    wanted: Iterable[str], stored: Mapping[str, bytes], check: Callable[[str, bytes], object]
) -> list[bytes]:
    """The stored blobs of ``wanted`` keys that pass ``check(skey, blob)``, in order."""
    found: list[bytes] = []
    for skey in wanted:
        blob = stored.get(skey)
        if blob is None:
            continue
        try:
            check(skey, blob)
        except CorruptEntryError:
            continue
        found.append(blob)
    return found
