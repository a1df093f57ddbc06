"""Pruning by age and size over any backend: least recently used first.

:func:`prune` works through the :class:`~runtime_cache.api.Backend` contract only, so it
applies to every backend; those that keep last-access times (directory, memory) give true
LRU order, the others creation time. Entries that fail the check on their metadata
(corrupt: garbage, a truncated head, an entry swapped in from another key) count at the
store's size for them and go first for size, whatever time their files claim: none can be
served, and a file's time is anyone's to set. Entries no reader of this cache serves
(unsigned while it has a secret), or whose age cannot be told (dated more than a day in
the future: a clock ahead, or a time set by hand) go next, and the latter for any
``older_than`` too. A corrupt one goes only once its head, read again (never whole: a
planted file may be large or sparse), still fails so. Every removal is conditional
(:meth:`~runtime_cache.cache.Cache.delete_if_unchanged`): an entry goes only while it is
the one weighed, neither written again (its header and size) nor, where the store keeps
last uses (dir://, memory://), used since; one that changed is kept and named in
:attr:`PruneReport.changed`. Entries in a newer format, over this cache's limits, or
unreadable here are left out: they may be another reader's. A removal that does not
happen never lets prune remove others in its place beyond the cap.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from .api import StoredItem
from .cache import Cache
from .codec import HEADER_SIZE
from .errors import (
    BackendUnavailableError,
    CorruptEntryError,
    InvalidValueError,
    PartialDeleteError,
    RuntimeCacheError,
)
from .listing import OnProgress, read_heads, read_info, skip_kind, skip_reason
from .stored_sizes import stored_size
from .units import parse_duration, parse_size

__all__ = ["FUTURE", "PruneReport", "prune"]


@dataclass
class PruneReport:
    """What :func:`prune` did."""

    removed: int = 0
    freed: int = 0
    remaining: int = 0
    remaining_bytes: int = 0
    leftovers: int = 0
    #: Entries whose removal failed (an immutable file, a permission), and why.
    failed: list[tuple[str, str]] = field(default_factory=list)
    #: Entries that cannot be removed (told by the store before, or found so), and their
    #: bytes; kept, and not tried again.
    stuck: int = 0
    stuck_bytes: int = 0
    #: Bytes still over ``max_size``: entries that cannot go fill the cap.
    over_cap: int = 0
    #: Whether size pruning was left undone, since the entries that cannot go alone
    #: exceed the cap (removing the rest could not meet it).
    kept_the_rest: bool = False
    #: Entries that could not be read to be weighed (unreadable here, a newer format, over
    #: this cache's limits), and why: left out of the total, and kept.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Corrupt entries found, and why: counted at their stored size, first to go for size.
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    #: Entries that decode but no reader of this cache would serve (unsigned while it has a
    #: secret), or whose age cannot be told (:data:`FUTURE`: a writer's clock ahead, or a
    #: time any writer may set; readers serve them), and why. First to go for size after
    #: corrupt ones; one dated in the future goes for any ``older_than`` too.
    untrusted: list[tuple[str, str]] = field(default_factory=list)
    #: Entries removed from the tiers of a store that could be reached, not from those
    #: named (a tier down), where they may live on until it is back; counted as removed.
    elsewhere: list[tuple[str, str]] = field(default_factory=list)
    #: Entries kept since they were written again, or used, after prune weighed them (by
    #: another process, or from ``on_progress``): not removed, and not counted as removed.
    changed: list[str] = field(default_factory=list)
    #: Whether this was a dry run: ``removed`` and ``freed`` are what would go (the entries
    #: in ``would_remove``, in order); nothing was removed (stale temporary files included).
    dry_run: bool = False
    would_remove: list[str] = field(default_factory=list)
    #: Why prune stopped before its end, or could not list the store again at its end (the
    #: store stopped answering), or ``""``: then the counts are from what each removal said.
    stopped: str = ""


class _Weighed(NamedTuple):
    # What prune knows of an entry: last use (None: unknown), stored size, when made (None if
    # corrupt), whether corrupt, the store's listing, its header (b"" if corrupt: read again).
    last: float | None
    size: int
    made: float | None
    corrupt: bool
    item: StoredItem
    head: bytes
    suspect: str = ""  # why no reader of this cache would serve it ("": none)


def prune(
    cache: Cache,
    *,
    max_size: int | str | None = None,
    older_than: float | str | None = None,
    now: float | None = None,
    on_progress: OnProgress | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Remove entries not used for ``older_than`` seconds, then the least recently
    used ones until the total stored size is at most ``max_size`` bytes.

    ``max_size`` is bytes or a size such as ``"500MB"``, ``older_than`` seconds or a
    duration such as ``"30d"``; anything else (a negative number, NaN, a bool) raises
    :class:`~runtime_cache.errors.InvalidValueError` before anything is removed.

    Entries the store says it cannot remove (:meth:`~runtime_cache.api.Backend.removable`)
    are kept and counted; where they alone exceed ``max_size``, no entry is removed for
    size, since that could not meet it. Corrupt entries count too and go first for size
    (see the module documentation); for age they go by the store's last use, where it
    keeps one. ``on_progress(done, total)`` is told after each entry is weighed.

    An entry is removed only while it is the one weighed: one written again, or used
    (where the store keeps last uses), after the listing is kept and named in
    :attr:`PruneReport.changed`, not counted as removed.

    With ``dry_run``, nothing is removed: the report says what would go (``removed``,
    ``freed``) and what would stay, as the store is now.
    """
    max_size = None if max_size is None else _size(max_size)
    older_than = None if older_than is None else _seconds(older_than)
    now = time.time() if now is None else now
    report = PruneReport(dry_run=True) if dry_run else PruneReport(leftovers=cache.backend.vacuum())
    weighed = _weigh(cache, report, now)
    unlisted = set(getattr(cache.backend, "failed_tiers", None) or ())  # (tiers down at first)
    items = sorted(weighed.items(), key=_order)
    total = sum(entry.size for entry in weighed.values())
    over = max_size is not None and total > max_size
    # Known before removing any (asked only when over the cap: 19 µs an entry on dir://).
    stuck = {key for key in weighed if over and not _removable(cache, key)}
    pinned = sum(weighed[key].size for key in stuck)
    report.kept_the_rest = max_size is not None and pinned > max_size
    tried: set[str] = set()
    would: set[str] = set()
    vanished: set[str] = set()  # (removed meanwhile by another hand)
    attempted = False
    for done, (key, entry) in enumerate(items, 1):
        if on_progress is not None:
            on_progress(done, len(items))
        last = entry.last
        expired = older_than is not None and last is not None and now - last > older_than
        expired = expired or (older_than is not None and entry.suspect == FUTURE)
        over = max_size is not None and total > max_size and pinned <= max_size
        if not (expired or (over and key not in stuck)):
            continue
        if dry_run:  # (one known not to go is not one that would)
            if key not in stuck:
                would.add(key)
                report.would_remove.append(key)
                total -= entry.size
            continue
        attempted = True
        try:  # one that cannot be removed does not stop the rest (as clear goes on)
            outcome, now_there = (_remove_corrupt if entry.corrupt else _remove)(cache, key, entry)
        except PartialDeleteError as exc:  # gone from what could be reached
            report.elsewhere.append((key, ", ".join(exc.failed)))
            outcome, now_there = "removed", 0
        except BackendUnavailableError as exc:  # the store is down: say what was done
            report.stopped = str(exc)
            break
        except Exception as exc:  # (a store's failure, counted by the cache)
            report.failed.append((key, str(exc)))
            outcome, now_there = "stuck", entry.size
        if outcome == "removed":
            tried.add(key)
            total -= entry.size
        elif outcome == "gone":  # removed meanwhile by another hand (not ours to count),
            total -= entry.size  # or now another reader's (a newer format)
            vanished.add(key)
        elif outcome == "stuck" and key not in stuck:  # still there: as one that cannot go
            tried.add(key)
            stuck.add(key)
            pinned += entry.size
        elif outcome == "good":  # a corrupt entry written again meanwhile: kept
            total += now_there - entry.size
        elif outcome == "changed":  # written again or used since weighed: kept
            report.changed.append(key)
    if max_size is not None and pinned > max_size:
        report.kept_the_rest = True
    removals = tried if attempted else None
    try:
        _settle(cache, report, weighed, removals, stuck, max_size, would, vanished, unlisted)
    except BackendUnavailableError as exc:  # (down since: by what each removal said)
        report.stopped = str(exc)
        _settle(cache, report, weighed, removals, stuck, max_size, would, vanished, unlisted)
    return report


