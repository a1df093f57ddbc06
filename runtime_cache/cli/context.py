"""What every ``runtime-cache`` subcommand shares: its context, its errors, its handler type."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO, cast

from .. import environment
from ..api import BackendURL
from ..cache import Cache
from ..codec import UNSIGNED_ENTRY as UNSIGNED
from ..errors import (
    InvalidSecretError,
    InvalidURLError,
    InvalidValueError,
    RuntimeCacheError,
    UnknownBackendError,
)
from ..stats import jsonable
from ..urls import redact, tier_urls
from .fmt import clean, count
from .output import TerminalOutput, WholeText, write_text

__all__ = [
    "CommandContext",
    "Handler",
    "KeyNotFound",
    "Skipped",
    "UsageError",
    "open_cache",
    "resolve_key",
    "resolve_secret",
    "strict_json",
]


class UsageError(Exception):
    """A command line that parses but cannot be run as given (exit code 2)."""


class KeyNotFound(LookupError):
    """No stored key matches what the user typed."""


def resolve_secret(secret: str | None, secret_file: str | None = None) -> list[str] | None:
    """``--secret-file``, else ``--secret``, else the environment (see
    :func:`runtime_cache.environment.read_secret`), else ``None``; keys split at commas.
    Both options at once are an :class:`~runtime_cache.errors.InvalidSecretError` (the file
    won without a word)."""
    if secret_file is not None and secret is not None:
        raise InvalidSecretError("give --secret or --secret-file, not both")
    if secret_file is not None:
        return environment.read_secret_file(secret_file)
    if secret is not None:
        return environment.split_secret(secret, "--secret")
    return environment.read_secret()


def missing_folder(url: str | None) -> str | None:
    """The first folder that a ``dir://`` cache (or a ``dir://`` tier) of ``url`` names and
    that does not exist, or ``None``: what a command that only reads reports instead of
    creating it. ``url`` ``None`` is the cache the app would use: ``RUNTIME_CACHE``, else the
    embedded default folder (missing only when the temporary one it falls back to is too)."""
    if url is None:
        url = environment.read(environment.ENV_CACHE)
        if url is None:
            return _missing_default()
    from ..provider import OFF

    if url.strip().lower() in OFF:
        return None
    # As the registry opens them: a list of tiers, each stripped; else the URL as it is.
    try:
        url = url.strip()
        tiers = tier_urls(url) if "," in url or url.lower().startswith("tiered://") else [url]
    except RuntimeCacheError:
        return None  # opening it reports the error
    for tier in tiers:
        if not tier.lower().startswith("dir://"):
            continue
        try:
            path = _dir_folder(tier)
            folder = None if path is None else environment.cache_folder(path)  # as opened
        except RuntimeCacheError:
            return None  # a URL that is wrong: opening it says so (a typo before a folder)
        if folder is None:
            absent = _missing_default()
        else:
            absent = None if os.path.lexists(folder) else folder
        if absent is not None:
            return absent
    return None


def _dir_folder(url: str) -> str | None:
    """The folder of a ``dir://`` ``url`` whose options are checked too, as the registry
    would open it (``insecure=`` taken out first); raises what opening it would."""
    from ..registry import registry, take_insecure

    bare = take_insecure(url)[0]
    settings = getattr(registry.resolve("dir"), "url_settings", None)
    if settings is None:  # another dir:// backend registered: its folder as the URL says
        return BackendURL.parse(bare).folder()
    try:
        folder: str | None = settings(bare)[0]
    except InvalidValueError as exc:  # a bad size: for whoever wrote the URL, a URL error
        raise InvalidURLError(str(exc)) from None
    return folder


def _missing_default() -> str | None:
    # The embedded default as the provider opens it: the user cache folder, made if it can
    # be (a home folder that cannot take it: the temporary folder instead). Nothing made here.
    folder = environment.default_folder_named()
    if os.path.lexists(folder):
        return None
    if not _could_make(folder):
        fallback = environment.fallback_directory("cache")
        return None if os.path.lexists(fallback) else fallback
    return folder


def _could_make(folder: str) -> bool:
    """Whether this user could make ``folder``: its nearest existing parent is writable."""
    parent = os.path.dirname(os.path.abspath(folder))
    while parent and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    return bool(parent) and os.access(parent, os.W_OK | os.X_OK)


def open_cache(url: str | None, secret: str | list[str] | None) -> Cache:
    """Open the cache a command works on: ``url``, else the process-wide provider's backend.

    ``secret``: the keys (see :func:`resolve_secret`; a string is split at commas).
    The returned cache is strict, so a failing backend is reported instead of
    looking empty.
    """
    from ..provider import cache_from_url, get_cache, open_error

    if isinstance(secret, str):
        secret = resolve_secret(secret)
    from ..provider import OFF

    chosen = environment.read(environment.ENV_CACHE)
    if not url and chosen and chosen.strip().lower() not in OFF:
        # Opened as --cache is: its errors, and exit codes, are the same, and say where the
        # URL came from (a wrong one in the environment read as if typed on this line).
        try:
            return cache_from_url(chosen, strict=True, secret=secret)
        except (InvalidURLError, InvalidValueError, UnknownBackendError) as exc:
            raise type(exc)(f"{environment.ENV_CACHE}: {exc}") from None
    if url:
        return cache_from_url(url, strict=True, secret=secret)
    quiet = logging.getLogger("runtime_cache.provider")  # its error is this command's to say
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        provider = get_cache()
    finally:
        quiet.setLevel(level)
    if not provider.enabled:
        from ..provider import OFF

        chosen = os.environ.get("RUNTIME_CACHE", "")
        if chosen.strip().lower() in OFF:
            raise UsageError(f"caching is off (RUNTIME_CACHE={chosen.strip()}); pass --cache URL")
        why = open_error()
        raise UsageError(
            f"caching is off: the cache RUNTIME_CACHE names could not be opened ({why}); "
            "fix that, or pass --cache URL"
            if why
            else "caching is off (the cache could not be opened); pass --cache URL"
        )
    why = open_error()  # a cache in memory, as the provider's last resort: not the app's
    if why is not None:
        raise UsageError(f"{why}; pass --cache URL")
    return Cache(provider.backend, strict=True, secret=secret)


def standard_output() -> TextIO:
    """Standard output, each write of which goes out whole or raises (:class:`WholeText`);
    ``None`` where the process started with it closed (``>&-``)."""
    out: TextIO | None = sys.stdout
    return cast(TextIO, out if out is None or isinstance(out, WholeText) else WholeText(out))


@dataclass
class CommandContext:
    """What a subcommand works with: the cache (opened on first use), streams, secret, clock.

    ``url`` is the ``--cache`` option (``None``: the process-wide provider's
    cache). A command that never touches :attr:`cache` never opens it, so a
    plug-in such as the demo can open caches of its own. ``json`` is the command's
    ``--json``: a failure is then said on the output stream as JSON too
    (:meth:`json_error`), unless the command printed its JSON already (``emitted``).
    """

    url: str | None = None
    secret: str | list[str] | None = None
    out: TextIO = field(default_factory=standard_output)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    now: float = field(default_factory=time.time)
    opened: Cache | None = None
    json: bool = False
    emitted: bool = False

    @property
    def cache(self) -> Cache:
        """The strict :class:`Cache` of ``url``, opened on first use."""
        if self.opened is None:
            self.opened = open_cache(self.url, self.secret)
        return self.opened

    def close(self) -> None:
        """Close the cache if it was opened."""
        if self.opened is not None:
            self.opened.close()

    def emit_json(self, value: Any) -> None:
        """Write ``value`` as strict JSON to the output stream (see :func:`strict_json`)."""
        self.emitted = True
        write_text(self.out, strict_json(value, indent=2) + "\n")

    def json_error(self, message: str, code: int) -> None:
        """With ``--json``, write ``{"error": message, "exit_code": code}`` to the output
        stream, unless the command wrote its JSON already: a script reading it has a
        report to parse, as ``import`` always gave (the keys are import's)."""
        if self.json and not self.emitted and self.out is not None:
            self.emit_json({"error": redact(message), "exit_code": code})

    def fail(self, message: str, code: int = 1) -> int:
        """Say ``message`` on the error stream (and with ``--json`` on the output stream
        too, :meth:`json_error`); return ``code``, the command's exit code."""
        print(f"runtime-cache: {clean(message)}", file=self.err)
        self.json_error(message, code)
        return code

    def is_terminal(self) -> bool:
        """Whether the error stream (where progress bars go) is a terminal."""
        try:
            return self.err.isatty()
        except (AttributeError, ValueError, OSError):
            return False


def binary_stdout() -> BinaryIO:
    """Standard output for binary data (a file named ``-``); :class:`UsageError` when it
    is a terminal, where the bytes would only garble the screen."""
    if sys.stdout is None:  # (started with it closed: `>&-`)
        raise UsageError("standard output is closed: name a file, or redirect it")
    try:
        terminal = sys.stdout.isatty()
    except (AttributeError, ValueError, OSError):
        terminal = False
    if terminal:
        raise TerminalOutput
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:  # (main() called with sys.stdout a StringIO)
        raise UsageError("standard output takes text only here: name a file")
    return cast(BinaryIO, buffer)


#: The one signature of every subcommand's handler, built-in or plug-in: it returns
#: the exit code (0 ok, 1 problems found), and raises :class:`UsageError` for exit code 2.
Handler = Callable[[argparse.Namespace, CommandContext], int]


def resolve_key(cache: Cache, text: str) -> str:
    """Turn what the user typed into a stored key.

    Accepted: a whole key (``opencl/program-binary/<32 hex digits>``), a prefix
    of a whole key (``opencl/tuning/3f2a``), or a prefix of a key's digest as
    ``ls`` shows it (``3f2a91c0d4e5``); a word that is no digest's prefix is taken as a
    key's first part (``opencl`` as ``opencl/``). Raises :class:`KeyNotFound` when
    nothing matches, :class:`UsageError` when the prefix is ambiguous.
    """
    text = text.strip()
    if not text:
        raise UsageError("an empty key")
    if "/" in text:
        if text.count("/") >= 2 and len(text.rsplit("/", 1)[-1]) == 32:
            return text  # a whole key: no listing needed
        matches = list(cache.backend.keys(text))
    else:
        needle = text.lower()
        matches = [k for k in cache.backend.keys("") if k.rsplit("/", 1)[-1].startswith(needle)]
        if not matches:  # a runtime's name ("opencl"): as "opencl/" (it said "no entry")
            matches = list(cache.backend.keys(text + "/"))
    if not matches:
        raise KeyNotFound(text)
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5]) + (", ..." if len(matches) > 5 else "")
        raise UsageError(f"{text!r} matches {len(matches)} keys ({shown}); type more digits")
    return matches[0]


