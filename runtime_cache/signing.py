"""Secrets: one key or several (``[new, old]`` while a fleet rotates keys), HMAC-SHA256.

The first key signs; any key verifies. Whitespace around a key is not part of it. An
empty or blank key is an error, never "no secret", and so is a key holding a line break
(a secret file's lines are keys of their own). A key shorter than
:data:`SHORT_SECRET` bytes is taken, with a warning (once a process for each key):
anyone who can read one signed entry can try to guess it offline.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Sequence

from .errors import InvalidSecretError

__all__ = [
    "SHORT_SECRET",
    "SIG_SIZE",
    "Secret",
    "SecretKeys",
    "normalize_secret",
    "sign",
    "signed_by",
    "signing_keys",
]

#: Bytes of an HMAC-SHA256 signature.
SIG_SIZE = 32

#: Keys shorter than this many bytes are warned about: a writer who can read one
#: signed entry may guess such a key offline, and then sign anything.
SHORT_SECRET = 16

_log = logging.getLogger(__name__)
_warned: set[bytes] = set()  # (digests of the short keys already warned about)

#: What callers may pass as a secret: one key, or several (``[new, old]``) to rotate keys.
Secret = str | bytes | Sequence[str | bytes] | None
#: Normalized secrets: the first key signs, any of them verifies.
SecretKeys = tuple[bytes, ...]


def _one_secret(secret: object) -> bytes:
    if isinstance(secret, str):
        try:  # bytes the environment could not decode come back as they were given
            secret = secret.encode("utf-8", "surrogateescape")  # (stripped below)
        except UnicodeEncodeError:
            raise InvalidSecretError("a secret must be text UTF-8 can encode") from None
    if not isinstance(secret, (bytes, bytearray)):
        raise InvalidSecretError(f"a secret is str or bytes, not {type(secret).__name__}")
    # Without the whitespace around it, as the command line, the environment and secret
    # files give it: an app's open(path).read() signed with the file's newline, and the
    # command's --secret-file then failed every entry.
    key = _stripped(bytes(secret))
    if not key:
        raise InvalidSecretError("a secret may not be empty or blank")
    if b"\n" in key or b"\r" in key:
        # A two-line secret file read whole (open(path).read()) is two keys, as the
        # command's --secret-file reads it; taken as one key, nothing either signed verified.
        raise InvalidSecretError(
            "a secret key may not hold a line break: a secret file holds one key a line; "
            "pass its lines as a list of keys, [new, old] (on the command line: "
            "--secret-file, or NEW,OLD)"
        )
    if len(key) < SHORT_SECRET:
        _warn_short(key)
    return key


def _stripped(key: bytes) -> bytes:
    # As text is stripped (Unicode whitespace too: a no-break space, \x1c-\x1f), bytes that
    # are no UTF-8 kept as they are (as the command line gets them: surrogateescape), so
    # bytes given here give the key that their text gives the command line.
    # A byte-order mark first is no part of it either, as secret files are read (utf-8-sig).
    text = key.decode("utf-8", "surrogateescape").strip().lstrip("\ufeff").strip()
    return text.encode("utf-8", "surrogateescape")


def _warn_short(key: bytes) -> None:
    digest = hashlib.sha256(key).digest()
    if digest in _warned:
        return
    _warned.add(digest)
    _log.warning(
        "runtime-cache: a secret key of %d bytes is short: anyone who can read a signed "
        "entry may guess it and sign what they like; use %d or more random bytes, e.g. "
        "the output of `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
        len(key),
        SHORT_SECRET,
    )


def normalize_secret(secret: Secret | SecretKeys) -> SecretKeys | None:
    """Return the secret keys as a tuple of bytes (the first one signs), or ``None`` for no secret.

    ``secret`` is one key, or a list of keys ``[new, old]`` while a fleet rotates
    keys: entries signed with any of them verify. An empty or blank key raises
    :class:`~runtime_cache.errors.InvalidSecretError`.

    >>> normalize_secret(["new", "old"])
    (b'new', b'old')
    """
    if secret is None:
        return None
    if isinstance(secret, (str, bytes, bytearray)):
        return (_one_secret(secret),)
    if not isinstance(secret, (list, tuple)) or not secret:
        raise InvalidSecretError("secret must be a str, bytes, or a non-empty list of them")
    return tuple(_one_secret(s) for s in secret)


def sign(secret: bytes, data: bytes | memoryview, *more: bytes | memoryview) -> bytes:
    """HMAC-SHA256 of ``data`` (followed by each of ``more``) under one key."""
    mac = hmac.new(secret, data, hashlib.sha256)
    for chunk in more:
        mac.update(chunk)
    return mac.digest()


def signing_keys(secret: bytes | SecretKeys | None) -> SecretKeys:
    """The keys of ``secret`` as a tuple (empty for none); the first one signs."""
    if secret is None:
        return ()
    return (secret,) if isinstance(secret, bytes) else secret


def signed_by(
    secret: bytes | SecretKeys,
    data: bytes | memoryview,
    mac: bytes,
    more: tuple[bytes | memoryview, ...] = (),
) -> bool:
    """Whether ``mac`` is the signature of ``data`` (followed by each of ``more``) under any
    key of ``secret``."""
    return any(hmac.compare_digest(sign(key, data, *more), mac) for key in signing_keys(secret))
