"""The ``runtime-cache`` command: inspect, prune, verify, export and import a cache.

Usage::

    runtime-cache ls --runtime opencl --sort size
    runtime-cache --cache redis://cache-host:6379/0 stats --json
    runtime-cache prune --max-size 500MB --older-than 30d
    runtime-cache export app-assets/kernels.rcb --runtime opencl

``--cache URL`` picks the cache; without it the command uses the process-wide
provider (:func:`runtime_cache.get_cache`), that is ``RUNTIME_CACHE`` or the
embedded default folder. ``--secret`` (or ``RUNTIME_CACHE_SECRET``) signs what
is written and makes ``verify`` and ``import`` check signatures.

Exit codes: 0 ok, 1 problems found (bad entries, missing keys, a failing
backend, an aborted ``clear``), 2 usage errors.

Plug-in subcommands: a module that exposes ``add_parser(subparsers)`` (today
``runtime_cache.demo.cli``) adds its own parser and sets a handler with
``set_defaults(func=handler)``; ``handler(args)`` returns an exit code (or
``None`` for 0). ``args.cache`` and ``args.secret`` hold the global options.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import environment
from ._version import __version__
from .api import parse_duration, parse_size
from .cache import Cache
from .cli_bundle import cmd_export, cmd_import
from .cli_commands import SORTS, cmd_clear, cmd_ls, cmd_prune, cmd_rm, cmd_show, cmd_verify
from .cli_context import CommandContext, UsageError
from .cli_stats import cmd_stats
from .errors import InvalidURLError, RuntimeCacheError, UnknownBackendError

__all__ = ["PLUGINS", "build_parser", "main", "open_cache"]

#: Modules that may add subcommands through ``add_parser(subparsers)``; missing ones are skipped.
PLUGINS = ("runtime_cache.demo.cli",)

Handler = Callable[[argparse.Namespace, CommandContext], int]


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except InvalidURLError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except InvalidURLError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _global_options() -> argparse.ArgumentParser:
    """--cache and --secret, accepted before or after the subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--cache",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="backend URL of the cache, e.g. dir:///var/cache/app or redis://host:6379/0 "
        "(default: RUNTIME_CACHE, else the embedded default folder)",
    )
    common.add_argument(
        "--secret",
        default=argparse.SUPPRESS,
        help="shared secret: sign what is written, check signatures on verify and import "
        "(default: RUNTIME_CACHE_SECRET; 'new,old' accepts both and signs with new)",
    )
    common.add_argument(
        "--secret-file",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="read the secret from a file, one key a line, the first signs "
        "(default: RUNTIME_CACHE_SECRET_FILE); keeps it off the command line",
    )
    return common


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime", help="only entries of this runtime, e.g. opencl")
    parser.add_argument("--purpose", help="only entries of this purpose, e.g. program-binary")
    parser.add_argument("--module", help="only entries of this module id")


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser(plugins: Sequence[str] = PLUGINS) -> argparse.ArgumentParser:
    """Build the argument parser of ``runtime-cache`` (also used to write docs/cli.md)."""
    common = _global_options()
    parser = argparse.ArgumentParser(
        prog="runtime-cache",
        description="Inspect and maintain a runtime-cache: list, show, prune, verify, "
        "export and import entries.",
        parents=[common],
        epilog="Exit codes: 0 ok, 1 problems found, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"runtime-cache {__version__}")
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also print the library's warnings (the command reports errors itself)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        cmd.set_defaults(handler=handler)
        return cmd

    ls = add(
        "ls",
        cmd_ls,
        "List entries as a table: key, runtime, purpose, module, device, "
        "size, age, build time, hits.",
    )
    _filters(ls)
    ls.add_argument(
        "--sort",
        choices=sorted(SORTS),
        default="key",
        help="order: key (A-Z), size (largest first), age (oldest first), build (slowest "
        "first), hits (most first), last (most recently used first)",
    )
    ls.add_argument("--reverse", action="store_true", help="reverse the order")
    ls.add_argument("--full-keys", action="store_true", help="show whole keys, not short digests")
    _json(ls)

    show = add("show", cmd_show, "Show one entry's key parts and metadata (never its value).")
    show.add_argument(
        "key", help="a whole key, a unique prefix of one, or of its digest as ls shows it"
    )
    show.add_argument("--raw", metavar="FILE", help="also write the entry's value to FILE")
    _json(show)

    stats = add(
        "stats",
        cmd_stats,
        "Entries, bytes, hits, hit rate and seconds saved, overall and per runtime and purpose.",
    )
    _filters(stats)
    _json(stats)

    rm = add("rm", cmd_rm, "Remove entries by key (exit code 1 if any is missing).")
    rm.add_argument("keys", nargs="+", metavar="KEY", help="whole keys or unique digest prefixes")

    clear = add("clear", cmd_clear, "Remove every entry (asks first unless --yes).")
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    prune = add(
        "prune",
        cmd_prune,
        "Remove entries unused for a while, then least recently "
        "used ones until the cache fits a size.",
    )
    prune.add_argument("--max-size", type=_size, metavar="SIZE", help="e.g. 500MB or 2GiB")
    prune.add_argument("--older-than", type=_duration, metavar="AGE", help="e.g. 30d, 12h, 90m")
    _json(prune)

    export = add(
        "export",
        cmd_export,
        "Write entries to a bundle file, to ship a pre-filled "
        "cache with an app (signed when a secret is set).",
    )
    export.add_argument("file", metavar="FILE", help="bundle to write ('-' for stdout)")
    _filters(export)
    _json(export)

    imp = add(
        "import",
        cmd_import,
        "Merge a bundle file into the cache; entries that fail "
        "their checksum, key or signature are skipped.",
    )
    imp.add_argument("file", metavar="FILE", help="bundle to read ('-' for stdin)")
    imp.add_argument(
        "--keep-existing",
        action="store_true",
        help="do not replace entries the cache already holds",
    )
    _json(imp)

    verify = add(
        "verify",
        cmd_verify,
        "Check every entry's checksum, key and (with a secret) "
        "signature; exit code 1 when bad ones are found.",
    )
    verify.add_argument("--repair", action="store_true", help="remove the bad entries")
    _json(verify)

    for name in plugins:
        _add_plugin(sub, name, common)
    return parser


def _add_plugin(sub: Any, module_name: str, common: argparse.ArgumentParser) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            return  # the plug-in is simply not there
        raise
    add_parser = getattr(module, "add_parser", None)
    if callable(add_parser):
        add_parser(sub)


def resolve_secret(secret: str | None, secret_file: str | None = None) -> list[str] | None:
    """``--secret-file``, else ``--secret``, else the environment (see
    :func:`runtime_cache.environment.read_secret`), else ``None``; keys split at commas."""
    if secret_file is not None:
        return environment.read_secret_file(secret_file)
    if secret is not None:
        return [key.strip() for key in secret.split(",")]
    return environment.read_secret()


def open_cache(url: str | None, secret: str | None, secret_file: str | None = None) -> Cache:
    """Open the cache the command works on: ``url``, else the process-wide provider's backend.

    The returned cache is strict, so a failing backend is reported instead of
    looking empty.
    """
    from .provider import get_cache
    from .registry import open_backend

    keys = resolve_secret(secret, secret_file)
    if url:
        return Cache(open_backend(url), strict=True, secret=keys)
    provider = get_cache()
    if not provider.enabled:
        raise UsageError(
            "caching is off (RUNTIME_CACHE=off, or the default cache could not be opened); "
            "pass --cache URL"
        )
    return Cache(provider.backend, strict=True, secret=keys)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``runtime-cache`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    # The cache is strict here, so failures come back as errors that the command
    # reports; the library's own warnings ("carrying on without the cache") only
    # confuse a one-shot command unless asked for.
    logging.basicConfig(format="%(message)s")
    logger = logging.getLogger("runtime_cache")
    saved_level = logger.level
    logger.setLevel(logging.WARNING if args.verbose else logging.ERROR)
    try:
        return _run(args)
    finally:
        logger.setLevel(saved_level)  # main() may run inside a host process (tests, notebooks)


def _run(args: argparse.Namespace) -> int:
    args.cache = getattr(args, "cache", None)
    args.secret = getattr(args, "secret", None)
    args.secret_file = getattr(args, "secret_file", None)
    handler = getattr(args, "handler", None)
    if handler is None:  # a plug-in subcommand
        result = args.func(args)
        return 0 if result is None else int(result)
    try:
        cache = open_cache(args.cache, args.secret, args.secret_file)
    except (UsageError, InvalidURLError, UnknownBackendError) as exc:
        return _fail(str(exc), 2)
    except RuntimeCacheError as exc:
        return _fail(f"cannot open the cache: {exc}", 1)
    try:
        return int(
            handler(
                args,
                CommandContext(
                    cache, sys.stdout, sys.stderr, resolve_secret(args.secret, args.secret_file)
                ),
            )
        )
    except UsageError as exc:
        return _fail(str(exc), 2)
    except RuntimeCacheError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", 1)
    except BrokenPipeError:  # `runtime-cache ls | head`: the reader has seen enough
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit-time flush does not fail again
        return 0
    finally:
        cache.close()


def _fail(message: str, code: int) -> int:
    print(f"runtime-cache: error: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
