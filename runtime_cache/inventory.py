"""What a cache holds: list it, read one entry's metadata, dump it as a bundle, merge one in.

:class:`Inventory` gives :class:`~runtime_cache.cache.Cache` these methods
(:meth:`~Inventory.entries`, :meth:`~Inventory.info`, :meth:`~Inventory.dumps`,
:meth:`~Inventory.loads`); the work is done by :mod:`.listing` and :mod:`.bundles`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from .api import Backend, StoredItem
from .bundles import LoadResult, good_blobs, merge_bundle
from .check import check_entry
from .codec import Entry, Limits, SecretKeys, decode_bundle, encode_bundle, encode_entry
from .errors import CorruptEntryError, InvalidKeyError, RuntimeCacheError, SignatureError
from .keys import CacheKey
from .listing import OnProgress, OnSkip, list_entries, read_heads, read_info
from .stats import CacheStats, Counters, EntryInfo
from .stored_sizes import stored_item

__all__ = ["Inventory", "KeyLike", "key_text"]

KeyLike = CacheKey | str


def key_text(key: object) -> str:
    """The text of ``key``, a :class:`CacheKey` or such a text; :class:`TypeError` for any
    other (``get(123)`` was a miss, where ``put(123, ...)`` raises)."""
    if isinstance(key, (CacheKey, str)):
        return str(key)
    raise TypeError(
        f"a cache key is a CacheKey from make_key() or its text, not {type(key).__name__}"
    )


class _Host(Protocol):
    """What :class:`Inventory`'s methods use of the cache they belong to."""

    limits: Limits
    enabled: bool
    _secret: SecretKeys | None
    _counters: Counters[CacheStats]
    _generation: int
    _saved_generation: int

    @property
    def backend(self) -> Backend: ...

    def decode(self, skey: str, blob: bytes) -> Entry: ...

    def _failed(self, op: str, exc: Exception) -> None: ...

    def _store_held(self, blobs: Mapping[str, bytes]) -> tuple[int, list[InvalidKeyError]]: ...

    def entries(
        self,
        runtime: str | None = None,
        purpose: str | None = None,
        module_id: str | None = None,
        *,
        on_skip: OnSkip | None = None,
    ) -> Iterator[EntryInfo]: ...