def _size(value: object) -> int:
    # Bytes as any whole number type (a numpy integer, a float such as 2e9 or cap * 0.8,
    # rounded down) or text ("500MB"); never a bool (True was one byte).
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, str)):
        raise InvalidValueError(f"max_size is a size, not {type(value).__name__}")
    if isinstance(value, float) and not (math.isfinite(value) and value >= 0):
        raise InvalidValueError(f"a size must be 0 to 2**63-1 bytes: {value}")
    return parse_size(value if isinstance(value, str) else int(value))


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise InvalidValueError(f"older_than is a duration, not {type(value).__name__}")
    return parse_duration(value if isinstance(value, str) else float(value))


#: Seconds past now a time may be before an entry is taken for one dated in the future:
#: clocks of a fleet differ, by far less than this.
FUTURE_SLACK = 86_400.0
FUTURE = "dated more than a day in the future"


def _order(item: tuple[str, _Weighed]) -> tuple[int, float]:
    # Corrupt ones first, then those no reader here serves, then least recently used.
    entry = item[1]
    return (0 if entry.corrupt else 1 if entry.suspect else 2, entry.last or 0.0)


def _weigh(
    cache: Cache, report: PruneReport | None, now: float, down: list[Exception] | None = None
) -> dict[str, _Weighed]:
    # Every entry by its metadata; corrupt ones by what the store's listing says of them.
    # Only the flag of a signature is read (a forged one passes here; readers refuse it).
    # ``down`` gets the listing's own failures (its scan, a head unanswered), not the policy;
    # without it such a failure is raised (a lax cache said an empty store).
    weighed: dict[str, _Weighed] = {}
    headers: dict[str, bytes] = {}
    secret = cache.signed
    unlisted: list[Exception] = []  # (the first listing's own failure: counted, then raised)

    def failed(op: str, exc: Exception) -> None:
        if down is not None:
            down.append(exc)
        else:
            unlisted.append(exc)
            cache._failed(op, exc)  # (the cache's policy: counted, and raised where strict)

    for item, info in read_heads(cache.backend, cache.limits, failed, "", headers):
        if down is not None and isinstance(info, BackendUnavailableError):
            down.append(info)
        elif not isinstance(info, RuntimeCacheError):
            last = info.last_access if info.last_access is not None else info.created_at
            head = headers[item.key]
            suspect = (
                FUTURE
                if max(last, info.created_at) > now + FUTURE_SLACK
                else "unsigned, and this cache has a secret"
                if secret and not info.signed
                else ""
            )
            if suspect and report is not None:
                report.untrusted.append((info.key, suspect))
            weighed[info.key] = _Weighed(
                last, info.stored_size, info.created_at, False, item, head, suspect
            )
        elif _corrupt(info):
            weighed[item.key] = _Weighed(item.last_access, item.size, None, True, item, b"")
            if report is not None:
                report.corrupt.append((item.key, str(info)))
        elif report is not None:
            report.skipped.append((item.key, skip_reason(info)))
    if unlisted:  # (a cache that carries on past a failure: nothing was weighed, no store)
        raise unlisted[0]
    return weighed


