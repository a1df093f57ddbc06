"""The one check every blob passes before anything uses it.

Every read path (``Cache.get`` and ``get_many``, the views, listings,
``verify``, bundle loads, tuning loads, OpenCL bundles and the CLI's export)
calls :func:`check_entry` (or, for a listing that reads only an entry's head,
:func:`check_binding`; ``Cache.get`` of the cache's own entries, the same checks in
:mod:`.own_entries`). A value that a cache reads again, after one of these passed its
entry, is checked against the header that passed: its length, its checksum and (with
a secret) its signature, without the header read again
(:meth:`~runtime_cache.api.Backend.get_range`). It decodes the blob and verifies:

1. the format: magic, version, sizes and both checksums;
2. the signature, when a secret is set (any of the secret's keys);
3. that the entry's key is the key it is stored under;
4. that the entry's key parts hash to that key, so an entry copied under
   another key, with or without its key rewritten, is refused.

Outcomes are typed, and each read path maps them to the same counters:

* :class:`~runtime_cache.errors.NewerFormatError`: a miss; the entry is kept
  (a newer version of the library wrote it, during a rolling upgrade);
* :class:`~runtime_cache.errors.RejectedEntryError` (a bad signature, a key
  mismatch, an entry past this reader's limits): a ``rejected`` miss; the entry is
  kept, since whoever owns it may hold another secret (or larger limits), and the
  next store replaces it;
* any other :class:`~runtime_cache.errors.CorruptEntryError`: a ``corrupt``
  miss; the front removes exactly the bytes it judged bad
  (:meth:`~runtime_cache.api.Backend.delete_if`).

>>> from runtime_cache.codec import encode_entry
>>> from runtime_cache.keys import make_key
>>> key = make_key(module_id="m", runtime="demo", purpose="doc", device=None)
>>> other = make_key(module_id="n", runtime="demo", purpose="doc", device=None)
>>> blob = encode_entry(str(key), key.parts, b"value", created_at=0.0)
>>> bytes(check_entry(str(key), blob).value)
b'value'
>>> try:
...     check_entry(str(other), blob)
... except KeyMismatchError as exc:
...     type(exc).__name__
'KeyMismatchError'
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .codec import DEFAULT_LIMITS, Entry, Limits, SecretKeys, meta_head, verify_entry
from .errors import CorruptEntryError, KeyMismatchError, NewerFormatError, RejectedEntryError
from .fork_locks import renew_in_child
from .keys import CacheKey

__all__ = ["Checked", "check_binding", "check_entry", "refused_head", "screen", "screen_many"]

log = logging.getLogger(__name__)

#: Keys whose refusal was logged as a warning in this process (the most recent
#: :data:`TOLD_KEYS`): a planted entry at a hot key is refused on every read, and warned of
#: once; later refusals of it log at DEBUG (each is still counted).
_told: dict[str, None] = {}
_told_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_told_lock")  # (a fork while a thread holds it)
TOLD_KEYS = 4096


def _refusal(message: str, skey: str, *args: object) -> None:
    # Warn of ``skey``'s refusal once a process (the most recent keys), then at DEBUG.
    with _told_lock:
        first = skey not in _told
        if first:
            if len(_told) >= TOLD_KEYS:
                del _told[next(iter(_told))]
            _told[skey] = None
    log.log(logging.WARNING if first else logging.DEBUG, message, skey, *args)


@dataclass(frozen=True)
class Checked:
    """A blob that passed :func:`check_entry`: its metadata and a read-only view of its value."""

    meta: dict[str, Any]
    value: memoryview
    signed: bool

    @property
    def key(self) -> str:
        """The entry's key (equal to its storage key)."""
        return str(self.meta["k"])

    def entry(self) -> Entry:
        """The checked entry as an :class:`~runtime_cache.codec.Entry` (copies the value)."""
        meta = self.meta
        return Entry(
            key=meta["k"],
            parts=meta["p"],
            value=bytes(self.value),
            created_at=meta["c"],
            build_seconds=meta["b"],
            producer=meta["v"],
            signed=self.signed,
            extra=meta.get("x", {}),
        )


def _short(skey: str) -> str:
    # A key as a message may name it: whole up to 100 characters (a storage key is about
    # 55), else its start and its end, where the digest that tells two keys apart lies.
    return skey if len(skey) <= 100 else f"{skey[:60]}...{skey[-24:]}"


def check_binding(skey: str | None, meta: dict[str, Any], key: CacheKey | None = None) -> None:
    """Check that decoded metadata belongs under ``skey``: its key, and its parts' hash.

    ``skey`` ``None`` (a bundle entry, which has no storage key) checks the parts
    against the entry's own key. ``key``, when the caller made it from the
    parts it asked for, makes the parts check one comparison instead of a key
    derivation. Raises :class:`~runtime_cache.errors.KeyMismatchError`.
    """
    claimed = meta.get("k")
    if skey is not None and claimed != skey:
        raise KeyMismatchError(
            f"entry stored under {_short(skey)!r} holds key {_short(str(claimed))!r}"
        )
    parts = meta.get("p")
    if not isinstance(parts, dict) or not isinstance(claimed, str):
        raise CorruptEntryError("entry metadata lacks its key or parts")
    if key is not None and str(key) == claimed:
        if key.made_from(parts):
            return
    else:
        try:
            if str(CacheKey.from_parts(parts)) == claimed:
                return
        except (TypeError, ValueError, OverflowError):
            pass
    raise KeyMismatchError(f"the key parts of entry {_short(claimed)!r} do not hash to its key")


