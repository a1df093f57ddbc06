"""Text formatting for the ``runtime-cache`` command: sizes, ages, devices, tables, and the
one progress bar (the demo draws it too).

Everything that reaches the terminal from a cache entry goes through
:func:`clean` first, so an entry cannot smuggle escape sequences onto the
operator's screen.

>>> human_size(1536)
'1.5 KiB'
>>> human_age(90000)
'1.0d'
"""

from __future__ import annotations

import datetime as _dt
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, TextIO

from ..units import format_size

__all__ = [
    "Progress",
    "clean",
    "count",
    "human_age",
    "human_seconds",
    "human_size",
    "iso_time",
    "render_table",
    "short_device",
    "short_key",
    "signed_line",
]


def clean(text: object) -> str:
    r"""``str(text)`` with control and format characters escaped (``\x1b``, ``\u202e``).

    >>> clean("gpu\x1b[2J")
    'gpu\\x1b[2J'
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def store_name(backend: object) -> str:
    """What an operator calls ``backend``: a folder's path, a server's URL (without its
    password), tiers joined by ``>``; else the backend's class name."""
    tiers = getattr(backend, "tiers", None)
    if isinstance(tiers, list) and tiers:
        return " > ".join(store_name(tier) for tier in tiers)
    for attribute, kind in (("root", "folder"), ("name", "server")):
        value = getattr(backend, attribute, None)
        if isinstance(value, (str, PurePath)) and value:
            return clean(f"the {kind} {value}")
    return clean(f"the {type(backend).__name__}")


def count(n: int, one: str, many: str) -> str:
    """``n`` and its noun in the right number: ``count(1, "entry", "entries")`` is ``"1 entry"``."""
    return f"{n} {one if n == 1 else many}"


def human_size(size: int | float | None) -> str:
    """Format a byte count with binary units: ``"512 B"``, ``"1.5 KiB"``, ``"2.0 GiB"``."""
    return format_size(size)


def human_age(seconds: float | None) -> str:
    """Format a duration compactly: ``"45s"``, ``"12m"``, ``"3.5h"``, ``"2.0d"``."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def human_seconds(seconds: float | None) -> str:
    """Format a build time: ``"0.003s"``, ``"1.70s"``, ``"2m05s"``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds:.3f}s"
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def iso_time(timestamp: float | None) -> str:
    """A Unix time as an ISO 8601 UTC string, or ``"-"``."""
    if timestamp is None:
        return "-"
    moment = _dt.datetime.fromtimestamp(timestamp, tz=_dt.timezone.utc)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def short_key(key: str, digits: int = 12) -> str:
    """The first ``digits`` hex digits of a key's digest: enough to name it in ``show``/``rm``."""
    return key.rsplit("/", 1)[-1][:digits]


def short_device(device: Any, width: int = 32) -> str:
    """A one-line summary of a device fingerprint: its name and driver, where present."""
    if device is None:
        return "-"
    if isinstance(device, Mapping):
        name = device.get("name") or device.get("device") or device.get("vendor")
        driver = device.get("driver") or device.get("driver_version") or device.get("version")
        bits = [str(b).strip() for b in (name, driver) if b not in (None, "")]
        text = " / ".join(bits) if bits else ",".join(f"{k}={v}" for k, v in device.items())
    else:
        text = str(device)
    text = clean(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """Render rows as a plain aligned table; columns whose index is in ``right`` align right.

    Every cell goes through :func:`clean`.
    """
    rows = [[clean(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    aligned = set(right)

    def line(cells: Sequence[str]) -> str:
        out = [
            cell.rjust(widths[i]) if i in aligned else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


class Progress:
    """A one-line progress bar on a terminal, redrawn in place at most ten times a second.

    Silent when ``stream`` (default: standard error) is not a terminal, or when
    ``enabled=False``. Example::

        progress = Progress(total=12, label="verify")
        progress.step("01_conv3x3")
        progress.close()
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        stream: TextIO | None = None,
        *,
        enabled: bool | None = None,
        width: int = 24,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            try:
                enabled = self.stream.isatty()
            except (AttributeError, ValueError, OSError):
                enabled = False
        self.enabled = bool(enabled)
        self.total = max(total, 1)
        self.label = label
        self.width = width
        self.done = 0
        self._drawn = 0.0
        self._shown = False

    def step(self, what: str = "", advance: int = 1) -> None:
        """Advance by ``advance`` and show ``what`` is being done now."""
        self.done = min(self.done + advance, self.total)
        self.show(what)

    def at(self, done: int, total: int) -> None:
        """Show ``done`` of ``total``: fits hooks told both, such as ``on_progress``."""
        self.total = max(total, 1)
        self.done = min(done, self.total)
        self.show()

    def show(self, what: str = "") -> None:
        """Redraw the line without advancing (skipped if drawn under 0.1 s ago)."""
        now = time.monotonic()
        if not self.enabled or (now - self._drawn < 0.1 and self.done < self.total):
            return
        self._drawn, self._shown = now, True
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {clean(what)}"
        self.stream.write(line[:100].ljust(80))
        self.stream.flush()

    def close(self) -> None:
        """Clear the line, if anything was drawn."""
        if self._shown:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def signed_line(signed: bool, unsigned: int = 0) -> str:
    """Whether the cache is signed (for ``ls`` and ``stats``); with a secret, also how many
    of the listed entries carry no signature (reads reject those)."""
    if not signed:
        return "signed:  no (no secret: entries are neither signed nor checked for a signature)"
    line = "signed:  yes (a secret signs what is written; unsigned entries are rejected)"
    if unsigned:
        them = "it" if unsigned == 1 else "them"
        line += (
            f"\n         {count(unsigned, 'entry carries', 'entries carry')} no signature: "
            f"reads reject {them}; verify --repair deletes {them} where some entry "
            "verifies with this secret (a cache filled without it keeps them)"
        )
    return line
