"""Maintenance over any backend: verify entries, and prune by age and size (LRU first).

These functions work through the :class:`~runtime_cache.api.Backend` contract
only, so they apply to every backend. :func:`prune` lives in
:mod:`runtime_cache.pruning`; it is importable from here too.
"""

from __future__ import annotations

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
from .pruning import PruneReport, prune

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
    ``stopped`` says why the check stopped before its end (the store stopped answering),
    or is ``""``: what it found and removed by then is reported.
    """

    checked: int = 0
    signature_kept: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)
    removed: int = 0
    unsigned: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    newer: int = 0
    over_limit: int = 0
    stopped: str = ""

    @property
    def ok(self) -> bool:
        """True when every entry was checked, none was bad and nothing was skipped."""
        return not self.bad and not self.skipped and not self.stopped


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
    # Links, FIFOs, folders and oversized files at entry names (the directory backend names
    # them): a read of their key removes them, so --repair does; either way they are reported.
    for skey in list(getattr(backend, "listed_junk", None) or ()):
        reason = "no entry (a link, FIFO, folder or oversized file at an entry's name)"
        if repair:
            try:
                backend.peek(skey)
                reason += "; removed"
            except RuntimeCacheError as exc:
                reason += f"; not removed: {exc}"
        report.skipped.append((skey, reason))
    if repair and hasattr(backend, "listed_junk"):
        backend.listed_junk = []  # reported here, with what repair did
    _linked_folders(backend, repair, report)
    for done, skey in enumerate(names, 1):
        if on_progress is not None:
            on_progress(done, len(names))
        try:
            blob = backend.peek(skey)  # verifying is not a use: LRU order and hits stay
        except InvalidKeyError as exc:
            report.skipped.append((skey, f"not a cache key: {exc}"))
            continue
        except BackendUnavailableError as exc:  # the whole store is down: not one bad
            report.stopped = str(exc)  # entry; what was done by now is reported
            return report
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


def _linked_folders(backend: Backend, repair: bool, report: VerifyReport) -> None:
    # Links at fan-out folder names (the directory backend names them): never followed, so
    # the entries behind them are not the cache's; --repair removes the link alone.
    linked = list(getattr(backend, "linked_folders", None) or ())
    for folder in linked:
        reason = "a symbolic link at a folder's name (never followed: its entries left out)"
        if repair:
            try:
                backend.remove_linked_folder(folder)  # type: ignore[attr-defined]
                reason += "; removed"
            except RuntimeCacheError as exc:
                reason += f"; not removed: {exc}"
        report.skipped.append((folder, reason))
    if repair and linked:
        backend.linked_folders = []  # type: ignore[attr-defined]


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
