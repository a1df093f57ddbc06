"""``runtime-cache import``: read a bundle file with care and merge it into the cache.

``import`` reads only a regular file (or standard input), bounded in size and read as
its own framing says (:mod:`.bundle_read`), so a FIFO or a device is a clear error, not a
hang. A batch the store fails is written again one entry at a time: a full disk keeps what
fits, and an entry that cannot be replaced (an immutable file) is one failure among the
rest. With ``--keep-existing``, the entries already stored at a batch's keys are judged as
:mod:`runtime_cache.existing_entries` says: in a ``dir://`` folder by their heads, and
read whole one at a time where those pass, so the import holds at most one of them
besides the bundle; in Redis in batch reads, which it bounds (``max_batch_size``), the keys
one left out asked again in the next.
"""

from __future__ import annotations

import argparse

from .. import environment
from ..bundles import DUMP_BATCH, LoadResult, screen_bundle
from ..cache import Cache
from ..codec import (
    DEFAULT_LIMITS,
    SecretKeys,
    bundle_signed,
    decode_bundle,
    encode_bundle,
    normalize_secret,
)
from ..errors import (
    BackendError,
    BackendUnavailableError,
    InvalidBundleError,
    InvalidKeyError,
    ReadOnlyBackendError,
)
from ..urls import in_process_only
from .bundle_read import BundleFileError, max_bundle_size, read_bundle_file
from .context import CommandContext
from .fmt import Progress, clean
from .fmt import count as fmt_count
from .tier_writes import IN_PROCESS, PENDING, TierLosses, durable_tiers, say_losses, tier_counts

__all__ = ["BundleFileError", "cmd_import", "max_bundle_size"]


def read_import(args: argparse.Namespace, ctx: CommandContext) -> int | None:
    """Read and check the bundle of ``import`` before its cache opens (a missing or bad
        file makes no cache folder): its entries go to ``args.blobs``, whether it is signed to
    ``args.bundle_signed``; on failure, exit code 1.
        The CLI's caches check against the default limits."""
    secret = normalize_secret(ctx.secret)
    try:
        data = read_bundle_file(args.file, DEFAULT_LIMITS, secret is not None)
        args.blobs = decode_bundle(data, secret=secret, limits=DEFAULT_LIMITS)
        args.bundle_signed = bundle_signed(data)
    except MemoryError:
        return _unread(args, ctx, f"not enough memory to read {args.file}")
    except BundleFileError as exc:
        return _unread(args, ctx, str(exc))
    except InvalidBundleError as exc:
        return _unread(args, ctx, f"{args.file} is not a valid bundle: {exc}")
    return None


