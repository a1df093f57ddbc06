"""Where the time to first inference goes (and, from the CLI, the progress line).

:class:`Phases` charges wall time to the innermost open phase, so nested
phases never count twice: a compile inside tuning counts as compile, the
rest of tuning as tune, and the phases add up to the total.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..cli.fmt import Progress  # the one progress bar, shared with the CLI

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