def check_entry(
    skey: str | None,
    blob: bytes | memoryview | tuple[bytes, ...],
    *,
    secret: SecretKeys | None = None,
    limits: Limits = DEFAULT_LIMITS,
    key: CacheKey | None = None,
) -> Checked:
    """Decode and verify ``blob``, stored under ``skey`` (``None`` for a bundle entry).

    ``blob`` may also be the pieces :meth:`~runtime_cache.api.Backend.get_parts`
    returns. Raises :class:`~runtime_cache.errors.CorruptEntryError` or one of its
    subclasses (see the module documentation for what each means to a caller).
    """
    # A key asked for by the caller: metadata that begins with exactly its key and
    # parts, as the codec writes them, is bound to it (one comparison of bytes).
    head = None if key is None or skey is None else meta_head(skey, key.packed_parts)
    meta, value, signed, bound = verify_entry(blob, secret=secret, limits=limits, head=head)
    if not (bound and str(key) == skey):
        check_binding(skey, meta, key)
    return Checked(meta, value, signed)


def screen(
    skey: str,
    blob: bytes | tuple[bytes, ...],
    secret: SecretKeys | None,
    limits: Limits,
    key: CacheKey | None,
    discard: Callable[[str, bytes], None],
    refused: Callable[[str, bytes], None] | None = None,
) -> Checked | str:
    """:func:`check_entry` for the front's reads: the checked entry, or the name of the
    counter its failure goes to (``"misses"``, ``"rejected"``, ``"corrupt"``). A corrupt
    blob is passed to ``discard(skey, blob)``, which removes exactly those bytes; a
    rejected one, which is kept, to ``refused(skey, blob)`` when given. ``blob`` may also
    be the pieces :meth:`~runtime_cache.api.Backend.get_parts` returns."""
    try:
        return check_entry(skey, blob, secret=secret, limits=limits, key=key)
    except NewerFormatError:
        return "misses"  # kept: a newer version of the library reads it
    except RejectedEntryError as exc:
        # Kept: a fleet member with another secret must not lose its entries, and
        # the next store replaces a transplanted one.
        _refusal("runtime-cache: rejected %s: %s", skey, exc)
        if refused is not None:
            refused(skey, b"".join(blob) if isinstance(blob, tuple) else blob)
        return "rejected"
    except CorruptEntryError as exc:
        log.warning("runtime-cache: corrupt entry %s (%s); deleting it", skey, exc)
        discard(skey, b"".join(blob) if isinstance(blob, tuple) else blob)
        return "corrupt"


def refused_head(
    skey: str,
    blob: bytes | tuple[bytes, ...],
    kept: Callable[[tuple[bytes, ...]], str | None],
) -> str | None:
    """The counter for ``blob``, read under ``skey``, where it is the head alone of an
    entry refused by it, and kept (``kept``:
    :meth:`~runtime_cache.refused_heads.RefusedHeads.kept_head`); else ``None``."""
    if type(blob) is not tuple:
        return None
    why = kept(blob)
    if why == "rejected":
        _refusal("runtime-cache: rejected %s by its head, unread (kept)", skey)
    return why


def screen_many(
    wanted: Sequence[str],
    asked: Sequence[object],
    blobs: Mapping[str, bytes | tuple[bytes, ...]],
    secret: SecretKeys | None,
    limits: Limits,
    discard: Callable[[str, bytes], None],
    tally: dict[str, tuple[int, float]] | None = None,
    refused: Callable[[str, bytes], None] | None = None,
    kept: Callable[[tuple[bytes, ...]], str | None] | None = None,
) -> tuple[dict[str, memoryview], dict[str, float]]:
    """:func:`screen` over a batch: the values that passed, by storage key, and the
    counters to add (hits, misses, rejected, corrupt, bytes read, seconds saved).

    ``asked`` holds what the caller asked for, one per ``wanted`` key: a
    :class:`~runtime_cache.keys.CacheKey` makes the parts check one comparison.
    ``tally``, when given, gets each passed key's ``(bytes read, seconds saved)``;
    ``refused``, each rejected blob (as in :func:`screen`). ``kept(pieces)`` names the
    counter of pieces that are the head alone of an entry refused by it, and kept
    (:meth:`~runtime_cache.refused_heads.RefusedHeads.kept_head`): counted so, unchecked,
    and a rejected one's head passed to ``refused``.
    """
    found: dict[str, memoryview] = {}
    counts: dict[str, float] = {"misses": 0, "rejected": 0, "corrupt": 0}
    read = 0
    saved = 0.0
    for skey, key in zip(wanted, asked, strict=True):
        blob = blobs.get(skey)
        if blob is None:
            counts["misses"] += 1
            continue
        why = None if kept is None else refused_head(skey, blob, kept)
        if why is not None:
            counts["misses"] += 1
            if why != "misses":
                counts[why] += 1
                if refused is not None:  # (a tier below may hold a good copy)
                    refused(skey, b"".join(blob) if isinstance(blob, tuple) else blob)
            continue
        asked_key = key if type(key) is CacheKey else None
        checked = screen(skey, blob, secret, limits, asked_key, discard, refused)
        if isinstance(checked, str):
            counts["misses"] += 1
            if checked != "misses":
                counts[checked] += 1
            continue
        size = sum(map(len, blob)) if isinstance(blob, tuple) else len(blob)
        read += size
        saved += checked.meta["b"]
        found[skey] = checked.value
        if tally is not None:
            tally[skey] = (size, checked.meta["b"])
    counts.update(hits=len(found), bytes_read=read, seconds_saved=saved)
    return found, counts
