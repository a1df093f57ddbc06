"""The entries a store already holds at a bundle's keys, judged for an import that keeps
the good ones (``Cache.loads(overwrite=False)``, ``runtime-cache import --keep-existing``).

An entry is kept when it passes this cache's check (its signature too, with a secret), or
is of a newer format (a rolling upgrade's); anything else there (damaged bytes, an entry
unsigned where a secret is set, a planted one) is replaced by the bundle's.

On a store that reads files (``dir://``), each entry is judged by its head first
(:data:`~runtime_cache.api.SPAN_HEAD` bytes, read as a look, not a use): one whose header
alone says what becomes of it (no entry header, a newer format, unsigned where a secret is
set, lengths past this cache's limits) is never read whole. The others are read whole one
at a time, so what the judging holds is one entry at most, never a batch of them: a
folder others write may hold sparse files whose headers claim 400 MiB values, and four of
them, read together, held 1.66 GB. A store a round trip away (Redis) is read in batches,
which it bounds (``max_batch_size``): the keys one left out are asked again in the next.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from .api import SPAN_HEAD, Backend, peek_head, reads_ranges
from .check import check_entry
from .codec import Limits, SecretKeys
from .entry_frame import FLAG_SIGNED, parse_header
from .errors import BackendError, CorruptEntryError, InvalidKeyError, NewerFormatError

__all__ = ["good_existing", "keeps", "peek_past_cap"]


def keeps(skey: str, blob: bytes, secret: SecretKeys | None, limits: Limits) -> bool:
    """Whether an import that keeps existing entries keeps ``blob``, stored under ``skey``:
    it passes this cache's check, or is of a newer format."""
    try:
        check_entry(skey, blob, secret=secret, limits=limits)
    except NewerFormatError:
        return True
    except CorruptEntryError:  # (RejectedEntryError among them)
        return False
    return True


def _by_head(head: bytes, secret: SecretKeys | None, limits: Limits) -> bool | None:
    # What the header alone says (keep, replace), or None: the whole entry must tell.
    try:
        flags = parse_header(head, limits)[0]
    except NewerFormatError:
        return True
    except CorruptEntryError:  # no header, or lengths past the limits (OverLimitError)
        return False
    if secret is not None and not flags & FLAG_SIGNED:
        return False  # unsigned where a secret is set: rejected, whatever follows
    return None


def good_existing(
    backend: Backend, keys: Iterable[str], secret: SecretKeys | None, limits: Limits
) -> set[str]:
    """The ``keys`` whose entry in ``backend`` an import that keeps existing entries keeps
    (:func:`keeps`). On a store that reads files (``dir://``, :func:`~.api.reads_ranges`),
    each is judged by its head, and read whole, alone, only where the head passes (one
    entry it cannot read is not kept). Elsewhere (Redis: a round trip a call, and a batch
    read it bounds, ``max_batch_size``), in batch reads (:func:`_in_batches`): a key a
    call cost 3,000 round trips for 3,000 entries. A backend's error on a batch is raised
    (its caller then knows nothing of what it holds)."""
    if not reads_ranges(backend):
        return _in_batches(backend, list(dict.fromkeys(keys)), secret, limits)
    good: set[str] = set()
    for skey in keys:
        try:
            if _kept(backend, skey, secret, limits):
                good.add(skey)
        except (BackendError, InvalidKeyError):  # (unreadable, or a key it cannot hold)
            pass  # the import's entry goes in its place, if it can
    return good


def peek_past_cap(
    backend: Backend, keys: Sequence[str], *, again: bool = True
) -> Iterator[dict[str, bytes]]:
    """The values ``backend`` holds at ``keys``, read as a look in batch reads
    (``peek_many``), a read's found values at a time (keys asked for only). A store may
    leave values out of one batch read (Redis: those past ``max_batch_size``, as misses):
    with ``again``, the keys a read did not return are asked again, while a read returns
    any of them; a read that returns none says the rest are absent (a capped read always
    returns one value that fits, if any is there), so the loop ends. Each read's values
    are let go of before the next read (the caller's too, once it drops them)."""
    wanted = list(keys)
    while wanted:
        found = backend.peek_many(wanted)
        got = {skey: found[skey] for skey in wanted if skey in found}
        del found
        if not got:
            return  # (nothing new: the rest are absent, and the loop cannot run on)
        yield got
        if not again:
            return
        wanted = [skey for skey in wanted if skey not in got]
        del got


def _in_batches(
    backend: Backend, keys: list[str], secret: SecretKeys | None, limits: Limits
) -> set[str]:
    # Taken for absent, good entries a capped batch read left out were replaced by the
    # bundle's: so they are asked again (peek_past_cap). An import into an empty store
    # costs one batch read. Each batch is judged and let go before the next.
    good: set[str] = set()
    for got in peek_past_cap(backend, keys):
        good.update(skey for skey, blob in got.items() if keeps(skey, blob, secret, limits))
        del got
    return good


def _kept(backend: Backend, skey: str, secret: SecretKeys | None, limits: Limits) -> bool:
    head = peek_head(backend, skey, SPAN_HEAD)
    if head is None:
        return False
    verdict = _by_head(head, secret, limits)
    if verdict is None:
        blob = head if len(head) < SPAN_HEAD else backend.peek(skey)  # (shorter: all)
        verdict = blob is not None and keeps(skey, blob, secret, limits)
    return verdict
