"""Sizes, durations and booleans as people write them: ``500MB``, ``30d``, ``on``.

Each parser accepts one spelling family and raises :class:`InvalidValueError`
(a ``ValueError``) for anything else, so a bad ``--max-size`` on the command
line is a value error, not a URL error. Backends read their URL options with
these too.

>>> parse_size("1.5 MiB"), parse_duration("2h"), parse_bool("on")
(1572864, 7200.0, True)
"""

from __future__ import annotations

import re

from .errors import InvalidValueError

__all__ = ["InvalidValueError", "format_size", "parse_bool", "parse_duration", "parse_size"]

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}
_DURATION = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|min|s|m|h|d|w)?\s*$", re.IGNORECASE | re.ASCII
)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}
_BOOLS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``"500MB"``, ``"64KiB"`` or ``1024``.

    >>> parse_size("64KiB")
    65536
    """
    if isinstance(text, int):
        if not 0 <= text < 2**63:
            raise InvalidValueError(f"a size must be 0 to 2**63-1 bytes: {text}")
        return text
    if not isinstance(text, str):
        raise InvalidValueError(f"a size is a str or an int, not {type(text).__name__}")
    match = _SIZE.match(text)
    unit = (match.group(2) or "").lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        raise InvalidValueError(f"not a size: {text!r} (try 500MB, 64KiB or 4096B)")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if not size < 2**63:  # also catches inf from a long run of digits
        raise InvalidValueError(f"size {text!r} is too large")
    return int(size)


def parse_duration(text: str | float) -> float:
    """Parse a duration such as ``"30d"``, ``"2h"``, ``"90m"`` (or ``"90min"``), ``"250ms"``
    or ``1.5`` into seconds. A capital ``M`` alone is refused (months, to some).

    >>> parse_duration("250ms")
    0.25
    """
    if isinstance(text, (int, float)):
        if not 0 <= text < 10**12:  # also refuses NaN and inf
            raise InvalidValueError(f"a duration must be 0 to 10**12 seconds: {text}")
        return float(text)
    if not isinstance(text, str):
        raise InvalidValueError(f"a duration is a str or a number, not {type(text).__name__}")
    match = _DURATION.match(text)
    if match is None:
        raise InvalidValueError(f"not a duration: {text!r} (try 250ms, 30s, 2h or 30d)")
    if match.group(2) == "M":  # months in some tools' notation: "--older-than 6M" took minutes
        raise InvalidValueError(
            f"{text!r} is ambiguous (minutes or months?): write {match.group(1)}m or "
            f"{match.group(1)}min for minutes, or days (30d) for longer"
        )
    seconds = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    if not seconds < 10**12:  # about 31,700 years; also catches inf from a long run of digits
        raise InvalidValueError(f"duration {text!r} is too long")
    return seconds


def parse_bool(text: str | bool) -> bool:
    """Parse ``on/off``, ``true/false``, ``yes/no`` or ``1/0`` (any case); refuse the rest.

    >>> parse_bool("Yes"), parse_bool("0")
    (True, False)
    """
    if isinstance(text, bool):
        return text
    value = _BOOLS.get(text.strip().lower()) if isinstance(text, str) else None
    if value is None:
        raise InvalidValueError(f"not a boolean: {text!r} (use on/off, true/false, yes/no or 1/0)")
    return value


_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_size(size: int | float | None) -> str:
    """Format a byte count with binary units: ``"512 B"``, ``"1.5 KiB"``, ``"2.0 GiB"``.

    The one size format of every report (the CLI's listings and the demo), so
    that the same bytes read the same everywhere. ``None`` gives ``"-"``.
    """
    if size is None:
        return "-"
    value = float(size)
    for unit in _BINARY_UNITS:
        if abs(value) < 1024 or unit == _BINARY_UNITS[-1]:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
