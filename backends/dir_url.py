"""The ``dir://`` URL: ``dir:///abs/path?max_size=2GB&max_files=N&fsync=0&track_access=1&shared=0``.

:func:`url_settings` checks a URL and says what it opens, with nothing opened; plain
``dir://`` is the embedded default folder.
"""

from __future__ import annotations

from typing import Any

from runtime_cache.api import BackendURL, parse_size
from runtime_cache.errors import InvalidValueError

__all__ = ["DEFAULT_MAX_SIZE", "url_settings"]

#: The default ``max_size``: 2GB, as a number (opening a cache then parses no size text).
DEFAULT_MAX_SIZE = 2 * 1000**3


def url_settings(url: str) -> tuple[str | None, dict[str, Any]]:
    """The folder and the keyword arguments that ``url`` gives, checked, with nothing
    opened: :class:`InvalidURLError` (or ``InvalidValueError``) when it is wrong."""
    parsed = BackendURL.parse(url)
    max_size = parsed.pop("max_size")
    max_files = parsed.pop("max_files", "")
    fsync = parsed.pop_bool("fsync", False)
    track = parsed.pop_bool("track_access", True)
    shared = parsed.pop_bool("shared", False)
    parsed.reject_unknown()
    off = max_size is not None and max_size.lower() in ("", "none")  # (0 too: no cap)
    cap = None if off else parse_size(max_size or DEFAULT_MAX_SIZE)  # absent: the default
    try:
        files = parse_size(max_files) if max_files else None
    except InvalidValueError:
        raise InvalidValueError(
            f"max_files is a count of files, such as 10000 or 10k: {max_files!r}"
        ) from None
    options = {"fsync": fsync, "track_access": track, "shared": shared}
    return parsed.folder(), {"max_size": cap, "max_files": files, **options}
