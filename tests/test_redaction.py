"""The Redis password never shows: not in logs, exceptions, reprs or CLI output.

Each URL form is run, against a real ``redis-server`` that requires the
password, through everything that can show a URL: opening the backend (its
repr, or the error), storing and reading through a :class:`Cache` (its log
lines), the process-wide provider as a non-first tier (its log line), and the
``runtime-cache`` command with ``--verbose``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache.cli import main
from runtime_cache.errors import InvalidURLError
from runtime_cache.urls import redact, redact_url

pytest_plugins = ["redis_servers"]

#: Distinct halves, so a password cut at its raw "@" is caught too.
PW = "Hunter2xQ"
PW_AT = "Hunter2x@Zq9"
SECRETS = ("Hunter2x", "Zq9")


@pytest.fixture(scope="module")
def locked_server() -> Iterator[Any]:
    """A private server whose password is ``PW``; a second user's password is ``PW_AT``."""
    import redis
    from redis_servers import require_redis, running_server

    require_redis("redis-server")
    with running_server() as server:
        client = redis.Redis(port=server.port)
        client.acl_setuser(
            "app", enabled=True, passwords=[f"+{PW_AT}"], commands=["+@all"], keys=["*"]
        )
        client.config_set("requirepass", PW)
        client.close()
        yield server


def _forms(port: int) -> dict[str, str]:
    host = f"127.0.0.1:{port}"
    return {
        # the five forms that leaked
        "non-first tier": f"memory://,redis://:{PW}@{host}/0",
        "leading space": f" redis://:{PW}@{host}/0",
        "query password": f"redis://{host}/0?password={PW}",
        "raw @ in password": f"redis://app:{PW_AT}@{host}/0",
        "alias scheme": f"valkey://:{PW}@{host}/0",  # Redis's class, under another name
        "unknown scheme": f"unix://:{PW}@/tmp/no-such.sock",
        # plain forms
        "plain": f"redis://:{PW}@{host}/0",
        "tls": f"rediss://:{PW}@{host}/0?connect_timeout=300ms&timeout=300ms",
        "cluster": f"redis+cluster://:{PW}@{host}?connect_timeout=300ms&timeout=300ms",
        "server down": f"redis://:{PW}@127.0.0.1:1/0?connect_timeout=200ms",
        "wrong password": f"redis://:wrong{PW}@{host}/0",
        "bad option": f"redis://:{PW}@{host}/0?bogus=1",
    }