class Skipped:
    """Collects what a listing left out, as ``(key, reason)``: pass it as ``on_skip``."""

    #: Skipped entries named one by one; the rest are only counted.
    SHOWN = 5

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def __call__(self, key: str, reason: str) -> None:
        self.items.append((key, reason))

    def __len__(self) -> int:
        return len(self.items)

    def as_json(self) -> list[dict[str, str]]:
        """The skipped entries as ``[{"key": ..., "reason": ...}]``."""
        return [{"key": key, "reason": reason} for key, reason in self.items]

    def report(self, ctx: CommandContext, sign_hint: bool = False) -> None:
        """Say on the error stream how many were skipped, and name the first few;
        ``sign_hint``: say that ``export --sign`` signs those stored without a secret."""
        if not self.items:
            return
        unsigned = sum(UNSIGNED in reason for _, reason in self.items)
        why = (
            "that carry no signature (stored without a secret)"
            if unsigned == len(self.items)
            else "as corrupt or unreadable (see `runtime-cache verify`)"
        )
        skipped = count(len(self.items), "entry", "entries")
        print(f"runtime-cache: skipped {skipped} {why}", file=ctx.err)
        for key, reason in self.items[: self.SHOWN]:
            print(f"  {clean(key)}: {clean(reason)}", file=ctx.err)
        if len(self.items) > self.SHOWN:
            print(f"  ... and {len(self.items) - self.SHOWN} more", file=ctx.err)
        if sign_hint and unsigned:
            print(
                f"runtime-cache: {unsigned} of them were stored without a secret in this "
                "private cache; `export --sign` signs them with yours",
                file=ctx.err,
            )


def strict_json(value: Any, indent: int | None = None, default: Any = str) -> str:
    """``value`` as strict JSON, whatever a store's metadata held: with a key that is
    bytes, or NaN or an infinity (Python's own ``NaN``, which JSON parsers refuse), it is
    written from :func:`~runtime_cache.stats.jsonable`'s copy. One ``json.dumps`` call in
    C where it needs none (a listing of 10,000 entries takes milliseconds)."""
    try:
        return json.dumps(value, indent=indent, allow_nan=False, default=default)
    except (TypeError, ValueError):  # (a planted entry's metadata: a bytes key, a NaN)
        return json.dumps(jsonable(value), indent=indent, allow_nan=False, default=default)
