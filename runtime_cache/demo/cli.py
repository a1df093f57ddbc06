"""``runtime-cache demo``: time to first inference, cold and then warm.

The demo runs the model's first inference in a fresh process twice:

* **cold**: the demo's entries are removed from the cache first, and the
  driver's own caches are off (``POCL_KERNEL_CACHE=0``, ``CUDA_CACHE_DISABLE=1``)
  unless ``--driver-cache`` is given, so every layer is tuned on the device and
  every program compiled from source;
* **warm**: tuning records and program binaries both come from the cache.

Each run is a child process of its own (:mod:`.runs`). It prints each run's time to
first inference split into setup, compile, tune, load and run, the speedup, and whether
the outputs are identical.

Interface with the ``runtime-cache`` command: the entry point ``demo`` in the
group ``runtime_cache.cli`` names :func:`add_parser`::

    add_parser(subparsers) -> argparse.ArgumentParser
        registers "demo" on an argparse subparsers object, with
        set_defaults(handler=command), the handler signature of every
        runtime-cache command: command(args, ctx) -> int
    run_demo(args: argparse.Namespace) -> int
        runs the demo; returns the exit code: 0 done and outputs identical,
        1 the demo failed, the outputs differ, or the cache did not work (the
        warm run got no hits, or nothing was stored), 2 it cannot run here (no
        OpenCL device that can build, an unusable cache URL or backend)

It also runs on its own: ``python -m runtime_cache.demo --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import environment
from ..cache import Cache
from ..errors import BackendError, RuntimeCacheError
from ..provider import OFF
from ..urls import folder_url, in_process_only, redact, redacted
from .entries import demo_entries, remove_entries
from .errors import DemoError
from .report import compare, format_text
from .runs import child_env, run_child, write_secret_file

if TYPE_CHECKING:
    from ..cli.context import CommandContext

__all__ = ["DemoError", "add_parser", "build_parser", "command", "main", "run_demo"]


def _options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    # SUPPRESS: a default here would overwrite the main command's global --cache.
    parser.add_argument(
        "--cache",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="the cache to use (default: RUNTIME_CACHE, else the user cache folder); "
        "a shared one, e.g. redis://host:6379/0, needs RUNTIME_CACHE_SECRET",
    )
    parser.add_argument(
        "--secret",
        default=argparse.SUPPRESS,
        help="the shared secret (default: RUNTIME_CACHE_SECRET; 'NEW,OLD', each of 16 or "
        "more characters, accepts both)",
    )
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="read the secret from a file, one key a line (default: RUNTIME_CACHE_SECRET_FILE)",
    )
    parser.add_argument(
        "--device",
        metavar="SPEC",
        help="an OpenCL device: an index, or part of its name (default: PYOPENCL_CTX, "
        "else the first device that can build)",
    )
    parser.add_argument(
        "--model", default=None, choices=("cnn", "tiny"), help="the model (default: cnn)"
    )
    parser.add_argument(
        "--tiny", action="store_true", help="the 5-layer model (same as --model tiny)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the demo's entries in the cache afterwards (see `runtime-cache ls`)",
    )
    parser.add_argument(
        "--driver-cache",
        action="store_true",
        help="leave the driver's own kernel caches on during the cold run, in their usual "
        "folders (runtime-cache then does not carry them)",
    )
    parser.add_argument(
        "--fresh-driver-cache",
        action="store_true",
        help="start the warm run with a new, empty driver cache folder, as a fresh container "
        "would; runtime-cache restores the driver's files into it",
    )
    parser.add_argument(
        "--no-carry-driver-cache",
        dest="carry_driver_cache",
        action="store_false",
        help="do not carry the driver's own JIT cache through runtime-cache (on by default)",
    )
    return parser


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``demo`` subcommand on ``subparsers``; its handler is :func:`command`."""
    text = "Time a model's first inference cold, then warm from the cache."
    parser = _options(
        subparsers.add_parser(
            "demo",
            help=text,
            description=text,
            epilog="examples:\n  runtime-cache demo\n  runtime-cache demo --tiny --json\n"
            "  runtime-cache --secret-file ~/.rc-secret --cache redis://cache-host:6379/0 demo",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    parser.set_defaults(handler=command)
    return parser


def command(args: argparse.Namespace, ctx: CommandContext) -> int:
    """The ``runtime-cache demo`` handler: :func:`run_demo` (it opens caches of its own,
    with the global ``--secret`` or ``--secret-file`` when one was given)."""
    if isinstance(ctx.secret, list):
        args.secret_keys = ctx.secret
    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m runtime_cache.demo``."""
    return _options(
        argparse.ArgumentParser(
            prog="python -m runtime_cache.demo",
            description="Time a model's first inference cold, then warm from the cache.",
        )
    )


# ---------------------------------------------------------------------- the cache
def _cache_url(args: argparse.Namespace) -> tuple[str, str]:
    """The URL the runs use, and the same with the default folder spelled out."""
    url = getattr(args, "cache", None) or environment.read(environment.ENV_CACHE) or "dir://"
    # (escaped: a home folder with a space, "#" or "%" is pasted back into --cache as it is)
    shown = (
        folder_url(environment.default_directory()) if url.strip() == "dir://" else redacted(url)
    )
    if url.strip().lower() in OFF:
        raise DemoError("caching is off (RUNTIME_CACHE=off); pass --cache URL to run the demo")
    if in_process_only(url):
        raise DemoError(
            f"{shown!r} lives in one process only; the warm run needs a cache that outlives "
            "it, such as dir:// or redis://"
        )
    return url, shown


def _secret(args: argparse.Namespace) -> list[str] | None:
    """The secret keys: the CLI's ``--secret``/``--secret-file``, else the environment."""
    keys: list[str] | None = getattr(args, "secret_keys", None)
    if keys is not None:
        return keys
    secret, secret_file = getattr(args, "secret", None), getattr(args, "secret_file", None)
    if secret is None and secret_file is None:
        return environment.read_secret()
    from ..cli.context import resolve_secret  # python -m runtime_cache.demo --secret ...

    return resolve_secret(secret, secret_file)


def _open(url: str, secret: list[str] | None) -> tuple[Cache, str]:
    """The demo's cache, and the URL its runs open: the default folder (``dir://``) that
    cannot be made or opened gives way to the private temporary folder the library uses
    then (:func:`~runtime_cache.provider.default_folder_fallback`, which logs where)."""
    from ..provider import cache_from_url, default_folder_fallback

    try:
        return cache_from_url(url, strict=True, secret=secret), url
    except BackendError as exc:
        fallback = default_folder_fallback(url, exc)
        if fallback is None:
            raise
    return cache_from_url(fallback, strict=True, secret=secret), fallback


def demo(args: argparse.Namespace) -> dict[str, Any]:
    """Run the demo and return the result (see :func:`runtime_cache.demo.report.compare`).

    Raises :class:`DemoError` or another
    :class:`~runtime_cache.errors.RuntimeCacheError` with a message for the user.
    """
    from ..opencl.scratch import DEMO, scratch_folder
    from .device import choose
    from .model import build_model

    name = getattr(args, "model", None) or "cnn"
    if getattr(args, "tiny", False):
        if getattr(args, "model", None) not in (None, "tiny"):
            raise DemoError(f"--tiny and --model {name} name different models: give one")
        name = "tiny"
    model = build_model(name)
    keep = bool(getattr(args, "keep", False))
    driver_cache = bool(getattr(args, "driver_cache", False))
    carry = bool(getattr(args, "carry_driver_cache", True)) and not driver_cache
    fresh = bool(getattr(args, "fresh_driver_cache", False))
    if fresh and not carry:  # a new folder that nothing fills: say so, not a silent no-op
        raise DemoError(
            "--fresh-driver-cache needs runtime-cache to carry the driver's cache: leave out "
            "--driver-cache and --no-carry-driver-cache"
        )
    url, shown = _cache_url(args)
    secret = _secret(args)
    cache, opened = _open(url, secret)
    if opened != url:  # the default folder's fallback: the runs use it too
        url, shown = opened, redacted(opened)
    started = False
    try:
        _, index = choose(getattr(args, "device", None))
        remove_entries(cache, model.module_id, before=True)
        started = True
        progress = sys.stderr.isatty()
        with scratch_folder(DEMO) as folder:  # (one a killed demo left goes at the next)
            cold_dir = os.path.join(folder, "cold") if carry else None
            warm_dir = os.path.join(folder, "warm") if fresh else cold_dir
            secret_path = None if secret is None else write_secret_file(secret, folder)
            cold_env = child_env(url, driver_cache, cold_dir, secret_path)
            cold = run_child("cold", name, str(index), cold_env, progress)
            warm_env = child_env(url, driver_cache, warm_dir, secret_path)
            warm = run_child("warm", name, str(index), warm_env, progress)
        entries = demo_entries(cache, model.module_id)
    finally:
        try:
            if started and not keep:
                remove_entries(cache, model.module_id)  # also after a failed run
        finally:
            cache.close()
    by_purpose: dict[str, int] = {}
    for info in entries:
        by_purpose[info.purpose] = by_purpose.get(info.purpose, 0) + 1
    return compare(
        cold,
        warm,
        cache=shown,
        driver_cache=driver_cache,
        carry_driver_cache=carry,
        fresh_driver_cache=fresh,
        entries={
            "count": len(entries),
            "bytes": sum(info.size for info in entries),
            "by_purpose": by_purpose,
        },
        kept=keep,
    )


def run_demo(args: argparse.Namespace) -> int:
    """The handler of ``runtime-cache demo``: run it, print the result; the exit code."""
    try:
        result = demo(args)
    except DemoError as exc:
        return _failed(args, f"error: {redact(str(exc))}", exc.code)
    except RuntimeCacheError as exc:  # no pyopencl, unknown backend, backend down, bad URL
        return _failed(args, f"error: {redact(str(exc))}", 2)
    except KeyboardInterrupt:  # Ctrl-C, in this process or in a run's: a line, no traceback
        return _failed(args, "interrupted", 130)
    if getattr(args, "json", False):
        print(json.dumps(result, indent=2))
    else:
        print(format_text(result))
    problem = _broken_cache(result)
    if problem:
        print(f"runtime-cache demo: error: {problem}", file=sys.stderr)
        return 1
    return 0 if result["outputs_identical"] else 1


def _failed(args: argparse.Namespace, line: str, code: int) -> int:
    # Said on stderr; with --json as {"error", "exit_code"} on stdout too, as every command.
    print(f"runtime-cache demo: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": line.removeprefix("error: "), "exit_code": code}))
    return code


def _broken_cache(result: dict[str, Any]) -> str | None:
    """Why the cache did not work in this run, in one line; ``None`` when it did."""
    if not result["entries"]["count"]:
        cold = result.get("cold", {}).get("cache_stats", {})
        errors = cold.get("errors", 0)
        why = f" ({errors} errors; the last: {cold.get('last_error')})" if errors else ""
        return f"the cache stored nothing{why}, so the warm run could not load from it"
    early = result.get("cold", {}).get("cache_stats", {}).get("hits", 0)
    if early:  # (entries left by a run before, that could not be removed)
        return f"the cold run loaded {early} entries from the cache, so it was no cold run"
    if not result["warm"]["cache_stats"]["hits"]:
        return "the warm run got no cache hits, so the cache did not work"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m runtime_cache.demo``: parse ``argv`` and run the demo."""
    args = build_parser().parse_args(argv)
    return run_demo(args)
