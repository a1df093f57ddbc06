"""The ``runtime-cache`` command: the parser, plug-ins, and :func:`main`.

Usage::

    runtime-cache ls --runtime opencl --sort size
    runtime-cache --secret-file ~/.rc-secret --cache redis://cache-host:6379/0 stats --json
    runtime-cache prune --max-size 500MB --older-than 30d
    runtime-cache export kernels.rcb --runtime opencl

``--cache URL`` picks the cache; without it the command uses the process-wide
provider (:func:`runtime_cache.get_cache`), that is ``RUNTIME_CACHE`` or the
embedded default folder. ``--secret`` (or ``RUNTIME_CACHE_SECRET``) signs what
is written and makes ``show``, ``verify`` and ``import`` check signatures.

Exit codes: 0 ok, 1 problems found (bad or skipped entries, missing keys, a failing
backend, an aborted ``clear``, a listing left partial by a tier or a folder that could not
be read), 2 usage errors (a bad option or URL, a shared store without a secret).

Plug-in subcommands come through the entry-point group ``runtime_cache.cli``:
each entry point names a function ``add_parser(subparsers)`` that adds one
subparser and sets ``set_defaults(handler=handler)``, where ``handler(args,
ctx)`` has the same signature as the built-in commands (see
:data:`~runtime_cache.cli.context.Handler`). The demo is registered that way::

    [project.entry-points."runtime_cache.cli"]
    demo = "runtime_cache.demo.cli:add_parser"
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any

from .._version import __version__
from ..api import READING_ONLY
from ..errors import (
    InsecureStoreError,
    InvalidSecretError,
    InvalidURLError,
    InvalidValueError,
    RuntimeCacheError,
    UnknownBackendError,
)
from ..urls import redact
from . import bundles, inspect, maintain
from .context import (
    CommandContext,
    Handler,
    UsageError,
    missing_folder,
    open_cache,
    resolve_secret,
    standard_output,
)
from .fmt import clean
from .log_lines import command_logging
from .output import TerminalOutput, WholeText, flush, is_stdout
from .partial import partial_result

__all__ = [
    "BUILTIN_PLUGINS",
    "PLUGIN_GROUP",
    "build_parser",
    "main",
    "open_cache",
    "plugins",
    "resolve_secret",
]

#: The entry-point group that CLI plug-ins register under.
PLUGIN_GROUP = "runtime_cache.cli"
#: This project's own plug-ins, found even where the package is not installed
#: (a source checkout); another distribution cannot take these names.
BUILTIN_PLUGINS: Mapping[str, str] = {"demo": "runtime_cache.demo.cli:add_parser"}

_USAGE_ERRORS = (
    UsageError,
    TerminalOutput,  # binary data for a terminal (`export -`, `show --raw /dev/tty`)
    InvalidURLError,
    InvalidValueError,
    UnknownBackendError,
    InsecureStoreError,  # a missing secret is a setting to give, like a bad URL option
    InvalidSecretError,  # --secret "" as much as an empty --secret-file
)


VERBOSE = "also print the library's warnings (the command reports errors itself)"


def plugins() -> dict[str, str]:
    """Plug-in command names to ``"module:function"`` targets, read without importing them."""
    found = dict(BUILTIN_PLUGINS)
    for point in entry_points(group=PLUGIN_GROUP):
        found.setdefault(point.name, point.value)
    return found


class _Parser(argparse.ArgumentParser):
    """An argument parser whose help and usage raise where they cannot be written
    (argparse drops the error: `--help > /dev/full` exited 0); its subcommands' too."""

    def _print_message(self, message: str, file: Any = None) -> None:
        if message:
            (file or sys.stderr).write(message)


