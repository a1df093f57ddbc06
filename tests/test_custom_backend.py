"""The worked example of docs/guides/custom-backend.md: the SQLite backend of
tests/example_sqlite_backend.py, registered under its own URL scheme, passing the
conformance suite and driven by the CLI.

The docs page includes that module and the class between the snippet markers
below, so the page shows exactly the code these tests run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from example_sqlite_backend import SqliteBackend

import runtime_cache as rc
from runtime_cache.cli import main
from runtime_cache.registry import registry
from runtime_cache.testing import BackendConformance, CacheConformance


# --8<-- [start:conformance]
class TestSqliteBackend(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[SqliteBackend]:
        backend = SqliteBackend(str(tmp_path / "cache.db"))
        yield backend
        backend.close()


# --8<-- [end:conformance]


@pytest.fixture
def sqlite_scheme() -> Iterator[None]:
    rc.register_backend("sqlite", SqliteBackend)
    yield
    registry.unregister("sqlite")


def test_registered_scheme_opens_by_url(sqlite_scheme: None, tmp_path: Path) -> None:
    backend = rc.open_backend(f"sqlite://{tmp_path / 'app.db'}")
    assert isinstance(backend, SqliteBackend)
    cache = rc.Cache(backend)
    key = rc.make_key(module_id="m@1", runtime="opencl", purpose="program-binary", device=None)
    assert cache.get_or_build(key, lambda: b"binary") == b"binary"
    cache.close()
    with pytest.raises(rc.errors.InvalidURLError):
        rc.open_backend(f"sqlite://{tmp_path / 'app.db'}?journal=wal")


def test_name_conflicts_raise(sqlite_scheme: None) -> None:
    with pytest.raises(rc.errors.BackendConflictError):
        rc.register_backend("sqlite", "somewhere.else:OtherBackend")


def test_the_cli_works_on_the_custom_backend(
    sqlite_scheme: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path / 'app.db'}"
    with rc.cache_provider(url) as cache:
        for i in range(3):
            key = rc.make_key(module_id="m@1", runtime="opencl", purpose="tuning", device=None, i=i)
            cache.put(key, b"record %d" % i, build_seconds=0.5)
        cache.close()
    assert main(["--cache", url, "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["entries"]
    assert len(listed) == 3
    assert all(e["hits"] is None for e in listed)  # this backend keeps no hit counts
    assert main(["--cache", url, "verify"]) == 0
