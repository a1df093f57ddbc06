"""Text formatting for the ``runtime-cache`` command: sizes, ages, devices and tables.

Pure functions of their arguments, so listings stay fast and testable.

>>> human_size(1536)
'1.5 KiB'
>>> human_age(90000)
'1.0d'
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "human_age",
    "human_seconds",
    "human_size",
    "iso_time",
    "render_table",
    "short_device",
    "short_key",
    "signed_line",
]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(size: int | float | None) -> str:
    """Format a byte count with binary units: ``"512 B"``, ``"1.5 KiB"``, ``"2.0 GiB"``."""
    if size is None:
        return "-"
    value = float(size)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


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
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """Render rows as a plain aligned table; columns whose index is in ``right`` align right."""
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


def signed_line(signed: bool) -> str:
    """One line saying whether the cache is signed (for ``ls`` and ``stats``)."""
    if signed:
        return "signed:  yes (a secret signs what is written; unsigned entries are rejected)"
    return "signed:  no (no secret: entries are neither signed nor checked for a signature)"
