"""Bundles: many entries in one blob (``Cache.dumps``), screened one by one when loaded.

Every entry of a bundle passes :func:`runtime_cache.check.check_entry`, as an
entry read from storage does. What a load did is a :class:`LoadResult`: an
``int`` (the entries accepted, as before) that also says how many came
unsigned, and how many were kept out of a shared store for that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .api import Backend, reads_ranges
from .check import check_entry
from .codec import Limits, SecretKeys, decode_bundle
from .errors import CorruptEntryError, InvalidKeyError, NewerFormatError, RejectedEntryError
from .existing_entries import good_existing, peek_past_cap
from .listing import OnProgress, OnSkip

__all__ = [
    "CODE_PURPOSES",
    "DUMP_BATCH",
    "DUMP_BATCH_BYTES",
    "LoadResult",
    "Screened",
    "good_blobs",
    "merge_bundle",
    "screen_bundle",
]

log = logging.getLogger(__name__)

#: Entries per backend round trip in ``Cache.dumps`` (and per progress step).
DUMP_BATCH = 256
#: Listed bytes one batch read of an export holds at most (a larger entry is read alone), on
#: a store read in batches: a tiered stack's folder tier reads its files whole, together.
DUMP_BATCH_BYTES = 64 << 20
#: The front's failure policy: ``failed(op, exc)`` counts and logs (or raises, strict).
Failed = Callable[[str, Exception], None]


class LoadResult(int):
    """How many entries (or programs) a bundle load accepted, with what else happened.

    It is an ``int``, so ``cache.loads(data) == 3`` keeps working. The extra
    attributes:

    * ``offered``: entries in the bundle;
    * ``rejected`` and ``corrupt``: entries refused by the entry check;
    * ``newer``: entries in a newer format than this version reads (a newer version of
      runtime-cache made the bundle): left out, and not counted as corrupt;
    * ``unsigned``: accepted entries that no secret of this cache verified;
    * ``withheld``: unsigned entries not written because the store is shared
      (others would trust them) or because they hold native code (see
      :data:`CODE_PURPOSES`): they were used, or reported, but not stored;
    * ``withheld_code``: those of ``withheld`` that hold native code;
    * ``repeated``: entries that passed the check under a key an entry before them in the
      bundle held (the last of them is the one kept);
    * ``unstorable``: accepted entries not written because the store cannot hold their
      key (a ``dir://`` folder refuses a key component that ends in ``.rce``), the others
      written; ``unstorable_errors`` says why, an entry each.
    """

    offered: int
    rejected: int
    corrupt: int
    newer: int
    unsigned: int
    withheld: int
    withheld_code: int
    repeated: int
    unstorable: int
    unstorable_errors: tuple[str, ...]

    def __new__(
        cls,
        accepted: int,
        *,
        offered: int = 0,
        rejected: int = 0,
        corrupt: int = 0,
        newer: int = 0,
        unsigned: int = 0,
        withheld: int = 0,
        withheld_code: int = 0,
        repeated: int = 0,
        unstorable_errors: tuple[str, ...] = (),
    ) -> LoadResult:
        result = super().__new__(cls, accepted)
        result.offered = offered
        result.rejected = rejected
        result.corrupt = corrupt
        result.newer = newer
        result.unsigned = unsigned
        result.withheld = withheld
        result.withheld_code = withheld_code
        result.repeated = repeated
        result.unstorable = len(unstorable_errors)
        result.unstorable_errors = unstorable_errors
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
            "newer": self.newer,
            "unsigned": self.unsigned,
            "withheld": self.withheld,
            "withheld_code": self.withheld_code,
            "repeated": self.repeated,
            "unstorable": self.unstorable,
        }


@dataclass
class Screened:
    """The entries of a bundle that passed the check, by key, and the counts of the others."""

    accepted: dict[str, bytes] = field(default_factory=dict)
    rejected: int = 0
    corrupt: int = 0
    newer: int = 0  # (a newer format: left out, not corrupt)
    unsigned: int = 0
    repeated: int = 0  # (passed, under a key that one before them held)


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
        except NewerFormatError:  # nothing here can use it; a newer version reads it
            screened.newer += 1
            continue
        except CorruptEntryError:
            screened.corrupt += 1
            continue
        if secret is None:
            screened.unsigned += 1
        screened.repeated += checked.key in screened.accepted
        screened.accepted[checked.key] = blob
    return screened


def good_blobs(
    backend: Backend,
    wanted: Sequence[str],
    check: Callable[[str, bytes], object],
    failed: Failed,
    *,
    on_skip: OnSkip | None = None,
    on_progress: OnProgress | None = None,
    sizes: Mapping[str, int] | None = None,
) -> list[bytes]:
    """The stored blobs of ``wanted`` keys that pass ``check(skey, blob)``, in order;
    where ``check`` returns bytes, those instead (a blob it signed).

    Read as a look (exporting is not a use), after each batch of which ``on_progress(done,
    total)`` is told; an entry left out as corrupt is told to ``on_skip(key, reason)``.
    On a store that reads files (``dir://``: :func:`~.api.reads_ranges`), a key at a
    time: a batch read holds the batch's values together, and sparse files planted in a
    shared folder, each claiming a large value, took 640 MB for six of them before their
    checksums failed. Elsewhere :data:`DUMP_BATCH` keys a round trip, and no more than
    :data:`DUMP_BATCH_BYTES` of them by ``sizes`` (the listed sizes: keys from a
    listing), whose keys a batch read left out (a store's cap on a read) are asked again
    (:func:`~.existing_entries.peek_past_cap`).
    """
    found: list[bytes] = []
    done = 0
    for batch in _batches(wanted, sizes):
        done += len(batch)
        for skey, blob in _stored(backend, batch, failed, listed=sizes is not None):
            try:
                checked = check(skey, blob)
            except CorruptEntryError as exc:
                if on_skip is not None:  # rejected: good bytes this cache does not take
                    what = "rejected" if isinstance(exc, RejectedEntryError) else "corrupt"
                    on_skip(skey, f"{what}: {exc}")
                continue
            found.append(checked if isinstance(checked, bytes) else blob)
        if on_progress is not None:
            on_progress(done, len(wanted))
    return found


def _batches(wanted: Sequence[str], sizes: Mapping[str, int] | None) -> Iterator[Sequence[str]]:
    # Runs of DUMP_BATCH keys at most, and of DUMP_BATCH_BYTES listed bytes (one key more).
    start = held = 0
    for end, skey in enumerate(wanted):
        size = sizes.get(skey, 0) if sizes else 0
        if end > start and (end - start >= DUMP_BATCH or held + size > DUMP_BATCH_BYTES):
            yield wanted[start:end]
            start, held = end, 0
        held += size
    if start < len(wanted):
        yield wanted[start:]


def _stored(
    backend: Backend, batch: Sequence[str], failed: Failed, *, listed: bool
) -> Iterator[tuple[str, bytes]]:
    # ``batch``'s stored blobs, in order: a key at a time where reads cost no round trip.
    if reads_ranges(backend):
        for skey in batch:
            try:
                blob = backend.peek(skey)
            except Exception as exc:
                failed("get", exc)
                continue
            if blob is not None:
                yield skey, blob
        return
    stored: dict[str, bytes] = {}
    try:  # (listed keys a capped batch read left out are asked again: Redis's cap)
        for got in peek_past_cap(backend, batch, again=listed):
            stored.update(got)
    except Exception as exc:
        failed("get_many", exc)
    yield from ((skey, stored[skey]) for skey in batch if skey in stored)


#: Purposes whose values a consumer runs as native code with no check of its own (the
#: OpenCL driver-cache carrier's files, ``runtime_cache.opencl.driver_cache.PURPOSE``):
#: a bundle brings them only signed, whatever store it is loaded into.
CODE_PURPOSES = frozenset({"driver-cache"})


def _purpose(skey: str) -> str:
    parts = skey.split("/")
    return parts[1] if len(parts) == 3 else ""


def merge_bundle(
    data: bytes,
    backend: Backend,
    *,
    secret: SecretKeys | None,
    limits: Limits,
    store: Callable[[Mapping[str, bytes]], tuple[int, list[InvalidKeyError]]] | None,
    failed: Failed,
    overwrite: bool = True,
) -> LoadResult:
    """Screen a bundle's entries and ``store`` those accepted (``Cache.loads``).

    Unsigned entries (no ``secret``) are never stored in a shared backend, and
    unsigned entries of :data:`CODE_PURPOSES` in none: they are counted as
    ``withheld``. ``store`` says how many it wrote, and why it left out those whose key
    the store cannot hold (``unstorable``: counted, not raised, strict or not: the
    bundle's data, not the caller's key); ``None`` (a disabled cache) stores nothing. With
    ``overwrite`` False, the entries already stored at the bundle's keys are judged by
    :func:`~runtime_cache.existing_entries.good_existing`, tier by tier (a ``dir://``
    one a key at a time, by their heads first).
    """
    blobs = decode_bundle(data, secret=secret, limits=limits)
    screened = screen_bundle(blobs, secret, limits)
    accepted = screened.accepted
    withheld = code_count = 0
    if accepted and not overwrite:
        # Kept only where every store holds it: a tiered cache's copy found first may be a
        # good one over a planted or missing one in the shared tier below.
        tiers = getattr(backend, "tiers", None)
        kept: set[str] | None = None
        for tier in tiers if isinstance(tiers, list) and tiers else [backend]:
            try:
                good = good_existing(tier, accepted, secret, limits)  # a look, not a use
            except Exception as exc:
                failed("get_many", exc)
                good = set()
            kept = good if kept is None else kept & good
        accepted = {k: v for k, v in accepted.items() if k not in (kept or set())}
    if accepted and secret is None:
        code = [k for k in accepted if _purpose(k) in CODE_PURPOSES]
        for skey in code:  # native code that nothing checks after: only ever signed
            del accepted[skey]
        if code:
            withheld += len(code)
            code_count = len(code)
            log.warning(
                "runtime-cache: not writing %d unsigned bundle entries that hold native code "
                "(a driver's cache files): sign the bundle to carry them",
                len(code),
            )
    if accepted and secret is None and backend.shared:
        withheld, accepted = withheld + len(accepted), {}
        log.warning(
            "runtime-cache: not writing %d unsigned bundle entries to the shared store %r",
            withheld,
            backend,
        )
    stored, unheld = store(accepted) if accepted and store is not None else (0, [])
    if unheld:
        log.warning(
            "runtime-cache: not writing %d bundle entries whose key %r cannot hold: %s",
            len(unheld),
            backend,
            unheld[0],
        )
    return LoadResult(
        stored,
        offered=len(blobs),
        rejected=screened.rejected,
        corrupt=screened.corrupt,
        newer=screened.newer,
        unsigned=screened.unsigned,
        withheld=withheld,
        withheld_code=code_count,
        repeated=screened.repeated,
        unstorable_errors=tuple(map(str, unheld)),
    )
