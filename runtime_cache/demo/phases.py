"""Where the time to first inference goes, and a progress line for a terminal.

:class:`Phases` charges wall time to the innermost open phase, so nested
phases never count twice: a compile inside tuning counts as compile, the
rest of tuning as tune, and the phases add up to the total.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["PHASES", "Phases", "Progress"]

#: The phases of a first inference, in the order they are reported.
PHASES = ("setup", "compile", "tune", "load", "run")


class _Open:
    """A phase on the stack; its name may change before it closes (see :meth:`Phases.open`)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class Phases:
    """Exclusive wall-clock time per phase since ``start`` (a ``time.perf_counter()`` value).

    Time outside any open phase is charged to ``"setup"``.
    """

    def __init__(self, start: float | None = None) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._stack: list[_Open] = [_Open("setup")]
        self._mark = time.perf_counter() if start is None else start

    def _charge(self) -> None:
        now = time.perf_counter()
        name = self._stack[-1].name
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - self._mark)
        self._mark = now

    @contextmanager
    def open(self, name: str) -> Iterator[_Open]:
        """Charge the time inside the ``with`` block to ``name``.

        The yielded handle's ``name`` can be changed inside the block, for a
        phase known only at its end (a build that turned out to be a cache hit
        is a load, a miss is a compile).
        """
        self._charge()
        phase = _Open(name)
        self._stack.append(phase)
        try:
            yield phase
        finally:
            self._charge()
            self._stack.pop()

    def total(self) -> float:
        """The seconds charged so far, all phases together (charging the open one first)."""
        self._charge()
        return sum(self.seconds.values())

    def as_dict(self) -> dict[str, float]:
        """Seconds per phase, rounded to microseconds."""
        self._charge()
        return {name: round(value, 6) for name, value in self.seconds.items()}


class Progress:
    """A one-line progress bar on a terminal, redrawn in place; silent elsewhere.

    Example::

        progress = Progress(total=12, label="cold")
        progress.step("tune 01_conv3x3")
        progress.close()
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        width: int = 24,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total = max(total, 1)
        self.label = label
        self.width = width
        self.done = 0

    def step(self, what: str = "", advance: int = 1) -> None:
        """Advance by ``advance`` and show ``what`` is being done now."""
        self.done = min(self.done + advance, self.total)
        self.show(what)

    def show(self, what: str = "") -> None:
        """Redraw the line without advancing."""
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {what}"
        self.stream.write(line[:100].ljust(80))
        self.stream.flush()

    def close(self) -> None:
        """Clear the line."""
        if self.enabled:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()
