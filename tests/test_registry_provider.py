"""Registry (lazy, entry points, conflicts) and the process-wide provider."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache import registry as reg
from runtime_cache.api import Backend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import (
    BackendConflictError,
    InvalidURLError,
    MissingDependencyError,
    UnknownBackendError,
)


class ListBackend(MemoryBackend):
    scheme = "listy"

    @classmethod
    def from_url(cls, url: str) -> ListBackend:
        return cls()


@pytest.fixture
def fresh() -> Iterator[reg.Registry]:
    yield reg.Registry()


def test_builtins_come_from_entry_points(fresh: reg.Registry) -> None:
    assert {"memory", "dir", "callback", "redis", "rediss", "redis+cluster", "tiered"} <= set(
        fresh.names()
    )
    assert fresh._loaded == {}  # nothing imported until used
    assert fresh.resolve("memory") is MemoryBackend
    assert isinstance(fresh.open_url("dir://" + "/tmp/rc-reg-test"), DirectoryBackend)


def test_the_built_in_table_is_what_the_distribution_declares() -> None:
    """``BUILT_IN`` stands for the distribution's own entry points, read without
    ``importlib.metadata``: the two stay equal."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        eps = distribution(reg.OWN_DISTRIBUTION).entry_points.select(group=reg.ENTRY_POINT_GROUP)
    except PackageNotFoundError:
        pytest.skip("runtime-cache is not installed as a distribution here")
    assert {ep.name: ep.value for ep in eps} == reg.BUILT_IN