def _corrupt(exc: Exception) -> bool:
    # Bad for every reader: not a newer format, nor only over this cache's limits.
    return skip_kind(exc) == "corrupt"


def _remove(cache: Cache, key: str, entry: _Weighed) -> tuple[str, int]:
    # ("removed" | "gone": nothing there now | "changed": written again, or used since it
    # was weighed, and kept | "stuck": still there as weighed, though asked to go; and the
    # bytes stored at the key now, where that was read).
    if cache.delete_if_unchanged(key, entry.item, entry.head):
        return "removed", 0
    try:
        now = cache.backend.head(key, len(entry.head))
    except Exception:
        return "stuck", 0
    if now is None:
        return "gone", 0
    if bytes(now) != entry.head:
        return "changed", 0
    return _used_since(cache, key, entry.item), 0


def _used_since(cache: Cache, key: str, listed: StoredItem) -> str:
    # For one still holding the header weighed that did not go: "changed" where the store
    # keeps last uses and could have removed it (so it was used, or resized, since), else
    # "stuck". Not listed again: a listing reads the hits journal whole (up to 0.5 s), once
    # for every entry an app used while prune ran (review).
    if listed.last_access is None:
        return "stuck"
    try:
        return "changed" if cache.backend.removable(key) else "stuck"
    except Exception:
        return "stuck"


