"""``runtime-cache export`` and ``import``: bundles that ship a pre-filled cache with an app.

A bundle is :meth:`runtime_cache.Cache.dumps` output. Entries keep their own
checksums and signatures; with a secret set the bundle is signed as a whole
too. Work goes in batches so that a progress bar can show on a terminal (and
only there).

Files are handled with care: ``export`` writes a fresh temp file beside the
target (``mkstemp``: created exclusively, never through a planted link) and
renames it into place. ``import`` and its careful reading are in
:mod:`runtime_cache.cli.bundle_import`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

from .. import environment
from ..codec import (
    bundle_count,
)
from .bundle_import import BundleFileError, cmd_import, max_bundle_size, read_import
from .context import CommandContext, Handler, Skipped, UsageError, binary_stdout
from .fmt import Progress, clean, human_size
from .fmt import count as fmt_count
from .inspect import add_json, filters
from .output import is_stdout, link_replaced, open_output, write_all, write_output
from .output_path import Output

__all__ = ["add_parsers", "cmd_export", "cmd_import", "max_bundle_size"]

AddCommand = Callable[[str, Handler, str, Sequence[str]], argparse.ArgumentParser]


def add_parsers(add: AddCommand) -> None:
    """Register ``export`` and ``import``."""
    export = add(
        "export",
        cmd_export,
        "Write entries to a bundle file, to ship a pre-filled cache with an app "
        "(signed when a secret is set). Exit code 1 when entries were left out as corrupt "
        "or unreadable, or when there is no entry to export (the file is then not written).",
        [
            "runtime-cache export kernels.rcb --runtime opencl",
            'runtime-cache --secret "$APP_SECRET" export kernels.rcb --json',
            "runtime-cache export - --module resnet18@3f2a > resnet.rcb",
        ],
    )
    export.add_argument(
        "file",
        metavar="FILE",
        help="bundle to write ('-' for stdout: with '> FILE' the shell makes FILE before "
        "the command runs, so it is left empty where nothing is exported); its folder must "
        "exist, as for a shell's >",
    )
    export.add_argument(
        "--sign",
        action="store_true",
        help="sign the unsigned entries of a private cache with the secret (they are left "
        "out otherwise when a secret is set); refused for a shared store",
    )
    export.set_defaults(reads_only=True, check=_export_check)
    filters(export)
    add_json(export)

    imp = add(
        "import",
        cmd_import,
        "Merge a bundle file into the cache; entries that fail "
        "their checksum, key or signature are skipped. Exit code 1 when the bundle is "
        "invalid or some of its entries were not written (refused by the checks, native "
        "code from an unsigned bundle, which only a signed one brings, or a key the store "
        "cannot hold: a dir:// folder takes no key component that ends in .rce; the rest "
        "are written), or are no longer "
        "there afterwards (a size cap smaller than the bundle evicted them), or when a tier "
        "of a tiered store did not write them: the report names it, and says where it may "
        "still serve older copies (a read-only folder, which cannot remove them).",
        [
            "runtime-cache import kernels.rcb",
            "runtime-cache import kernels.rcb --keep-existing --json",
            "curl -s https://example.org/kernels.rcb | runtime-cache import -",
        ],
    )
    imp.set_defaults(prepare=read_import, check=_import_check)
    imp.add_argument(
        "file",
        metavar="FILE",
        help="bundle to read ('-' for stdin, kept in a temporary file in TMPDIR first)",
    )
    imp.add_argument(
        "--keep-existing",
        action="store_true",
        help="do not replace entries the cache already holds (one that fails the check, "
        "damaged or not signed with the secret, is replaced)",
    )
    add_json(imp)


def _open_file(path: str) -> Output | None:
    """Where the bundle goes, opened before it is built (a terminal is refused then);
    ``None``: standard output (``-``)."""
    if path == "-":
        return None
    try:
        return open_output(path)
    except OSError as exc:
        raise BundleFileError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_file(path: str, output: Output | None, data: bytes) -> str:
    """Write the bundle; return why a link at ``path`` was replaced, not followed."""
    if output is None:
        stream = binary_stdout()
        write_all(stream, data)
        stream.flush()
        return ""
    try:
        return write_output(output, data)
    except OSError as exc:
        raise BundleFileError(f"cannot write {path}: {exc.strerror or exc}") from None


def _import_check(args: argparse.Namespace) -> None:
    if not args.file:  # (an unset variable in a script: `import "$IN"`)
        raise UsageError("import needs a file name (or - for standard input), not ''")


def _export_check(args: argparse.Namespace) -> None:
    if not args.file:  # (an unset variable in a script: `export "$OUT"`)
        raise UsageError("export needs a file name (or - for standard output), not ''")
    if args.sign and not (args.secret or args.secret_file or environment.read_secret()):
        raise UsageError("--sign needs a secret: --secret, --secret-file or RUNTIME_CACHE_SECRET")


def cmd_export(args: argparse.Namespace, ctx: CommandContext) -> int:
    """Write the entries matching the filters to a bundle; exit code 1 if bad ones were left out."""
    if is_stdout(args.file):  # (/dev/stdout, /dev/fd/1 too)
        binary_stdout()  # refused on a terminal before any work
    # Asked before the file is replaced: one that stdout was sent to (`export F > F`) is
    # another file after, and the report went into the one removed.
    into_stdout = is_stdout(args.file)
    if into_stdout:  # (/dev/stdout too): it holds the bundle, so no JSON error
        ctx.json = False
    try:
        output = _open_file(args.file)
    except BundleFileError as exc:
        return ctx.fail(str(exc))
    try:
        return _export(args, ctx, into_stdout, output)
    finally:
        if output is not None:
            output.close()  # (closed already where written)


def _export(
    args: argparse.Namespace, ctx: CommandContext, into_stdout: bool, output: Output | None
) -> int:
    cache = ctx.cache
    skipped = Skipped()
    progress = Progress(0, "export", ctx.err, enabled=not args.json and ctx.is_terminal())
    try:
        try:
            data = cache.dumps(
                args.runtime,
                args.purpose,
                args.module,
                on_progress=progress.at,
                on_skip=skipped,
                sign_unsigned=args.sign,
            )
        except ValueError as exc:  # --sign on a shared store
            raise UsageError(str(exc)) from None
    finally:
        progress.close()
    wanted = [
        f"--{name} {clean(value)}"
        for name in ("runtime", "purpose", "module")
        if (value := getattr(args, name, None))
    ]
    count = bundle_count(data)
    if wanted and not count:
        # A typo in a filter must not replace the file with an empty bundle.
        return ctx.fail(f"no entry matches {' '.join(wanted)}; {args.file} not written")
    # Nor may entries all left out (unsigned, with a secret set), or an empty cache: the file
    # is kept as it was (GNU tar, too, refuses to make an empty archive).
    written = bool(count)
    try:
        replaced = _write_file(args.file, output, data) if written else None
    except BundleFileError as exc:
        return ctx.fail(str(exc))
    if replaced:
        print(link_replaced(args.file, replaced), file=ctx.err)
    signed = cache.signed
    report = {
        "file": args.file,
        "entries": count,
        "bytes": len(data) if written else 0,
        "signed": signed,
        "left_out": [key for key, _ in skipped.items],
        "skipped": len(skipped),
        "written": written,
    }
    if args.json and into_stdout:
        print(json.dumps(report, indent=2), file=ctx.err)  # stdout holds the bundle
    elif args.json:
        ctx.emit_json(report)
    else:
        where = ctx.err if into_stdout else ctx.out
        print(
            f"exported {fmt_count(count, 'entry', 'entries')} ({human_size(len(data))}, "
            f"{'signed' if signed else 'unsigned'}) to {clean(args.file)}"
            if written
            else f"no entry {'exported' if skipped else 'to export'}; "
            f"{clean(args.file)} not written",
            file=where,
        )
        skipped.report(ctx, sign_hint=signed and not args.sign and not cache.backend.shared)
    return 1 if skipped or not written else 0
