"""The one place that reads the process environment and the platform's cache folder.

Kept apart from the core so that the core stays free of ``os``.
"""

from __future__ import annotations

import os

import platformdirs

__all__ = [
    "ENV_CACHE",
    "ENV_SECRET",
    "ENV_SECRET_FILE",
    "default_directory",
    "read",
    "read_secret",
    "read_secret_file",
]

#: A backend URL, a comma-separated list of tiers, or ``off``.
ENV_CACHE = "RUNTIME_CACHE"
#: A shared secret; when set, entries are signed and unsigned ones rejected.
ENV_SECRET = "RUNTIME_CACHE_SECRET"
#: A file holding the secret (one key a line; the first signs), for secrets kept off
#: command lines and out of the environment.
ENV_SECRET_FILE = "RUNTIME_CACHE_SECRET_FILE"


def read(name: str) -> str | None:
    """Return the environment variable ``name``, or ``None`` when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def default_directory() -> str:
    """The embedded default cache folder: ``platformdirs.user_cache_dir("runtime-cache")``."""
    return platformdirs.user_cache_dir("runtime-cache", appauthor=False)


def read_secret_file(path: str) -> list[str]:
    """The keys in a secret file: one a line, blank lines skipped; the first one signs.

    Raises :class:`~runtime_cache.errors.InvalidSecretError` when the file cannot
    be read or holds no key.
    """
    from .errors import InvalidSecretError

    try:
        with open(path, encoding="utf-8") as handle:
            keys = [line.strip() for line in handle if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSecretError(f"cannot read the secret file {path!r}: {exc}") from exc
    if not keys:
        raise InvalidSecretError(f"the secret file {path!r} holds no secret")
    return keys


def read_secret() -> list[str] | None:
    """The secret from the environment: ``RUNTIME_CACHE_SECRET_FILE`` (a file, one key a
    line), else ``RUNTIME_CACHE_SECRET`` (keys separated by commas, the first one signs:
    ``new,old`` while a fleet rotates keys), else ``None``."""
    path = read(ENV_SECRET_FILE)
    if path is not None:
        return read_secret_file(path)
    text = read(ENV_SECRET)
    if text is None:
        return None
    return [key.strip() for key in text.split(",")]
