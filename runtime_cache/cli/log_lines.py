"""What the library logs while a command runs: its errors, and with ``--verbose`` its
warnings, each line's control characters escaped.

The cache is strict in a command, so failures come back as errors that the command
reports; the library's own warnings ("carrying on without the cache") only confuse a
one-shot command unless asked for. Two are said always: where the cache lives (a default
folder that moved to a temporary one, with no usable home folder: `ls` would show
another cache without a word) and a short secret key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from .fmt import clean

__all__ = ["CleanLines", "command_logging"]

#: Loggers whose warnings a command shows without ``--verbose``.
ALWAYS_SAID = ("runtime_cache.environment", "runtime_cache.signing")


class CleanLines(logging.Formatter):
    """A formatter that escapes control and format characters in each line: a message may
    name what a store holds (a Redis name with a terminal's escape sequences in it
    reached the screen with ``-v``)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(clean(line) for line in super().format(record).split("\n"))


@contextmanager
def command_logging(verbose: bool) -> Iterator[None]:
    """Log the library's errors (and with ``verbose`` its warnings) to stderr, cleaned,
    while the block runs; the loggers' levels are put back after it (a command may run
    inside a host process: tests, notebooks). Where the host set up logging already, its
    handlers are kept."""
    said_here = logging.StreamHandler()
    said_here.setFormatter(CleanLines("%(message)s"))
    logging.basicConfig(handlers=[said_here])
    logger = logging.getLogger("runtime_cache")
    said = [logging.getLogger(name) for name in ALWAYS_SAID]
    saved = logger.level, [one.level for one in said]
    logger.setLevel(logging.WARNING if verbose else logging.ERROR)
    for one in said:
        one.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        for one, level in zip(said, saved[1], strict=True):
            one.setLevel(level)