def test_the_default_cache_opens_without_importlib_metadata(tmp_path: Path) -> None:
    """An app on the default ``dir://`` cache (no pyopencl, no Redis) imported
    ``importlib.metadata`` to resolve the built-in scheme: 25-55 ms of imports on a
    2-core box, more than the rest of the cache's opening."""
    import subprocess
    import sys

    code = (
        "import sys, runtime_cache as rc\n"
        f"rc.Cache(rc.open_backend({'dir://' + str(tmp_path / 'c')!r})).close()\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_register_lazy_string_and_conflicts(fresh: reg.Registry) -> None:
    fresh.register("listy", f"{__name__}:ListBackend")
    assert isinstance(fresh.open_url("listy://x"), ListBackend)
    with pytest.raises(BackendConflictError):
        fresh.register("listy", MemoryBackend)
    fresh.register("listy", MemoryBackend, replace=True)
    assert fresh.resolve("listy") is MemoryBackend
    fresh.register("listy", MemoryBackend)  # same target again is not a conflict
    with pytest.raises(TypeError):
        fresh.register("bad", object)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        fresh.register("bad", "no-colon")


def test_unknown_scheme_lists_known(fresh: reg.Registry) -> None:
    with pytest.raises(UnknownBackendError, match="memory://"):
        fresh.open_url("nosuch://x")
    with pytest.raises(InvalidURLError):
        fresh.open_url("not a url")


def test_missing_dependency_names_the_packages_to_install(fresh: reg.Registry) -> None:
    fresh.register("redis", "no_such_redis_module_xyz:Backend", replace=True)
    with pytest.raises(MissingDependencyError, match=r"install it with: pip install 'redis>=5"):
        fresh.open_url("redis://localhost:6379/0")


def test_public_register_backend() -> None:
    rc.register_backend("listy-public", ListBackend)
    try:
        assert isinstance(rc.open_backend("listy-public://"), ListBackend)
    finally:
        reg.registry.unregister("listy-public")


@pytest.mark.parametrize(
    "url",
    [
        "memory://?max_size=nonsense",
        "memory://?bogus=1",
        "dir:///tmp/x?max_size=-1",
        "dir://?nope=1",
    ],
)
def test_bad_options_are_typed(url: str) -> None:
    with pytest.raises(InvalidURLError):
        rc.open_backend(url)


def test_a_backend_made_only_in_code_says_how_to_make_it() -> None:
    """callback:// is a known scheme, but its functions cannot come from a URL."""
    with pytest.raises(InvalidURLError, match=r"make it in Python .*Cache\(CallbackBackend"):
        rc.open_backend("callback://anything")


def test_memory_url_options() -> None:
    backend = rc.open_backend("memory://?max_size=1KiB")
    assert isinstance(backend, MemoryBackend) and backend.max_size == 1024


# ------------------------------------------------------------------ provider
def test_env_var_then_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_CACHE", "memory://")
    assert isinstance(rc.get_cache().backend, MemoryBackend)
    rc.reset_cache_provider()
    monkeypatch.setenv("RUNTIME_CACHE", "off")
    assert not rc.get_cache().enabled
    rc.reset_cache_provider()
    monkeypatch.delenv("RUNTIME_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    backend = rc.get_cache().backend
    assert isinstance(backend, DirectoryBackend)
    assert backend.root == tmp_path / "runtime-cache"


def test_bad_env_url_turns_caching_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_CACHE", "nosuch://x")
    assert not rc.get_cache().enabled


def test_set_provider_wins_and_accepts_all_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_CACHE", "off")
    assert rc.set_cache_provider("memory://").enabled
    assert isinstance(rc.get_cache().backend, MemoryBackend)
    backend = MemoryBackend()
    assert rc.set_cache_provider(backend).backend is backend
    cache = rc.Cache(MemoryBackend())
    assert rc.set_cache_provider(cache) is cache and rc.get_cache() is cache
    assert not rc.set_cache_provider(None).enabled
    with pytest.raises(TypeError):
        rc.set_cache_provider(42)  # type: ignore[arg-type]


def test_secret_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "s")
    assert rc.set_cache_provider("memory://").signed


def test_context_manager_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    outer = rc.set_cache_provider("memory://")
    with rc.cache_provider(None) as inner:
        assert rc.get_cache() is inner and not inner.enabled
    assert rc.get_cache() is outer


def test_get_cache_is_one_object_across_threads() -> None:
    seen: list[rc.Cache] = []
    threads = [threading.Thread(target=lambda: seen.append(rc.get_cache())) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 1


def test_backend_base_defaults() -> None:
    class Minimal(Backend):
        def __init__(self) -> None:
            self.d: dict[str, bytes] = {}

        def get(self, key: str) -> bytes | None:
            return self.d.get(key)

        def set(self, key: str, value: bytes) -> None:
            self.d[key] = value

        def delete(self, key: str) -> bool:
            return self.d.pop(key, None) is not None

        def keys(self, prefix: str = "") -> Iterator[str]:
            return iter([k for k in self.d if k.startswith(prefix)])

    with Minimal() as b:
        b.set_many({"a/1": b"x", "a/2": b"yy"})
        assert b.get_many(["a/1", "a/3"]) == {"a/1": b"x"}
        assert b.head("a/2", 1) == b"y"
        assert sorted((i.key, i.size) for i in b.scan("a/")) == [("a/1", 1), ("a/2", 2)]
        assert b.vacuum() == 0
    with pytest.raises(InvalidURLError):
        Minimal.from_url("minimal://")
    assert os.environ.get("RUNTIME_CACHE", "").startswith("dir://")  # the autouse isolation


def _a_file(tmp_path: Path) -> Path:
    """A file where a cache folder's parent would be: no folder can be made under it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker


def test_a_store_this_machine_cannot_open_turns_caching_off_not_the_app(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """set_cache_provider() raises for a wrong URL, but not for a folder it cannot make."""
    blocker = _a_file(tmp_path)
    with caplog.at_level(logging.ERROR, logger="runtime_cache"):
        cache = rc.set_cache_provider(f"dir://{blocker}/cache")
    assert not cache.enabled and rc.get_cache() is cache
    assert "caching is off" in caplog.text and "not a directory" in caplog.text
    with pytest.raises(InvalidURLError):
        rc.set_cache_provider(f"dir://{tmp_path}?max_sise=1GB")  # a typo: said at once


def test_a_tier_that_cannot_open_is_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from runtime_cache.backends.tiered import TieredBackend

    blocker = _a_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        cache = rc.set_cache_provider(f"memory://,dir://{blocker}/cache")
    assert isinstance(cache.backend, TieredBackend)
    assert [type(t).__name__ for t in cache.backend.tiers] == ["MemoryBackend"]
    assert "left out" in caplog.text
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    assert cache.put(key, b"v") and cache.get(key) == b"v"
    assert not rc.set_cache_provider(f"dir://{blocker}/a,dir://{blocker}/b").enabled


@pytest.mark.parametrize("url", ["dir:///tmp/rc-frag#b", "dir:///tmp/rc-frag#", "memory://#x"])
def test_a_url_with_a_fragment_is_refused(url: str) -> None:
    """Operator review, session 36: ``dir:///path#frag`` opened ``/path``, the fragment
    dropped unsaid (a folder whose name holds a '#' is written with %23)."""
    with pytest.raises(InvalidURLError, match="fragment"):
        rc.open_backend(url)


def test_a_fragment_error_shows_no_piece_of_a_password() -> None:
    """The review of the fix: the message named the URL redacted only up to its '#', so a
    password option holding a raw '#' showed its tail."""
    with pytest.raises(InvalidURLError) as caught:
        rc.open_backend("redis://127.0.0.1:6379/0?password=s3cr#etPART")
    assert "etPART" not in str(caught.value) and "s3cr" not in str(caught.value)
