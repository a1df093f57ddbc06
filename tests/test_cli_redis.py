"""The runtime-cache command on a real redis-server: listings, bundles, verify, and a server
that is down being reported (exit code 1), never shown as an empty cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.cli import main

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]


def _run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["--cache", url, *argv, "--json"])
    out = capsys.readouterr().out
    found = json.loads(out) if out.strip() else None
    if argv[0] == "ls" and found is not None:
        assert found["skipped"] == 0, found
        return code, found["entries"]
    return code, found


def _keys(n: int) -> list[rc.CacheKey]:
    return [
        rc.make_key(module_id="net@1", runtime="opencl", purpose=p, device={"name": "X"}, i=i)
        for i, p in enumerate(["program-binary", "tuning"] * (n // 2))
    ]


def test_listing_bundles_and_verify_on_redis(
    redis_server: RedisProcess,
    unique_prefix: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "test-secret")  # a shared store is signed
    url = f"{redis_server.url}?prefix={unique_prefix}"
    cache = rc.Cache(rc.open_backend(url), secret="test-secret")
    keys = _keys(6)
    for k in keys:
        cache.put(k, b"value of " + str(k).encode(), build_seconds=0.5)
    code, listed = _run(capsys, url, "ls")
    assert code == 0 and sorted(e["key"] for e in listed) == sorted(map(str, keys))
    code, stats = _run(capsys, url, "stats")
    assert stats["overall"]["entries"] == 6
    assert {g["purpose"] for g in stats["groups"]} == {"program-binary", "tuning"}

    bundle = tmp_path / "fleet.rcb"
    assert _run(capsys, url, "export", str(bundle))[1]["entries"] == 6
    assert main(["--cache", url, "clear", "--yes"]) == 0
    assert _run(capsys, url, "ls") == (0, [])
    assert _run(capsys, url, "import", str(bundle))[1]["accepted"] == 6
    code, again = _run(capsys, url, "ls")
    assert [(e["key"], e["parts"], e["created_at"]) for e in again] == [
        (e["key"], e["parts"], e["created_at"]) for e in listed
    ]

    blob = cache.backend.get(str(keys[2]))
    assert blob is not None
    cache.backend.set(str(keys[2]), blob[:-1] + bytes([blob[-1] ^ 1]))
    code, report = _run(capsys, url, "verify", "--repair")
    assert code == 1 and [b["key"] for b in report["bad"]] == [str(keys[2])]
    assert report["removed"] == 1
    assert sorted(cache.backend.keys()) == sorted(str(k) for k in keys if k != keys[2])
    main(["--cache", url, "clear", "--yes"])
    cache.close()


def test_a_server_that_is_down_is_an_error_not_an_empty_cache(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from redis_servers import free_port, require_redis

    require_redis("redis-server")  # the redis extra is what is under test here
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=500ms&connect_timeout=200ms"
    code = main(["--cache", url, "--secret", "test-secret", "ls", "--json"])
    captured = capsys.readouterr()
    assert code == 1
    # Not an empty listing: with --json, the failure itself (operator review, session 40).
    report = json.loads(captured.out)
    assert set(report) == {"error", "exit_code"} and report["exit_code"] == 1
    assert "error" in captured.err and "secret" not in captured.err  # the server, not trust


def test_an_import_into_a_server_that_is_down_still_reports_in_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The third review: a store failure that ends an import printed no JSON, so a script
    reading ``--json`` had nothing to parse (an unreadable bundle always had a report)."""
    from redis_servers import free_port, require_redis

    require_redis("redis-server")
    source = rc.Cache(rc.open_backend("memory://"), secret="test-secret")
    for key in _keys(4):
        source.put(key, b"v")
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=500ms&connect_timeout=200ms"
    code, report = _run(capsys, url, "--secret", "test-secret", "import", str(bundle))
    assert code == 1
    assert report["accepted"] == 0 and report["in_bundle"] == 4 and report["error"]


def test_names_a_folder_tier_cannot_hold_are_junk_through_the_stack_too(
    redis_server: RedisProcess,
    unique_prefix: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attack review: ``a b`` and ``../x`` planted in Redis under a ``dir://,redis://``
    stack made ``ls``, ``verify --repair`` and ``clear --yes`` fail every time ("not a
    cache key"), and nothing removed them. They are now what they are in Redis alone:
    corrupt entries, listed as such, removed by ``verify --repair`` and by ``clear``."""
    import redis

    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "test-secret")
    alone = f"{redis_server.url}?prefix={unique_prefix}"
    url = f"dir://{tmp_path / 'c'},{alone}"
    cache = rc.Cache(rc.open_backend(url), secret="test-secret")
    (good,) = _keys(2)[:1]
    cache.put(good, b"kept")
    cache.close()
    client = redis.Redis(port=redis_server.port)
    planted = [f"{unique_prefix}{name}".encode() for name in ("a b", "../x")]

    def plant() -> None:
        for name in planted:
            client.set(name, b"x")

    plant()
    listings = []
    for where in (alone, url):
        capsys.readouterr()
        assert main(["--cache", where, "ls", "--json"]) == 1
        listings.append(json.loads(capsys.readouterr().out)["skipped_entries"])
    assert listings[0] == listings[1] and len(listings[1]) == 2, listings
    code, report = _run(capsys, url, "verify", "--repair")
    assert code == 1 and sorted(b["key"] for b in report["bad"]) == ["../x", "a b"], report
    assert report["removed"] == 2 and not any(map(client.exists, planted))
    code, report = _run(capsys, url, "verify")
    assert code == 0 and report["checked"] == 1, report
    plant()
    assert main(["--cache", url, "clear", "--yes"]) == 0
    assert not any(map(client.exists, planted)) and not client.keys(f"{unique_prefix}*")
    assert _run(capsys, url, "ls") == (0, [])