def _remove_corrupt(cache: Cache, key: str, entry: _Weighed) -> tuple[str, int]:
    # As _remove, once its head (read again, without counting a use) still fails the check
    # as corrupt; else "good" (written again meanwhile, or a good copy in a tier below, with
    # its size) or "gone" (nothing there, or now another reader's). Only the head is read
    # of what may be junk (a planted file may be large or sparse).
    try:  # (with the listing's size: a head that claims more than is stored is corrupt)
        read_info(cache.backend, StoredItem(key, entry.size), cache.limits)
    except KeyError:
        return "gone", 0
    except CorruptEntryError as exc:
        if not _corrupt(exc):
            return "gone", 0
        head = cache.backend.head(key, HEADER_SIZE)  # what goes: only these bytes
        if head is None:
            return "gone", 0
        outcome = _remove(cache, key, entry._replace(head=head))
        below = stored_size(cache.backend, key) if outcome[0] == "removed" else None
        return ("good", below) if below and _decodes(cache, key, below) else outcome
    blob = cache.backend.peek(key)
    return ("good", len(blob)) if blob is not None else ("gone", 0)


def _decodes(cache: Cache, key: str, size: int) -> bool:
    # Whether the head at ``key`` decodes as an entry of ``size`` (not junk planted again).
    try:
        read_info(cache.backend, StoredItem(key, size), cache.limits)
    except (KeyError, RuntimeCacheError):
        return False
    return True


def _settle(
    cache: Cache,
    report: PruneReport,
    weighed: dict[str, _Weighed],
    tried: set[str] | None,
    stuck: set[str],
    max_size: int | None,
    would: set[str],
    vanished: set[str],
    unlisted: set[str],
) -> None:
    """Fill in what is left, listed again where any removal was tried (``tried`` is None
    where none was): a store of tiers says it removed an entry (or had none) while a tier
    kept it, and another hand may have removed or written entries. An entry written again
    meanwhile is not one that stayed. ``would`` holds what a dry run would remove: gone,
    not listed again. Where prune stopped (the store down), nothing is listed again: left
    is what was weighed, less what each removal said went (and ``vanished``). A tier down
    at the end listing but not at the first (``unlisted``) fails that listing."""
    sizes = {key: entry.size for key, entry in weighed.items()}
    left, again = {key: size for key, size in sizes.items() if key not in would}, {}
    if tried is None:
        tried = set()
    elif report.stopped:  # (not listed again: by what each removal said)
        tried = tried - stuck
        left = {key: size for key, size in sizes.items() if key not in tried | vanished}
    else:
        down: list[Exception] = []
        listed = _weigh(cache, None, time.time(), down)
        newly = sorted(set(getattr(cache.backend, "failed_tiers", None) or ()) - unlisted)
        if down or newly:  # (what it leaves out may be there still)
            why = down[0] if down else f"{', '.join(newly)} could not be listed"
            raise BackendUnavailableError(f"listed again after prune: {why}")
        left = {key: entry.size for key, entry in listed.items()}
        again = {key: entry.made for key, entry in listed.items()}
        # One that did not go (not tried, or stuck) but is not listed again was on a tier
        # that could not be read now (a store of tiers lists, and reads heads from, the
        # tiers it reaches): counted as still there, unless another hand removed it.
        for key in (stuck | (sizes.keys() - tried)) - left.keys() - vanished - would:
            left[key], again[key] = sizes[key], weighed[key].made
    stayed = {key for key in tried & again.keys() if again[key] == weighed[key].made}
    said = {key for key, _ in report.failed}
    report.failed += [(key, "still there after its removal") for key in stayed - said]
    stuck |= stayed
    gone = (tried - stayed) | would
    report.removed = len(gone)
    report.freed = sum(sizes[key] for key in gone)
    report.remaining, report.remaining_bytes = len(left), sum(left.values())
    report.stuck = len(stuck & left.keys())
    report.stuck_bytes = sum(left[key] for key in stuck & left.keys())
    if max_size is not None:
        report.over_cap = max(0, report.remaining_bytes - max_size)


def _removable(cache: Cache, key: str) -> bool:
    try:
        return cache.backend.removable(str(key))
    except Exception:  # a guess: a backend that cannot tell is tried
        return True