def cmd_import(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Merge a bundle (read by :func:`read_import`); exit code 1 if the bundle is invalid
    or some entries were refused."""
    cache = ctx.cache
    secret = normalize_secret(ctx.secret)
    blobs: list[bytes] = args.blobs
    if in_process_only(ctx.url or environment.read(environment.ENV_CACHE) or ""):
        why = f"this cache {IN_PROCESS}: the import would keep nothing; import into dir:// or "
        return _unread(args, ctx, why + "redis://")
    before = cache.stats()
    tiers_before = tier_counts(cache)
    progress = Progress(len(blobs), "import", ctx.err, enabled=not args.json and ctx.is_terminal())
    accepted = unsigned = withheld = code = repeats = newer = 0
    failures: list[str] = []  # entries the backend could not write (a full disk)
    unheld: list[str] = []  # entries whose key it cannot hold (dir://: a name ending .rce)
    overwrite = not args.keep_existing
    try:
        for start in range(0, len(blobs), DUMP_BATCH):
            batch = blobs[start : start + DUMP_BATCH]
            # Re-framed per batch so each step is one backend round trip; the whole
            # bundle's checksum and signature were checked above. A batch the backend
            # fails is written again one entry at a time: the entries that fit are kept.
            try:
                parts = [cache.loads(encode_bundle(batch, secret=secret), overwrite=overwrite)]
            except BackendUnavailableError:
                raise  # the server is down: nothing will be written, said once
            except BackendError:
                # A full disk, or entries that cannot be replaced (an immutable file): those
                # that fit are kept. A store that takes none (read-only) raises from there.
                parts = _one_by_one(cache, batch, secret, overwrite, failures, first=not accepted)
            for result in parts:
                accepted += result
                unsigned += result.unsigned
                withheld += result.withheld
                code += result.withheld_code
                repeats += result.repeated
                newer += result.newer
                unheld += result.unstorable_errors
            progress.step(advance=len(batch))
    except BackendError as exc:
        # Said once on stderr by the caller, as every command's store failure is; a script
        # reading --json gets a report too (it got nothing to parse).
        if args.json:
            report = {"file": args.file, "error": str(exc), "accepted": accepted}
            ctx.emit_json({**report, "in_bundle": len(blobs), "exit_code": 1})
        else:  # (what was written before the store failed: nothing, where it is read-only)
            print(
                f"imported {accepted} of {len(blobs)} entries from {clean(args.file)}: the "
                "store failed (below)",
                file=ctx.out,
            )
        raise
    finally:
        progress.close()
    flush = getattr(cache.backend, "flush", None)
    # A tier written in the background: its outcome is known once flushed.
    flushed = flush(_FLUSH_SECONDS) is not False if callable(flush) else True
    losses = TierLosses.between(tiers_before, tier_counts(cache))
    lost = losses.not_written
    if not flushed:
        lost[PENDING] = 1
    after = cache.stats()
    rejected = after.rejected - before.rejected
    corrupt = after.corrupt - before.corrupt
    # (not with a tier down: its listing would be partial, and that tier is said already)
    failures += unheld  # (not written either: said apart, below)
    gone = _gone(cache, blobs, secret, withheld + len(failures)) if accepted and not lost else 0
    kept_existing = len(blobs) - accepted - rejected - corrupt - newer - withheld - len(failures)
    report = {
        "file": args.file,
        "in_bundle": len(blobs),
        "accepted": accepted,
        "rejected_signature": rejected,
        "corrupt": corrupt,
        "newer_format": newer,
        "repeated_keys": min(repeats, kept_existing),
        "kept_existing": kept_existing - min(repeats, kept_existing),
        "unsigned": unsigned,
        "withheld_unsigned": withheld,
        "withheld_native_code": code,
        "not_written": len(failures),
        "unstorable_keys": len(unheld),
        "write_errors": failures[:5],
        "tiers_not_written": lost,
        "tiers_may_serve_older": losses.may_serve_older,
        "gone_since": gone,
    }
    if args.json:
        ctx.emit_json(report)
    else:
        print(f"imported {accepted} of {len(blobs)} entries from {clean(args.file)}", file=ctx.out)
        if report["kept_existing"]:
            kept = fmt_count(report["kept_existing"], "entry", "entries")
            flag = " (--keep-existing)" if args.keep_existing else ""
            print(f"kept {kept} already in the cache{flag}", file=ctx.out)
        if report["repeated_keys"]:
            again = fmt_count(report["repeated_keys"], "entry", "entries")
            print(f"{again} of the bundle repeated a key of an entry before them", file=ctx.out)
        if rejected or corrupt:
            print(
                f"refused {rejected} with a missing or wrong signature and {corrupt} corrupt",
                file=ctx.out,
            )
        if newer:
            print(
                f"left out {fmt_count(newer, 'entry', 'entries')} in a newer format than this "
                "version reads (a newer runtime-cache made the bundle: upgrade to import them)",
                file=ctx.out,
            )
        unchecked = secret is None and args.bundle_signed  # signed, but no secret to check
        if unchecked and unsigned:
            print(
                f"the bundle is signed, but no secret was given to check it: {unsigned} "
                "entries were read unchecked (give --secret, --secret-file or "
                "RUNTIME_CACHE_SECRET)",
                file=ctx.out,
            )
        elif unsigned:
            read = fmt_count(unsigned, "entry", "entries")
            print(f"{read} read had no signature to check (no secret)", file=ctx.out)
        if code:
            kind = "unchecked" if unchecked else "unsigned"
            print(
                f"not written: {code} {kind} entries that hold native code (a driver's "
                "cache files), which only a bundle signed with this cache's secret carries",
                file=ctx.out,
            )
        if withheld > code:
            print(
                f"not written: {withheld - code} unsigned entries to a shared store",
                file=ctx.out,
            )
        if len(failures) > len(unheld):
            print(
                f"not written: {fmt_count(len(failures) - len(unheld), 'entry', 'entries')} "
                f"the cache could not store ({clean(failures[0])})",
                file=ctx.out,
            )
        if unheld:
            print(
                f"not written: {fmt_count(len(unheld), 'entry', 'entries')} whose key this "
                f"store cannot hold ({clean(unheld[0])})",
                file=ctx.out,
            )
        if gone:
            print(
                f"{fmt_count(gone, 'entry', 'entries')} of the bundle's are no longer in the "
                "cache: a size cap evicts as entries come in (or another process removed them)",
                file=ctx.out,
            )
        say_losses(losses, ctx.out, durable_tiers(cache))
    return 1 if rejected or corrupt or newer or withheld or failures or lost or gone else 0


def _unread(args: argparse.Namespace, ctx: CommandContext, why: str) -> int:
    # A bundle that could not be read: said on stderr, and with --json on stdout too (a
    # script reading the report got nothing to parse).
    print(f"runtime-cache: {clean(why)}", file=ctx.err)
    if args.json:
        ctx.emit_json({"file": args.file, "error": why, "accepted": 0, "exit_code": 1})
    return 1


#: Seconds an import waits for a tier's background writes before it reports.
_FLUSH_SECONDS = 30.0


def _gone(cache: Cache, blobs: list[bytes], secret: SecretKeys | None, unwritten: int) -> int:
    """How many of the bundle's good entries the store no longer holds, beyond the
    ``unwritten`` ones (withheld or failed): a size cap evicted them as the rest came in
    (an import of 150 entries into a 40 KB dir:// cache said "imported 150", and 8 were
    left). 0 when the store cannot be listed: no claim is made."""
    wanted = set(screen_bundle(blobs, secret, cache.limits).accepted)
    try:
        held = sum(1 for key in cache.backend.keys("") if key in wanted)
    except BackendError:
        return 0
    return max(0, len(wanted) - held - unwritten)


def _one_by_one(
    cache: Cache,
    batch: list[bytes],
    secret: SecretKeys | None,
    overwrite: bool,
    failures: list[str],
    *,
    first: bool,
) -> list[LoadResult]:
    """Load ``batch`` an entry at a time; each the backend fails goes into ``failures``,
    unless the store holds it already, byte for byte (the failed batch wrote it: a full
    disk's report said "imported 0" of 51 entries stored).

    A store that is down raises at once. One that refused every entry as read-only
    raises too, when this is the ``first`` batch to be written: a read-only store is
    one error, not a refusal per entry. An entry it refused alone (an immutable file
    among writable ones) is one failure, and the rest go on.
    """
    results = []
    read_only: ReadOnlyBackendError | None = None
    for item in batch:
        try:
            results.append(cache.loads(encode_bundle([item], secret=secret), overwrite=overwrite))
        except BackendUnavailableError:
            raise
        except BackendError as exc:
            if isinstance(exc, ReadOnlyBackendError):
                read_only = read_only or exc
            screened = screen_bundle([item], secret, cache.limits)
            (skey,) = screened.accepted or ("",)
            try:
                there = cache.backend.peek_many([skey]).get(skey) if skey else None
            except (BackendError, InvalidKeyError):
                there = None
            if there == item:
                results.append(LoadResult(1, offered=1, unsigned=screened.unsigned))
            else:
                failures.append(str(exc))
    if read_only is not None and first and not any(results):
        raise read_only
    return results
