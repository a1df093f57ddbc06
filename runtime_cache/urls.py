"""Backend URLs: parsing them, reading their options, and hiding their passwords.

:func:`redact` is the one redactor of the project: every log line, error
message and repr that shows a URL passes it through here. It hides the
password of every URL inside a text (each tier of ``"memory://,redis://..."``,
a URL after a leading space or inside quotes, any scheme), a raw ``@`` inside
the password included, and the value of ``password=``-like query options.

>>> redact("memory://, redis://:s3cr@t@cache:6379/0?password=x&db=1")
'memory://, redis://:***@cache:6379/0?password=***&db=1'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, parse_qsl, quote, unquote, urlsplit

from .errors import InvalidURLError, InvalidValueError
from .units import parse_bool

__all__ = [
    "IN_PROCESS_SCHEMES",
    "BackendURL",
    "folder_url",
    "in_process_only",
    "redact",
    "redact_url",
    "redacted",
    "tier_urls",
]

# scheme://userinfo@ : the userinfo runs to the last "@" before whitespace or a quote, so
# a raw "@", "/", "?", "#" or "," inside a password is hidden too (a query's "@" hides
# more than it need: never less). An authority that starts with "/" is none (dir:///a@b).
# Found by :func:`_hide_userinfos` in one pass: a pattern that runs to the last "@" took
# time quadratic in the text's length.
_TOKEN_END = re.compile(r"[\s'\"]")
_SCHEME_TYPO = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*:")
_WELL_FORMED = re.compile(r"\s*(?:tiered://)?[A-Za-z][A-Za-z0-9+.-]*://")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-")
_SECRET_OPTION = re.compile(
    r"([?&;]\s*(?:password|passwd|pass|pwd|secret|token|auth|api_key|access_key)\s*=)"
    r"[^&#\s,'\"]*",
    re.IGNORECASE,
)
#: Schemes whose URL names a local folder: a host there is a mistake, not a place.
_LOCAL_SCHEMES = frozenset({"dir"})


#: Schemes of stores that live in one process only: nothing written there outlives it.
IN_PROCESS_SCHEMES = frozenset({"memory"})


def in_process_only(url: str) -> bool:
    """Whether every tier of ``url`` lives in one process only (``memory://``): a command
    or a demo run that writes there keeps nothing once it exits.

    >>> in_process_only("memory://, memory://?max_size=1MB"), in_process_only("memory://,dir://")
    (True, False)
    """
    schemes = {part.strip().split("://", 1)[0].lower() for part in url.split(",")}
    return schemes <= IN_PROCESS_SCHEMES


def tier_urls(url: str) -> list[str]:
    """The URLs of a tiered cache's tiers, as it opens them: ``"memory://,dir://"`` or
    ``"tiered://memory://,dir://"``, each stripped. :class:`InvalidURLError` for an empty
    tier or a nested ``tiered://``.

    >>> tier_urls("tiered://memory://, dir:///srv/c")
    ['memory://', 'dir:///srv/c']
    """
    text = url[len("tiered://") :] if url.lower().startswith("tiered://") else url
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p for p in parts):
        raise InvalidURLError(f"empty tier in {redact_url(url)} (expected 'url,url,...')")
    if any(p.lower().startswith("tiered://") for p in parts):
        raise InvalidURLError(f"tiers cannot nest: {redact_url(url)}")
    if len(parts) > 1 and any("://" not in p for p in parts):
        # Named whole, never by the pieces: a "," in a password cuts it in two.
        raise InvalidURLError(
            f"a tier of {redact_url(url)} is no URL (expected 'url,url,...'; "
            "in a password, write ',' as %2C)"
        )
    return parts


def folder_url(path: str) -> str:
    """The ``dir://`` URL of the folder ``path``, escaped so that
    :meth:`BackendURL.folder` gives ``path`` back (a ``%``, ``?`` or ``#`` in a folder's
    name is not read as an escape, the query or a fragment).

    >>> folder_url("/tmp/50% off?")
    'dir:///tmp/50%25%20off%3F'

    A relative ``path`` that starts with ``~`` names a folder of that name here, not a
    home folder; an empty one is a ``ValueError`` (``dir://`` alone is the default folder).
    """
    if not path:
        raise ValueError("folder_url needs a folder's path (dir:// alone is the default)")
    if path.startswith("~"):
        path = "./" + path  # not expanded as a home folder
    return "dir://" + quote(path, safe="/~", errors="surrogateescape")


def _hidden(userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    # redis://PASSWORD@host: a lone userinfo is the password, so it goes too.
    return f"{user}:***" if colon else "***"


def _scheme_start(text: str, end: int) -> int | None:
    # Where a scheme ("redis", "redis+cluster") that ends at ``end`` starts: scheme
    # characters back from there, one of them a letter; None where there is none. (Walks
    # back over each stretch once: linear in all.)
    start = end
    while start > 0 and text[start - 1] in _SCHEME_CHARS:
        start -= 1
    if start > 0 and text[start - 1] in ":/@":
        return None  # inside another URL (a password that holds "://"), not one of its own
    return start if any(c.isalpha() for c in text[start:end]) else None


def _url_starts(text: str) -> list[int]:
    """Where each ``scheme://`` of ``text`` has its ``://`` (one of its own, not one inside
    another URL's userinfo or path): found in one pass."""
    found = []
    at = text.find("://")
    while at >= 0:
        if _scheme_start(text, at) is not None:
            found.append(at)
        at = text.find("://", at + 3)
    return found


def _hide_userinfos(text: str) -> str:
    """``text`` with the userinfo of every ``scheme://userinfo@`` in it hidden."""
    out: list[str] = []
    done = 0  # text[:done] is in out
    token_end = last_at = -1  # the end of the token around the current "://", its last "@"
    starts = _url_starts(text)
    for index, at in enumerate(starts):
        start = at + 3
        after = starts[index + 1] if index + 1 < len(starts) else -1
        if at < done:
            continue
        if at >= token_end:
            found = _TOKEN_END.search(text, at)
            token_end = found.start() if found else len(text)
            last_at = text.rfind("@", at, token_end)
        # Another URL before the "@" (a tier list): this one's userinfo ends at its own
        # last "@" before that URL, if it has one (a search of its own stretch only).
        end = last_at if not 0 <= after < last_at else text.rfind("@", start, after)
        if end > start and text[start] != "/":
            out += [text[done:start], _hidden(text[start:end])]
            done = end
    return "".join(out) + text[done:] if out else text


def _hide_each_url(url: str) -> str:
    """One URL, or a tier list: each URL's userinfo hidden up to its last '@' before the
    next URL, whatever it holds (a space, a quote, a ',')."""
    starts: list[tuple[int, int]] = []
    for at in _url_starts(url):
        start = _scheme_start(url, at)
        if start is not None and (not starts or start >= starts[-1][1]):
            starts.append((start, at + 3))
    if not starts:
        return url
    out = [url[: starts[0][0]]]
    for index, (start, body) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(url)
        last = url.rfind("@", body, end)
        if last > body and url[body] != "/":
            out += [url[start:body], _hidden(url[body:last]), url[last:end]]
        else:
            out.append(url[start:end])
    return "".join(out)


def redact(text: str) -> str:
    """``text`` with the password of every URL in it, and secret query options, as ``***``.

    >>> redact("redis://app:hunter2@cache:6379/0")
    'redis://app:***@cache:6379/0'
    """
    return _SECRET_OPTION.sub(r"\1***", _hide_userinfos(text))


def redact_url(url: object) -> str:
    """``repr(url)`` with any password in it replaced by ``***``, for messages and logs.

    >>> redact_url("redis://app:hunter2@cache:6379/0")
    "'redis://app:***@cache:6379/0'"
    """
    if not isinstance(url, str):
        return redact(repr(url))
    return repr(redacted(url))


def redacted(url: str) -> str:
    """The URL (or tier list) ``url`` with each URL's userinfo hidden up to its last
    ``@``, whatever the password holds, and secret query options hidden: as
    :func:`redact_url` shows it, without the quotes.

    >>> redacted("memory://,redis://:pass word@cache:6379/0")
    'memory://,redis://:***@cache:6379/0'
    """
    hidden = _hide_each_url(url)
    if any(
        "@" in part and "***@" not in part and not _WELL_FORMED.match(part)
        for part in hidden.split(",")
    ):
        # A URL (or a tier of a list) that is no "scheme://..." ("redis:/:pw@host",
        # "redis//:pw@host"): where its userinfo ends cannot be told, so all before the
        # last "@" goes, but a scheme it starts with.
        typo = _SCHEME_TYPO.match(url)
        head = typo.group(0) if typo else ""
        return f"{head}***@{url.rpartition('@')[2]}"
    # (A space or a quote ends the pass over free text in redact(); not here.)
    return redact(hidden)


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL: scheme, location and query options.

    Backends use it to read their options and to reject unknown ones::

        url = BackendURL.parse("memory://?max_size=64MB")
        max_size = parse_size(url.pop("max_size", "256MB"))
        url.reject_unknown()
    """

    scheme: str
    netloc: str
    path: str
    options: dict[str, str]
    raw: str

    @classmethod
    def parse(cls, url: str) -> BackendURL:
        """Split ``url``; raise :class:`InvalidURLError` when it is not a URL.

        A ``dir://`` URL with a host (``dir://user:pw@host/path``, ``dir://host:80/x``)
        is refused: the folder is ``dir:///abs/path`` or ``dir://relative/path``.
        """
        if isinstance(url, str) and ("\x00" in url or len(url) > 4096):
            raise InvalidURLError("a backend URL may not hold NUL bytes or exceed 4096 characters")
        if not isinstance(url, str) or "://" not in url:
            hint = ""
            if isinstance(url, str) and url.startswith(("/", ".", "~")):
                hint = f"; a folder is dir://{os.path.abspath(os.path.expanduser(url))}"
            raise InvalidURLError(
                f"not a backend URL (expected scheme://...): {redact_url(url)}{hint}"
            )
        try:
            parts: SplitResult = urlsplit(url)
            pairs = parse_qsl(parts.query, keep_blank_values=True) if parts.query else []
            options = dict(pairs)
            if ":" in parts.netloc:  # a port (or IPv6 host): checked here, not at first use
                _ = parts.port
        except ValueError as exc:
            # urllib's message may quote a piece of a password (a "/" in it ends the host,
            # and the rest reads as a port): where the URL holds a userinfo, not shown.
            why = (
                "check the part before '@' (in a password, write '/', '?', '#', '@' and ',' "
                "as %2F, %3F, %23, %40 and %2C)"
                if "@" in url
                else redact(str(exc))
            )
            raise InvalidURLError(f"cannot parse backend URL {redact_url(url)}: {why}") from None
        if "@" not in parts.netloc and "@" in parts.query + parts.fragment:
            # A password's raw "?" or "#" cut the URL before its "@": the rest would be read
            # as options (named in messages) or dropped, and a piece of it as the port.
            raise InvalidURLError(
                f"cannot parse backend URL {redact_url(url)}: an '@' after its '?' or '#' "
                "(in a password, write '/', '?', '#', '@' and ',' as %2F, %3F, %23, %40 and %2C)"
            )
        if "#" in url:  # a fragment was dropped, unsaid: dir:///srv/a#b opened /srv/a
            # Named up to its '#' only: what follows may be the rest of a password.
            raise InvalidURLError(
                f"a backend URL takes no '#' fragment: {redact_url(url.partition('#')[0])}#... "
                "(in a folder's name or a password, write '#' as %23)"
            )
        if not parts.scheme:
            raise InvalidURLError(f"backend URL has no scheme: {redact_url(url)}")
        if len(options) < len(pairs):  # which one counts would be a guess
            twice = sorted({name for name, _ in pairs if [n for n, _ in pairs].count(name) > 1})
            raise InvalidURLError(
                f"option(s) {', '.join(twice)} given more than once in {redact_url(url)}"
            )
        scheme = parts.scheme.lower()
        # dir://relative/path names a relative folder; userinfo or a port means a host.
        if scheme in _LOCAL_SCHEMES and ("@" in parts.netloc or ":" in parts.netloc):
            raise InvalidURLError(
                f"a {scheme}:// URL names a local folder and takes no host: "
                f"{redact_url(url)} (write {scheme}:///absolute/path)"
            )
        return cls(scheme, parts.netloc, parts.path, options, url)

    def folder(self) -> str | None:
        """The local folder a ``dir://``-style URL names, with its ``%XX`` escapes decoded
        as a ``file://`` URL's path is (``dir:///srv/my%20cache`` is ``/srv/my cache``;
        bytes that are not UTF-8 name the folder those bytes name, as ``os.fsdecode``
        has them); ``None`` when it names none (plain ``dir://``: the default folder).
        A path that decodes to a NUL byte is an :class:`InvalidURLError`.

        >>> BackendURL.parse("dir:///srv/my%20cache?max_size=1GB").folder()
        '/srv/my cache'
        """
        path = unquote(self.netloc + self.path, errors="surrogateescape")
        if "\x00" in path:
            raise InvalidURLError(
                f"a folder's path may not hold a NUL byte (%00): {redact_url(self.raw)}"
            )
        try:
            os.fsencode(path)
        except UnicodeEncodeError:  # a lone surrogate given as text: no file name
            raise InvalidURLError(
                f"a folder's path must be text a file name can hold: {redact_url(self.raw)}"
            ) from None
        return path or None

    def pop(self, name: str, default: str | None = None) -> str | None:
        """Take the option ``name`` out of the query, returning ``default`` if absent."""
        return self.options.pop(name, default)

    def pop_bool(self, name: str, default: bool) -> bool:
        """Take a boolean option (on/off, true/false, yes/no, 1/0); anything else is an error.

        >>> BackendURL.parse("dir:///x?fsync=on").pop_bool("fsync", False)
        True
        """
        text = self.options.pop(name, None)
        if text is None:
            return default
        try:
            return parse_bool(text)
        except InvalidValueError as exc:
            raise InvalidURLError(f"option {name}: {exc} in {redact_url(self.raw)}") from None

    def reject_unknown(self) -> None:
        """Raise :class:`InvalidURLError` if options are left that nobody took."""
        if self.options:
            names = ", ".join(sorted(self.options))
            where = redact_url(self.raw)
            raise InvalidURLError(f"unknown option(s) {names} in backend URL {where}")
