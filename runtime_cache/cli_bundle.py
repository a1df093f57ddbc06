"""``runtime-cache export`` and ``import``: bundles that ship a pre-filled cache with an app.

A bundle is :func:`runtime_cache.codec.encode_bundle` output, the same format as
:meth:`runtime_cache.Cache.dumps`. Entries keep their own checksums and
signatures; with a secret set the bundle is signed as a whole too. Work goes in
batches so that a progress bar can show on a terminal (and only there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TextIO, TypeVar

from .cli_context import CommandContext
from .cli_format import human_size
from .codec import decode_bundle, encode_bundle, normalize_secret
from .errors import CorruptEntryError, InvalidBundleError

__all__ = ["BATCH", "Progress", "cmd_export", "cmd_import"]

#: Entries per backend round trip (and per progress step).
BATCH = 256

T = TypeVar("T")


def _batches(items: Sequence[T], size: int = BATCH) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Progress:
    """A one-line progress bar on ``stream``, drawn only when ``stream`` is a terminal."""

    def __init__(self, label: str, total: int, stream: TextIO, *, enabled: bool | None = None):
        self.label, self.total, self.stream, self.done = label, total, stream, 0
        if enabled is None:
            try:
                enabled = stream.isatty()
            except (AttributeError, ValueError, OSError):
                enabled = False
        self.enabled = enabled and total > 0
        self._drawn = 0.0

    def update(self, amount: int) -> None:
        """Advance by ``amount`` items; redraw at most ten times a second."""
        self.done += amount
        now = time.monotonic()
        if self.enabled and (now - self._drawn > 0.1 or self.done >= self.total):
            self._drawn = now
            filled = int(30 * self.done / self.total)
            bar = "#" * filled + "." * (30 - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}")
            self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


def _write_file(path: str, data: bytes) -> None:
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    temp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
        os.replace(temp, path)  # never leave a half-written bundle under the real name
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def _read_file(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as handle:
        return handle.read()


def cmd_export(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Write the entries matching the filters to a bundle; exit code 1 if bad ones were left out."""
    cache = ctx.cache
    keys = [info.key for info in cache.entries(args.runtime, args.purpose, args.module)]
    progress = Progress("export", len(keys), ctx.err, enabled=None if not args.json else False)
    blobs: list[bytes] = []
    bad: list[str] = []
    for batch in _batches(keys):
        stored = cache.backend.peek_many(list(batch))  # exporting is not a use
        for skey in batch:
            blob = stored.get(skey)
            if blob is None:
                continue  # removed while we exported
            try:
                cache.decode(skey, blob)
            except CorruptEntryError:
                bad.append(skey)
                continue
            blobs.append(blob)
        progress.update(len(batch))
    progress.close()
    secret = normalize_secret(ctx.secret)
    data = encode_bundle(blobs, secret=secret)
    try:
        _write_file(args.file, data)
    except OSError as exc:
        print(f"runtime-cache: cannot write {args.file}: {exc}", file=ctx.err)
        return 1
    report = {
        "file": args.file,
        "entries": len(blobs),
        "bytes": len(data),
        "signed": secret is not None,
        "left_out": bad,
    }
    if args.json:
        ctx.emit_json(report)
    else:
        signed = "signed" if secret is not None else "unsigned"
        where = ctx.err if args.file == "-" else ctx.out
        print(
            f"exported {len(blobs)} entries ({human_size(len(data))}, {signed}) to {args.file}",
            file=where,
        )
        if bad:
            print(f"left out {len(bad)} bad entries; see `runtime-cache verify`", file=where)
    return 1 if bad else 0


def cmd_import(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Merge a bundle; exit code 1 if the bundle is invalid or some entries were refused."""
    cache = ctx.cache
    secret = normalize_secret(ctx.secret)
    try:
        data = _read_file(args.file)
        blobs = decode_bundle(data, secret=secret, limits=cache.limits)
    except OSError as exc:
        print(f"runtime-cache: cannot read {args.file}: {exc}", file=ctx.err)
        return 1
    except InvalidBundleError as exc:
        print(f"runtime-cache: {args.file} is not a valid bundle: {exc}", file=ctx.err)
        return 1
    before = cache.stats()
    progress = Progress("import", len(blobs), ctx.err, enabled=None if not args.json else False)
    accepted = unsigned = withheld = 0
    for batch in _batches(blobs):
        # Re-framed per batch so each step is one backend round trip; the whole
        # bundle's checksum and signature were checked above.
        result = cache.loads(encode_bundle(batch, secret=secret), overwrite=not args.keep_existing)
        accepted += result
        unsigned += result.unsigned
        withheld += result.withheld
        progress.update(len(batch))
    progress.close()
    after = cache.stats()
    rejected = after.rejected - before.rejected
    corrupt = after.corrupt - before.corrupt
    report = {
        "file": args.file,
        "in_bundle": len(blobs),
        "accepted": accepted,
        "rejected_signature": rejected,
        "corrupt": corrupt,
        "kept_existing": len(blobs) - accepted - rejected - corrupt - withheld,
        "unsigned": unsigned,
        "withheld_unsigned": withheld,
    }
    if args.json:
        ctx.emit_json(report)
    else:
        print(f"imported {accepted} of {len(blobs)} entries from {args.file}", file=ctx.out)
        if unsigned:
            print(f"{unsigned} entries are unsigned (no secret checked them)", file=ctx.out)
        if withheld:
            print(f"not written: {withheld} unsigned entries to a shared store", file=ctx.out)
        if rejected or corrupt:
            print(
                f"refused {rejected} with a missing or wrong signature and {corrupt} corrupt",
                file=ctx.out,
            )
    return 1 if rejected or corrupt or withheld else 0
