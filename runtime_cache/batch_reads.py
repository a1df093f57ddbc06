"""Many values in one backend call: :meth:`BatchReads.get_many` and `get_many_views`.

:class:`BatchReads` gives :class:`~runtime_cache.cache.Cache` these methods; each
blob passes :func:`runtime_cache.check.screen_many` (the one entry check) and is
counted as :meth:`Cache.get <runtime_cache.cache.Cache.get>` counts it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from .api import Backend
from .check import screen_many
from .codec import Limits, SecretKeys
from .errors import BackendUnavailableError, InvalidKeyError, PartialReadError
from .inventory import KeyLike, key_text
from .keys import CacheKey
from .refused_heads import RefusedHeads
from .stats import CacheStats, Counters

__all__ = ["BatchReads", "read_again"]


class _Host(Protocol):
    """What :class:`BatchReads`' methods use of the cache they belong to."""

    limits: Limits
    _secret: SecretKeys | None
    _counters: Counters[CacheStats]
    _heads: RefusedHeads

    @property
    def backend(self) -> Backend: ...

    def _failed(self, op: str, exc: Exception) -> None: ...

    def _succeeded(self, side: str = "read") -> None: ...

    def _discard(self, skey: str, blob: bytes) -> None: ...

    def get_many_views(
        self,
        keys: Iterable[KeyLike],
        *,
        count_misses: bool = True,
        defer_hits: dict[str, tuple[int, float]] | None = None,
    ) -> dict[str, memoryview]: ...


class BatchReads:
    """The batch read methods of :class:`~runtime_cache.cache.Cache`."""

    def get_many(self: _Host, keys: Iterable[KeyLike]) -> dict[str, bytes]:
        """Fetch many values in one backend call; returns ``{str(key): value}`` for hits."""
        return {skey: bytes(view) for skey, view in self.get_many_views(keys).items()}

    def get_many_views(
        self: _Host,
        keys: Iterable[KeyLike],
        *,
        count_misses: bool = True,
        defer_hits: dict[str, tuple[int, float]] | None = None,
    ) -> dict[str, memoryview]:
        """Like :meth:`get_many`, but each value is a read-only view into the stored blob.

        Verified exactly as :meth:`get_many` does, without copying the values:
        for consumers that hand large values straight to a driver (a view keeps
        its whole blob alive while it lives). ``count_misses=False`` for a read
        ahead of need, whose caller reads again what was missing and counts it
        then: keys not found are not counted as misses here (rejected and
        corrupt entries still are, under those names). ``defer_hits``, a dict, is for
        the same reader: hits are then not counted here either; each found key's ``(bytes
        read, seconds saved)`` goes into it, for :meth:`count_hits` when the value is
        used (a value read ahead and never used is no hit).
        """
        given = list(keys)
        wanted = [str(k) if type(k) is CacheKey else key_text(k) for k in given]
        heads = self._heads
        blobs: Mapping[str, bytes | tuple[bytes, ...]]
        try:  # in pieces, as one read takes them: the store applies the span's junk rule
            blobs = self.backend.get_many_parts(wanted, heads.span)
        except InvalidKeyError as exc:  # one key the store cannot hold: the others served
            blobs = _each_key(self, wanted, exc)
        except PartialReadError as exc:  # some unreadable: an error each, the rest served
            blobs = exc.found
            self._counters.add(errors=len(exc.failed) - 1)
            self._failed("get_many", exc)
        except Exception as exc:
            self._counters.add(misses=len(wanted) if count_misses else 0)
            self._failed("get_many", exc)
            return {}
        else:
            self._succeeded()
        whole = [k for k, b in blobs.items() if type(b) is tuple and heads.whole_again(k, b)]
        if whole:  # heads refused under other keys only: these keys read whole
            blobs = dict(blobs)
            for skey in whole:
                del blobs[skey]
            try:
                blobs.update(self.backend.peek_many(whole))
            except Exception as exc:  # (those are misses, as any read that fails)
                self._failed("get_many", exc)
        bad: dict[str, bytes] = {}

        def discard(skey: str, blob: bytes) -> None:
            self._discard(skey, blob)
            bad[skey] = blob

        def refused(skey: str, blob: bytes) -> None:
            self._heads.remember(skey, blob)
            bad[skey] = blob

        kept = self._heads.kept_head
        found, counts = screen_many(
            wanted, given, blobs, self._secret, self.limits, discard, defer_hits, refused, kept
        )
        if bad:
            # Removed as corrupt, or rejected (kept): read once more, since a tier below (a
            # fleet's shared store under a machine's own folder) may hold a good copy, which
            # the tiered read then copies up; before, the caller missed and built it again.
            again = list(
                {k: (k, a) for k, a in zip(wanted, given, strict=True) if k in bad}.values()
            )
            blobs = read_again(self.backend, bad, self._heads)
            more, extra = screen_many(
                [k for k, _ in again],
                [a for _, a in again],
                blobs,
                self._secret,
                self.limits,
                self._discard,
                defer_hits,
            )
            found.update(more)
            # Each time a key was asked for, it counted a miss (those not found again stay).
            counts["misses"] -= sum(1 for k in wanted if k in more)
            for name in ("hits", "bytes_read", "seconds_saved", "rejected", "corrupt"):
                counts[name] += extra[name]
        if not count_misses:
            counts["misses"] = 0
        if defer_hits is not None:
            del counts["hits"], counts["bytes_read"], counts["seconds_saved"]
        self._counters.add(**counts)
        return found

    def count_hits(
        self: _Host, tally: Iterable[tuple[int, float]], missed_before: bool = False
    ) -> None:
        """Count a hit for each ``(bytes read, seconds saved)`` in ``tally``: values that
        :meth:`get_many_views` read with ``defer_hits`` and that are used now.
        ``missed_before``: each was a miss, counted, at an earlier look for it (a value
        another process stored since, as a shared build loads it): that miss is taken back,
        so that the look counts one hit, as ``get_or_build`` counts it."""
        taken = 0
        for size, saved in tally:
            self._counters.hit(size, saved)
            taken += 1
        if missed_before and taken:
            self._counters.take_back(misses=taken)  # (none below zero: a reset between)


