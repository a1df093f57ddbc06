"""The ``runtime-cache`` command: inspect, prune, verify, export and import a cache.

Modules: :mod:`~runtime_cache.cli.app` (the parser and :func:`main`),
:mod:`~runtime_cache.cli.context` (what every handler gets),
:mod:`~runtime_cache.cli.fmt` (text, tables, the progress bar),
:mod:`~runtime_cache.cli.log_lines` (what the library logs meanwhile), and the
commands grouped by job: :mod:`~runtime_cache.cli.inspect` (ls, show, stats),
:mod:`~runtime_cache.cli.maintain` (rm, clear, prune, verify; prune's text in
:mod:`~runtime_cache.cli.prune_text`) and
:mod:`~runtime_cache.cli.bundles` (export, and the parsers of both) with
:mod:`~runtime_cache.cli.bundle_import` (import). Plug-ins such as the demo
come through the ``runtime_cache.cli`` entry-point group.

Importing this package imports none of them (the demo's child processes use
the progress bar alone); :func:`main` loads the parser when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["build_parser", "main", "open_cache"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``runtime-cache`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    from .app import main as run

    return run(argv)


def __getattr__(name: str) -> Any:
    if name == "build_parser":
        from .app import build_parser

        return build_parser
    if name == "open_cache":
        from .context import open_cache

        return open_cache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