def _exercise(url: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Everything a URL can show up in; returns the texts that were shown."""
    shown: list[str] = [redact(url), redact_url(url)]
    try:
        backend = rc.open_backend(url)
    except Exception as exc:
        shown += [str(exc), repr(exc)]
    else:
        shown.append(repr(backend))
        cache = rc.Cache(backend, secret="test-secret")
        key = rc.make_key(module_id="m", runtime="t", purpose="redaction", device=None)
        cache.put(key, b"v")
        cache.get(key)
        shown += [repr(cache), str(list(cache.entries()))]
        cache.close()
    monkeypatch.setenv("RUNTIME_CACHE", url if "," in url else f"memory://,{url}")
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "test-secret")
    rc.reset_cache_provider()
    provider = rc.get_cache()
    shown.append(repr(provider))
    key = rc.make_key(module_id="m", runtime="t", purpose="provider", device=None)
    provider.put(key, b"v")
    provider.get(key)
    rc.reset_cache_provider()
    return shown


def test_the_password_never_appears(
    locked_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from runtime_cache.backends.redis import RedisBackend

    rc.register_backend("valkey", RedisBackend, replace=True)
    caplog.set_level(logging.DEBUG)
    seen: dict[str, str] = {}
    for name, url in _forms(locked_server.port).items():
        caplog.clear()
        shown = _exercise(url, monkeypatch)
        capsys.readouterr()
        secret = ["--secret", "test-secret"]  # shared caches are opened with a secret
        codes = [
            main(["--verbose", "--cache", url, *secret, "ls"]),
            main(["--verbose", "--cache", url, *secret, "stats", "--json"]),
            main(["--verbose", "--cache", f"memory://,{url}", *secret, "verify"]),
        ]
        out, err = capsys.readouterr()
        text = "\n".join([*shown, caplog.text, out, err])
        seen[name] = text
        for secret in SECRETS:
            assert secret not in text, (name, text)
        assert "Traceback" not in out + err, name
        assert all(code in (0, 1, 2) for code in codes), (name, codes)
    # The test saw real outcomes, not only errors: the right password works,
    # and the wrong one, the down server and the bad option are reported.
    assert "checked 2 entries" in seen["plain"] and "0 bad" in seen["plain"]  # 2 puts, signed
    assert "***" in seen["wrong password"] and "error" in seen["wrong password"]
    assert "unknown option(s) bogus" in seen["bad option"]
    assert "not a Redis URL: 'valkey://:***@" in seen["alias scheme"]


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:p@ss@h/0", "redis://user:***@h/0"),
        ("rediss://pw@h", "rediss://***@h"),
        ("redis://h/0?password=pw&db=1", "redis://h/0?password=***&db=1"),
        ("memory://, redis://:pw@h/0", "memory://, redis://:***@h/0"),
        (" redis+cluster://:pw@h", " redis+cluster://:***@h"),
        ("dir:///srv/a:b@c", "dir:///srv/a:b@c"),
        ("cannot open 'unix://:pw@/tmp/s' (down)", "cannot open 'unix://:***@/tmp/s' (down)"),
        # (the attacker review: a password's raw "/", "#", "?" or "," ended the match)
        ("redis://:pw/x@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://u:p#w@h/0", "redis://u:***@h/0"),
        ("redis://:p?w@h/0", "redis://:***@h/0"),
        ("redis://:p,w@h/0", "redis://:***@h/0"),
        ("dir:///srv/a@b,redis://:p/w@h", "dir:///srv/a@b,redis://:***@h"),
        ("a://" * 5 + "b", "a://" * 5 + "b"),
    ],
)
def test_one_redactor_for_every_form(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert redact_url(text) == repr(shown)


@pytest.mark.parametrize(
    "password",
    [
        "Hunter2x/Zq9",
        "Hunter2x#Zq9",
        "Hunter2x?Zq9",
        "Hunter2x,Zq9",
        # (the review of the fix: a first half that reads as a port, a quote, a space)
        "2024/Hunter2xZq9",
        "/Hunter2xZq9",
        "2024?Hunter2xZq9",
        "2024#Hunter2xZq9",
        "Hunter2x'Zq9/x",
        "Hunter2x Zq9/x",
    ],
)
@pytest.mark.parametrize("tiers", [False, True], ids=["one", "tiered"])
def test_a_raw_password_that_breaks_the_url_is_never_shown(password: str, tiers: bool) -> None:
    """The attacker review: urllib's message quoted the password's first half as a port,
    and a ',' cut the URL into tiers that were each named in the error."""
    url = f"redis://:{password}@127.0.0.1:1/0"
    url = f"memory://,{url}" if tiers else url
    try:
        backend = rc.open_backend(url)
    except InvalidURLError as exc:
        text = f"{exc} {exc!r}"
    else:  # ("#" and "?" end the authority: the rest is a fragment or a query)
        text = repr(backend)
        backend.close()
    for secret in (*SECRETS, "Hunter2xZq9"):
        assert secret not in text, text


def test_redaction_takes_time_linear_in_the_text() -> None:
    """The review of the fix: a pattern that ran to the last '@' took seconds on 40 KB of
    repeated ``a://`` (the raw RUNTIME_CACHE value is redacted before any length check)."""
    import time

    for text in ("a://" * 10_000, "a" * 40_000 + "://", "x://," * 10_000 + "@h"):
        started = time.process_time()
        redact(text)
        redact_url(text)
        assert time.process_time() - started < 0.5


@pytest.mark.parametrize("password", ["Hunter2x Zq9", "Hunter2x'Zq9", 'Hunter2x"Zq9'])
def test_a_tier_list_error_never_shows_a_password_with_a_blank_or_a_quote(password: str) -> None:
    """The second review of the fix: "empty tier" and "tiers cannot nest" named the list
    through redact(), whose pass over free text ends at a blank or a quote."""
    for url in (
        f"memory://,redis://u:{password}@127.0.0.1:1/0,",
        f"tiered://memory://,tiered://redis://u:{password}@127.0.0.1:1/0",
    ):
        with pytest.raises(InvalidURLError) as caught:
            rc.open_backend(url)
        for secret in SECRETS:
            assert secret not in f"{caught.value} {caught.value!r}", caught.value


def test_the_last_reviews_url_forms() -> None:
    """The last review: redact() on a tier list left the first URL's password when a later
    one had an '@'; a URL missing a '/' of '://' was shown whole."""
    from runtime_cache.urls import redacted

    assert (
        redact("redis://:Hunter2x@h1/0,redis://:Zq9@h2/0") == "redis://:***@h1/0,redis://:***@h2/0"
    )
    assert (
        redact("redis://:Hunter2x@h1/0,dir:///srv/c@team") == "redis://:***@h1/0,dir:///srv/c@team"
    )
    for typo in (
        "redis:/:Hunter2xZq9@cache:6379/0",
        "redis:Hunter2xZq9@cache:6379/0",
        # (the review of that fix: a typo in a tier list, no ':' at all, '://' in a password)
        "redis:Hunter2xZq9@h:6379/0,memory://",
        "dir:///tmp/x,redis:/:Hunter2xZq9@h:6379/0",
        "redis//:Hunter2xZq9@cache:6379/0",
        "redis://u:Hunter2x://Zq9@cache:6379/0",
    ):
        assert "Hunter2x" not in redacted(typo) and "Zq9" not in redacted(typo)
        assert "Hunter2x" not in redact(typo) or "://" not in typo.partition("@")[0][8:]
        with pytest.raises(InvalidURLError) as caught:
            rc.open_backend(typo)
        assert "Hunter2x" not in str(caught.value)