def _each_key(
    host: _Host, wanted: list[str], first: InvalidKeyError
) -> dict[str, tuple[bytes, ...]]:
    """``wanted`` read one key at a time, after a batch read refused one of them: each key
    the store cannot hold is a miss and a refusal (not an outage), the rest are served."""
    host._failed("get_many", first)
    blobs: dict[str, tuple[bytes, ...]] = {}
    for skey in dict.fromkeys(wanted):
        try:
            blobs.update(host.backend.get_many_parts([skey], host._heads.span))
        except InvalidKeyError:
            continue  # (counted once above: the batch's refusal)
        except PartialReadError as exc:  # this entry unreadable (a file of another user's)
            host._failed("get_many", exc)
        except BackendUnavailableError as exc:  # the store is down: the rest are misses
            host._failed("get_many", exc)
            break
        except Exception as exc:  # this key's own failure: the others are still read
            host._failed("get_many", exc)
    return blobs


def read_again(
    backend: Backend, bad: Mapping[str, bytes], heads: RefusedHeads | None = None
) -> dict[str, bytes]:
    """The keys of ``bad`` read once more, past the blobs the check refused (``bad``:
    removed as corrupt, or kept as rejected, maybe as their heads alone): what the store
    holds that differs from them (:meth:`~runtime_cache.api.Backend.get_many_past`, with
    the span of the cache's ``heads`` where it cuts them, so that a refused entry is not
    read whole again). Advisory: a failure reads as nothing found."""
    try:
        if heads is not None and heads.enabled:
            blobs = backend.get_many_past(bad, span=heads.span)
        else:
            blobs = backend.get_many_past(bad)
    except Exception:  # counted as misses already
        return {}
    return {k: b for k, b in blobs.items() if k in bad and bytes(b) != bad[k]}