def _global_options() -> _Parser:
    """--cache, --secret and --verbose, accepted before or after the subcommand."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=VERBOSE
    )
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
        help="shared secret: sign what is written, check signatures on show, verify and "
        "import (default: RUNTIME_CACHE_SECRET; 'NEW,OLD' while keys rotate accepts both and "
        "signs with NEW, each key of such a list of 16 or more characters)",
    )
    common.add_argument(
        "--secret-file",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="read the secret from a file, one key a line, the first signs "
        "(default: RUNTIME_CACHE_SECRET_FILE); keeps it off the command line",
    )
    return common


def examples(*lines: str) -> str:
    """A ``--help`` epilog listing example command lines."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser(plugin_targets: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """Build the argument parser of ``runtime-cache`` (also used to write docs/cli.md).

    ``plugin_targets`` maps plug-in names to ``"module:function"`` (default:
    :func:`plugins`).
    """
    common = _global_options()
    parser = _Parser(
        prog="runtime-cache",
        description="Inspect and maintain a runtime-cache: list, show, prune, verify, "
        "export and import entries.",
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit codes: 0 ok, 1 problems found (also when a tier could not be opened or "
        "read, or a folder of a dir:// cache could not be read: what is shown or done is "
        "partial), 2 usage error, 130 interrupted "
        "(Ctrl-C), 141 output cut short (a closed pipe).\n\n"
        'With --json, a command that fails also prints {"error": MESSAGE, "exit_code": N} on '
        "standard output, besides the message on standard error (import's report on failure "
        "has these keys too; a command that printed its report already adds nothing). A usage "
        "error that the argument parser finds (an unknown option, a missing argument: exit 2) "
        "is said on standard error only, and so is a failure of export - or show --raw -, "
        "whose standard output holds the bundle or the value.\n\n"
        + examples(
            "runtime-cache ls --sort size",
            "runtime-cache --secret-file ~/.rc-secret --cache redis://cache-host:6379/0 stats",
            "runtime-cache verify --repair",
        ),
    )
    parser.add_argument("--version", action="version", version=f"runtime-cache {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def add(
        name: str, handler: Handler, help_text: str, example_lines: Sequence[str]
    ) -> argparse.ArgumentParser:
        cmd = sub.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            epilog=examples(*example_lines),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.set_defaults(handler=handler, needs_cache=True)
        return cmd

    for module in (inspect, maintain, bundles):
        module.add_parsers(add)
    targets = plugins() if plugin_targets is None else plugin_targets
    for name, target in targets.items():
        if name not in sub.choices:
            _add_plugin(sub, name, target)
    return parser


def _add_plugin(sub: Any, name: str, target: str) -> None:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        # A plug-in whose own dependencies are missing: the other commands still work.
        print(f"runtime-cache: plug-in {name!r} not loaded: {exc}", file=sys.stderr)
        return
    add_parser = getattr(module, attr or "add_parser", None)
    if callable(add_parser):
        add_parser(sub)
    command = sub.choices.get(name)
    if command is not None:  # -v after a plug-in's name too, unless it has its own
        with contextlib.suppress(argparse.ArgumentError):
            command.add_argument(
                "--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help=VERBOSE
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``runtime-cache`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    _hold_standard_descriptors()
    saved = sys.stdout
    if saved is not None and not isinstance(saved, WholeText):
        sys.stdout = standard_output()  # print() goes out whole: --help's, a plug-in's
    try:
        return _main(argv)
    finally:
        sys.stdout = saved


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        return _settle_output(code)
    except OSError as exc:  # the help could not be written (a full disk, a cut pipe)
        return _output_failed(exc, 0)
    # A command that only reads writes nothing in a folder it reads (`ls` in one that is no
    # cache left a vacuum's marker there).
    reads = getattr(args, "reads_only", False) or getattr(args, "dry_run", False)
    reading = READING_ONLY.set(True) if reads else None
    try:
        with command_logging(getattr(args, "verbose", False)):
            return _settle_output(_run(args))
    finally:  # main() may run inside a host process (tests, notebooks)
        if reading is not None:
            READING_ONLY.reset(reading)


def _drop_output(*streams: Any) -> None:
    """Point ``streams`` at ``/dev/null``, so that the exit-time flush of what they still
    hold does not fail again ("Exception ignored", exit code 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def _settle_output(code: int) -> int:
    """Flush what standard output still holds. Where it cannot take it (``> /dev/full``,
    a full disk), say so once, unless an error was said already, and exit with 1."""
    out = sys.stdout
    if out is None:
        return code
    try:
        flush(out)
    except OSError as exc:
        return _output_failed(exc, code)
    return code


def _output_failed(exc: OSError, code: int) -> int:
    """Standard output could not be written: 141 where it was cut (quietly), else one
    line, unless an error was said already; what it still holds is dropped."""
    if isinstance(exc, BrokenPipeError):
        _drop_output(sys.stdout, sys.stderr)
        return code or 128 + 13
    _drop_output(sys.stdout)
    if code == 0:
        print(f"runtime-cache: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
    return code or 1


def _hold_standard_descriptors() -> None:
    """Open ``/dev/null`` on descriptors 0-2 where the process started with them closed
    (``>&-``): else the next file opened takes the number, and ``/dev/stdout`` (or a
    plug-in's print) would lead into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)


def _run(args: argparse.Namespace) -> int:
    args.cache = getattr(args, "cache", None)
    args.secret = getattr(args, "secret", None)
    args.secret_file = getattr(args, "secret_file", None)
    handler: Handler = args.handler
    # Made first, so that with --json every failure below is said on stdout too; not where
    # stdout holds a bundle or a value (FILE -), which the JSON would spoil.
    raw = getattr(args, "raw", None)
    data = (args.command == "export" and is_stdout(args.file)) or (
        raw is not None and is_stdout(raw)
    )
    ctx = CommandContext(url=args.cache, json=bool(getattr(args, "json", False)) and not data)
    if args.cache is not None and not args.cache.strip():  # --cache "$UNSET_VARIABLE"
        return _fail(ctx, "--cache needs a URL, such as dir:///path or redis://host:6379/0", 2)
    try:
        ctx.secret = resolve_secret(args.secret, args.secret_file)
    except RuntimeCacheError as exc:
        return _fail(ctx, str(exc), 2)
    try:
        getattr(args, "check", lambda _args: None)(args)  # a usage error before anything else
    except _USAGE_ERRORS as exc:
        return _fail(ctx, str(exc), 2)
    # A command that only reads or removes has nothing to do in a folder that is not there:
    # a typo'd folder is said so, and nothing is made there (import and put may make it).
    looks = getattr(args, "reads_only", False) or getattr(args, "removes_only", False)
    try:
        absent = missing_folder(args.cache) if looks else None
    except _USAGE_ERRORS as exc:
        return _fail(ctx, str(exc), 2)
    if absent is not None:
        made = "a command that only reads or removes creates none"
        return _fail(ctx, f"no cache at {absent} ({made})", 1)
    try:
        # What a command reads before its cache opens (import: its bundle), so that a bad
        # input makes no cache folder; an exit code ends the command there.
        prepared = getattr(args, "prepare", lambda _args, _ctx: None)(args, ctx)
        if prepared is not None:
            return int(prepared)
        if getattr(args, "needs_cache", False):
            try:
                ctx.cache  # noqa: B018 - opened here so that open errors read as such
            except _USAGE_ERRORS as exc:
                return _fail(ctx, str(exc), 2)
            except RuntimeCacheError as exc:
                return _fail(ctx, f"cannot open the cache: {exc}", 1)
        code = int(handler(args, ctx))
        if ctx.out is not None:  # (None: started with stdout closed)
            flush(ctx.out)  # here, not at exit: a full non-blocking stdout is waited on
        return partial_result(ctx, code, checks=args.command == "verify")
    except _USAGE_ERRORS as exc:
        return _fail(ctx, str(exc), 2)
    except RuntimeCacheError as exc:
        return _fail(ctx, f"{type(exc).__name__}: {exc}", 1)
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback; the shell's code for SIGINT
        print("runtime-cache: interrupted", file=sys.stderr)
        with contextlib.suppress(OSError):
            ctx.json_error("interrupted", 130)
        return 130
    except BrokenPipeError:
        # `runtime-cache ls | head`: the output was cut short. Quietly, with the code a
        # command killed by SIGPIPE has (as git and ls do): never 0, which would call a
        # failing command whose messages were cut off a success.
        _drop_output(sys.stdout, sys.stderr)
        return 128 + 13
    except OSError as exc:  # a file the user named: no traceback, its name and the reason
        where = f"{exc.filename}: " if isinstance(exc.filename, str) and exc.filename else ""
        return _fail(ctx, f"{where}{exc.strerror or exc}", 1)
    finally:
        ctx.close()


def _fail(ctx: CommandContext, message: str, code: int) -> int:
    """Say why the command failed on stderr, and with ``--json`` as JSON on stdout too."""
    print(f"runtime-cache: error: {clean(redact(message))}", file=sys.stderr)
    with contextlib.suppress(OSError):  # stdout cannot take it: the line above said why
        ctx.json_error(message, code)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