class Inventory:
    """The listing and bundle methods of :class:`~runtime_cache.cache.Cache`."""

    def entries(
        self: _Host,
        runtime: str | None = None,
        purpose: str | None = None,
        module_id: str | None = None,
        *,
        on_skip: OnSkip | None = None,
    ) -> Iterator[EntryInfo]:
        """Iterate over entry metadata, filtered, without loading values.

        Entries that vanish while listing are left out. Entries that fail the
        check, or that the backend cannot read, are left out too and told to
        ``on_skip(key, reason)`` when given. Use
        :func:`runtime_cache.maintenance.verify` to find and remove bad ones.
        """
        return list_entries(
            self.backend, self.limits, self._failed, runtime, purpose, module_id, on_skip
        )

    def heads(
        self: _Host, prefix: str = "", *, headers: dict[str, bytes] | None = None
    ) -> Iterator[tuple[StoredItem, EntryInfo | RuntimeCacheError]]:
        """Each stored item under the storage-key ``prefix`` with its metadata, or the error
        its head raised (corrupt, or unreadable here): what maintenance weighs. Entries that
        vanish meanwhile are left out. ``headers``, where given, gets each good entry's
        frame header as read, by storage key: what :meth:`delete_if_unchanged` compares."""
        return read_heads(self.backend, self.limits, self._failed, prefix, headers)

    def info(self: _Host, key: KeyLike) -> EntryInfo | None:
        """The metadata of one entry (never its value), or ``None`` when it is absent.

        Raises :class:`CorruptEntryError` when the entry's head does not decode
        or holds another key. The signature is not checked (see :meth:`decode`).
        """
        skey = key_text(key)
        stored = stored_item(self.backend, skey)
        try:
            info = read_info(self.backend, stored or StoredItem(skey, 0), self.limits)
        except KeyError:
            return None
        if info.key != skey:
            raise CorruptEntryError(f"entry stored under {skey!r} holds key {info.key!r}")
        return info

    def dumps(
        self: _Host,
        runtime: str | None = None,
        purpose: str | None = None,
        module_id: str | None = None,
        keys: Iterable[KeyLike] | None = None,
        *,
        on_progress: OnProgress | None = None,
        on_skip: OnSkip | None = None,
        sign_unsigned: bool = False,
    ) -> bytes:
        """Return a bundle of entries (all, or those matching the filters) as bytes.

        Entries keep their signatures; with a secret set, the bundle is signed
        too. An unfiltered dump clears :attr:`dirty`. Entries are read in
        batches of :data:`DUMP_BATCH`, after each of which ``on_progress(done,
        total)`` is told; corrupt or unreadable entries are left out and told
        to ``on_skip(key, reason)``. With a secret, an unsigned entry is left out
        too, unless ``sign_unsigned``: then it is signed with the secret (after
        its checksum and key check), for a private store whose entries the
        caller vouches for. A shared store's are anyone's: :class:`ValueError`.
        """
        check: Callable[[str, bytes], object] = self.decode
        if sign_unsigned:
            check = _signing_check(self.decode, self._secret, self.backend, self.limits)
        generation = self._generation
        sizes: dict[str, int] | None = None
        if keys is not None:
            wanted = [str(k) for k in keys]
        else:
            listed = self.entries(runtime, purpose, module_id, on_skip=on_skip)
            sizes = {info.key: info.stored_size for info in listed}  # (the keys alone kept)
            wanted = list(sizes)
        blobs = good_blobs(
            self.backend,
            wanted,
            check,
            self._failed,
            on_skip=on_skip,
            on_progress=on_progress,
            sizes=sizes,
        )
        if keys is None and runtime is None and purpose is None and module_id is None:
            self._saved_generation = generation
        return encode_bundle(blobs, secret=self._secret)

    def unbundle(self: _Host, data: bytes) -> list[bytes]:
        """The entries of bundle ``data``, which is checked as a whole as :meth:`loads`
        checks it (its checksum, its limits, and with a secret its own signature); each
        entry is left to :meth:`check`. Raises :class:`InvalidBundleError`."""
        return decode_bundle(data, secret=self._secret, limits=self.limits)

    def loads(self: _Host, data: bytes, *, overwrite: bool = True) -> LoadResult:
        """Merge a bundle into the cache; return how many entries were accepted.

        The bundle must be well formed (else :class:`InvalidBundleError`); single
        entries that fail the entry check (checksum, signature, key against
        parts) are skipped and counted as corrupt or rejected. Without a secret,
        the entries are unsigned: they are never written to a shared store
        (the result's ``withheld``). ``overwrite=False`` keeps the entries the
        cache holds that pass its check (and newer formats'), in every tier of a
        tiered cache; damaged, rejected or missing ones are replaced. The result
        is an ``int`` with the details of a :class:`~runtime_cache.bundles.LoadResult`.
        """
        result = merge_bundle(
            data,
            self.backend,
            secret=self._secret,
            limits=self.limits,
            store=self._store_held if self.enabled else None,
            failed=self._failed,
            overwrite=overwrite,
        )
        self._counters.add(rejected=result.rejected, corrupt=result.corrupt)
        return result


def _signing_check(
    decode: Callable[[str, bytes], Entry],
    secret: SecretKeys | None,
    backend: Backend,
    limits: Limits,
) -> Callable[[str, bytes], object]:
    """For :meth:`Inventory.dumps`: ``decode`` each blob, and sign an unsigned one with
    ``secret`` (the blob then returned)."""
    if secret is None:
        raise ValueError("signing entries needs a secret")
    if backend.shared:
        raise ValueError(
            f"not signing the entries of a shared store ({backend!r}): anyone who can "
            "write it could have put them there"
        )

    def check(skey: str, blob: bytes) -> object:
        try:
            return decode(skey, blob)
        except SignatureError:
            entry = check_entry(skey, blob, secret=None, limits=limits).entry()
            if entry.signed:
                raise  # signed with another secret: someone else's to vouch for
            return encode_entry(
                entry.key,
                entry.parts,
                entry.value,
                created_at=entry.created_at,
                build_seconds=entry.build_seconds,
                producer=entry.producer,
                secret=secret,
                extra=entry.extra,
            )

    return check
