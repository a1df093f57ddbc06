"""Maintenance over any backend: verify entries, prune by age and size (LRU first).

These functions work through the :class:`~runtime_cache.api.Backend` contract
only, so they apply to every backend; backends that keep last-access times
(directory, memory) give true LRU order, the others fall back to creation time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .api import Backend
from .cache import Cache
from .codec import decode_meta
from .errors import (
    BackendUnavailableError,
    InvalidKeyError,
    NewerFormatError,
    OverLimitError,
    RuntimeCacheError,
    SignatureError,
)
from .listing import HEAD_SIZE, OnProgress

__all__ = ["PruneReport", "VerifyReport", "prune", "verify"]


@dataclass
class VerifyReport:
    """What :func:`verify` found.

    ``checked`` entries were read; ``bad`` ones failed with a reason
    (``unsigned`` of them only for lack of a signature, while a secret is
    set); ``removed`` of them were deleted. ``newer`` entries are in a newer
    format and are kept (a newer version of the library reads them); ``over_limit``
    ones are larger than this cache's ``limits`` allow, and are kept as well (a
    process with larger limits reads them).
    ``skipped`` names could not be read at all (a name that is no key, a file
    the backend cannot open), with the reason; they are never deleted.
    ``signature_kept`` bad ones failed only their signature while no entry verified
    with this secret (a wrong secret, most likely): ``repair`` does not delete them.
    """

    checked: int = 0
    signature_kept: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0
    unsigned: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    newer: int = 0
    over_limit: int = 0

    @property
    def ok(self) -> bool:
        """True when no bad entry was found and nothing was skipped."""
        return not self.bad and not self.skipped


def _unsigned(cache: Cache, blob: bytes) -> bool:
    try:
        return not decode_meta(blob[:HEAD_SIZE], cache.limits)[2]
    except RuntimeCacheError:
        return False


def verify(
    cache: Cache,
    *,
    repair: bool = False,
    prefix: str = "",
    on_progress: OnProgress | None = None,
) -> VerifyReport:
    """Check every entry with :func:`runtime_cache.check.check_entry` (through
    :meth:`Cache.decode`): checksums, (with a secret) signature, key, and parts.

    With ``repair=True``, bad entries are deleted, compare-and-delete: only the
    bytes judged bad, so an entry rebuilt meanwhile is kept. Good entries and
    entries in a newer format are never touched. Entries that fail only their
    signature are deleted only when some entry verified with this secret: when none
    did, the secret is more likely wrong than every entry forged (a mistyped secret
    removed a whole cache), and they are kept (``signature_kept``).
    A name that is no valid key, or an entry the backend cannot read, is
    skipped and reported, and the check goes on. ``on_progress(done, total)``
    is told after each entry.
    """
    report = VerifyReport()
    backend = cache.backend
    names = list(backend.keys(prefix))
    verified, forged = 0, list[str]()
    # Links, FIFOs and folders at entry names (the directory backend names them): a read
    # of their key removes them, so --repair does; either way they are reported.
    for skey in list(getattr(backend, "listed_junk", None) or ()):
        reason = "not a file (a link, FIFO or folder at an entry's name)"
        if repair:
            try:
                backend.peek(skey)
                reason += "; removed"
            except RuntimeCacheError as exc:
                reason += f"; not removed: {exc}"
        report.skipped.append((skey, reason))
    if repair and hasattr(backend, "listed_junk"):
        backend.listed_junk = []  # reported here, with what repair did
    for done, skey in enumerate(names, 1):
        if on_progress is not None:
            on_progress(done, len(names))
        try:
            blob = backend.peek(skey)  # verifying is not a use: LRU order and hits stay
        except InvalidKeyError as exc:
            report.skipped.append((skey, f"not a cache key: {exc}"))
            continue
        except BackendUnavailableError:
            raise  # the whole backend is down: not one bad entry
        except RuntimeCacheError as exc:
            report.skipped.append((skey, f"unreadable: {exc}"))
            continue
        if blob is None:  # vanished while we looked, or more than the store reads whole
            _judge_unread(cache, skey, repair, report)
            continue
        report.checked += 1
        try:
            cache.decode(skey, blob)
            verified += 1
        except NewerFormatError:
            report.newer += 1
        except OverLimitError:
            report.over_limit += 1
        except RuntimeCacheError as exc:
            report.bad.append((skey, str(exc)))
            signature = isinstance(exc, SignatureError)
            if signature and _unsigned(cache, blob):
                report.unsigned += 1
            if signature:
                forged.append(skey)  # removed at the end, once some entry has verified
            elif repair:
                _remove(backend, skey, blob, report)
    if forged and not verified:
        report.signature_kept = len(forged)
    for skey in forged if verified and repair else ():
        try:  # read again: their bytes are not held for the whole walk
            again = backend.peek(skey)
        except RuntimeCacheError:
            continue  # unreadable now: judged at the next check
        if again is None:
            continue
        try:
            cache.decode(skey, again)
        except SignatureError:
            _remove(backend, skey, again, report)
        except RuntimeCacheError:
            pass  # changed meanwhile: judged at the next check
    return report


def _judge_unread(cache: Cache, skey: str, repair: bool, report: VerifyReport) -> None:
    # A listed name that peek() did not return. A value over the store's cap (Redis's
    # max_entry_size) is a miss to every read: ls called it corrupt and sent the user
    # here, where it went unseen. Its head tells: no entry at all is bad (and --repair
    # removes it, if its head is unchanged); an entry is reported, not judged.
    backend = cache.backend
    try:
        head = backend.head(skey, HEAD_SIZE)
    except RuntimeCacheError:
        return
    if head is None:
        return  # gone meanwhile: nothing to verify
    try:
        decode_meta(head, cache.limits)
    except (NewerFormatError, OverLimitError):
        pass
    except RuntimeCacheError as exc:
        report.checked += 1
        report.bad.append((skey, f"{exc}; larger than the store reads whole"))
        if repair:
            try:
                if backend.head(skey, HEAD_SIZE) == head:  # (not rewritten since)
                    report.removed += bool(backend.delete(skey))
            except RuntimeCacheError as failed:
                report.skipped.append((skey, f"not removed: {failed}"))
        return
    report.skipped.append(
        (skey, "larger than the store reads whole (its max_entry_size): not checked")
    )


def _remove(backend: Backend, skey: str, blob: bytes, report: VerifyReport) -> None:
    try:
        report.removed += bool(backend.delete_if(skey, blob))
    except RuntimeCacheError as failed:
        report.skipped.append((skey, f"not removed: {failed}"))


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
    #: Entries whose metadata could not be read (corrupt, a newer format, unreadable), and
    #: why; they count at the store's size for them, and go first for size.
    skipped: list[tuple[str, str]] = field(default_factory=list)


def prune(
    cache: Cache,
    *,
    max_size: int | None = None,
    older_than: float | None = None,
    now: float | None = None,
    on_progress: OnProgress | None = None,
) -> PruneReport:
    """Remove entries not used for ``older_than`` seconds, then the least recently
    used ones until the total stored size is at most ``max_size`` bytes.

    Entries the store says it cannot remove (:meth:`~runtime_cache.api.Backend.removable`)
    are kept and counted; where they alone exceed ``max_size``, no entry is removed for
    size, since that could not meet it. Entries whose metadata cannot be read (corrupt, in
    a newer format, a file this user may not read), and with a secret unsigned ones, count
    too, at the store's size for them: they go first for size (of no use here, whatever
    time a file claims), and for age by the store's last use, where it keeps one.
    ``on_progress(done, total)`` is told after each entry is weighed.
    """
    now = time.time() if now is None else now
    report = PruneReport(leftovers=cache.backend.vacuum())
    weighed = _weigh(cache, report.skipped)
    # Those it cannot read (or, with a secret, unsigned) first: none is of use here, and a
    # file's time is anyone's to set. Then the least recently used.
    items = sorted(weighed.items(), key=lambda item: (item[1][2] is not None, item[1][0] or 0.0))
    sizes = {key: size for key, (_, size, _) in items}
    total = sum(sizes.values())
    over = max_size is not None and total > max_size
    # Known before removing any (asked only when over the cap: 19 µs an entry on dir://).
    stuck = {key for key in sizes if over and not _removable(cache, key)}
    pinned = sum(sizes[key] for key in stuck)
    report.kept_the_rest = max_size is not None and pinned > max_size
    tried: set[str] = set()
    for done, (key, (last, size, _)) in enumerate(items, 1):
        if on_progress is not None:
            on_progress(done, len(items))
        expired = older_than is not None and last is not None and now - last > older_than
        over = max_size is not None and total > max_size and pinned <= max_size
        if not (expired or (over and key not in stuck)):
            continue
        tried.add(key)
        try:  # one that cannot be removed does not stop the rest (as clear goes on)
            gone = cache.delete(key)
        except RuntimeCacheError as exc:
            report.failed.append((key, str(exc)))
            gone = False
            if key not in stuck:
                stuck.add(key)
                pinned += size
        if gone:
            total -= size
    _settle(cache, report, weighed, tried, stuck, max_size)
    return report


#: What prune knows of an entry: its last use (``None``: unknown), its stored size, and
#: when it was made (``None`` for one whose metadata could not be read).
_Weighed = tuple["float | None", int, "float | None"]


def _weigh(cache: Cache, skipped: list[tuple[str, str]] | None) -> dict[str, _Weighed]:
    # Every entry by its metadata; those it could not read (told to ``skipped``) by what
    # the store's listing says of them, looked up only when there are such.
    weighed: dict[str, _Weighed] = {}
    unread: set[str] = set()

    def skip(key: str, why: str) -> None:
        unread.add(key)
        if skipped is not None:
            skipped.append((key, why))

    for info in cache.entries(on_skip=skip):
        last = info.last_access if info.last_access is not None else info.created_at
        if info.signed or not cache.signed:
            weighed[info.key] = (last, info.stored_size, info.created_at)
        else:  # never served while a secret is set: as one that cannot be read
            unread.add(info.key)
    if unread:
        try:
            stored = [item for item in cache.backend.scan() if item.key in unread]
        except Exception:  # the store went away since: nothing more is known of them
            stored = []
        for item in stored:
            weighed[item.key] = (item.last_access, item.size, None)
    return weighed


def _settle(
    cache: Cache,
    report: PruneReport,
    weighed: dict[str, _Weighed],
    tried: set[str],
    stuck: set[str],
    max_size: int | None,
) -> None:
    """Fill in what is left, listed again where any removal was tried: a store of tiers
    says it removed an entry (or that it had none) while one of its tiers kept it. An
    entry written again meanwhile (a newer one under the key) is not one that stayed."""
    sizes = {key: size for key, (_, size, _) in weighed.items()}
    left, again = dict(sizes), {}
    if tried:
        listed = _weigh(cache, None)
        left = {key: size for key, (_, size, _) in listed.items()}
        again = {key: made for key, (_, _, made) in listed.items()}
    stayed = {key for key in tried & again.keys() if again[key] == weighed[key][2]}
    said = {key for key, _ in report.failed}
    report.failed += [(key, "still there after its removal") for key in stayed - said]
    stuck |= stayed
    gone = tried - stayed
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
