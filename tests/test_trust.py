"""Trust, without OpenCL: the one entry check on every read path, signed shared stores,
compare-and-delete, newer formats kept (issue 13)."""

from __future__ import annotations

import ast
import json
import logging
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import xxhash

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.cli import main
from runtime_cache.errors import InsecureStoreError, InvalidSecretError
from runtime_cache.maintenance import verify
from runtime_cache.provider import cache_from_url
from runtime_cache.tuning import TuningCache

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

ROOT = Path(__file__).resolve().parent.parent
SECRET = "ls-secret-0123456789abcdef"


def _key(i: int, **extra: object) -> rc.CacheKey:
    return rc.make_key(
        module_id="m@1", runtime="opencl", purpose="program-binary", device={"n": 1}, i=i, **extra
    )


def _transplant(blob: bytes, new_key: str, parts: dict[str, object] | None = None) -> bytes:
    """Rewrite an unsigned entry's key (and, if given, its parts), fixing its checksums:
    what anyone who can write the store can do without a compiler."""
    entry = codec.decode_entry(blob)
    return codec.encode_entry(
        new_key,
        parts if parts is not None else entry.parts,
        entry.value,
        created_at=entry.created_at,
        build_seconds=entry.build_seconds,
        producer=entry.producer,
    )


# ------------------------------------------------------------------ the one check
READ_PATHS = {
    "runtime_cache/cache.py": {"check_entry"},
    "runtime_cache/listing.py": {"check_binding"},
    "runtime_cache/bundles.py": {"check_entry"},
    "runtime_cache/maintenance.py": {"decode"},
    "runtime_cache/tuning.py": {"check"},
    "runtime_cache/opencl/bundle.py": {"check_entry"},
    "runtime_cache/opencl/precompiled.py": {"check"},
    "runtime_cache/cli/bundles.py": {"dumps"},  # export: Cache.dumps checks each entry
    "runtime_cache/cli/inspect.py": {"decode"},  # show
}


def _called(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


@pytest.mark.parametrize("module", sorted(READ_PATHS))
def test_every_read_path_calls_the_one_check(module: str) -> None:
    # Cache.decode and Cache.check are check_entry with the cache's secret and limits.
    assert READ_PATHS[module] <= _called(ROOT / module), module
    source = (ROOT / module).read_text(encoding="utf-8")
    for copy in ("decode_entry(", "decode_view(", "CacheKey.from_parts("):
        assert copy not in source, f"{module} screens entries itself: {copy}"


def test_a_transplanted_entry_is_refused_on_every_read_path(tmp_path: Path) -> None:
    """The entry of key 1 copied under key 2 (its key rewritten, checksums fixed)."""
    backend = MemoryBackend()
    cache = rc.Cache(backend)
    cache.put(_key(1), b"value of 1")
    good = backend.get(str(_key(1)))
    assert good is not None
    forged = _transplant(good, str(_key(2)))
    backend.set(str(_key(2)), forged)

    assert cache.get(_key(2)) is None
    assert cache.get(str(_key(2))) is None
    assert cache.get_many([_key(2)]) == {}
    assert cache.get_many_views([str(_key(2))]) == {}
    assert cache.stats().rejected == 4 and cache.stats().corrupt == 0
    assert backend.get(str(_key(2))) == forged  # rejected entries are kept
    assert [info.key for info in cache.entries()] == [str(_key(1))]
    report = verify(cache)
    assert [bad for bad, _ in report.bad] == [str(_key(2))]
    bundle = codec.encode_bundle([good, forged])
    assert rc.Cache(MemoryBackend()).loads(bundle) == 1
    dumped = cache.dumps(keys=[_key(1), _key(2)])
    assert len(codec.decode_bundle(dumped)) == 1
    from runtime_cache.opencl.bundle import unpack_programs

    assert [entry.key for entry, _ in unpack_programs(bundle)] == [str(_key(1))]
    tuning = TuningCache("m@1", "demo", {"n": 1}, cache=rc.Cache(MemoryBackend()))
    record = TuningCache("m@1", "demo", {"n": 1}, cache=rc.Cache(MemoryBackend()))
    record.put("sym", {"tile": 4})
    real = record.cache.backend.get(str(record.key("sym")))
    assert real is not None
    moved = _transplant(real, str(record.key("other")))
    assert tuning.loads(codec.encode_bundle([moved])) == 0
    assert tuning.loads(codec.encode_bundle([real])) == 1
    url = f"dir://{tmp_path / 'store'}"
    store = rc.Cache(rc.open_backend(url))
    store.put(_key(1), b"value of 1")
    store.backend.set(str(_key(2)), forged)
    # Exit code 1: export says it left an entry out.
    assert main(["--cache", url, "export", str(tmp_path / "out.rcb")]) == 1
    assert len(codec.decode_bundle((tmp_path / "out.rcb").read_bytes())) == 1  # left out


def test_parts_that_hash_to_another_key_are_rejected_even_with_the_right_key() -> None:
    backend = MemoryBackend()
    cache = rc.Cache(backend)
    cache.put(_key(1, options="-DBIAS=1000"), b"biased")
    blob = backend.get(str(_key(1, options="-DBIAS=1000")))
    assert blob is not None
    target = _key(1, options="-DBIAS=0")
    backend.set(str(target), _transplant(blob, str(target)))  # parts still say BIAS=1000
    assert cache.get(target) is None and cache.stats().rejected == 1
    assert cache.get_or_build(target, lambda: b"unbiased") == b"unbiased"
    assert cache.get(target) == b"unbiased"  # the next store replaced the transplant


def test_the_fast_parts_comparison_agrees_with_a_full_derivation() -> None:
    key = _key(3, options="-O2", flags=[1, 2.5, True, None, b"x", {"z": 1, "a": [0]}])
    assert key.made_from(key.parts)
    assert key.made_from(dict(reversed(list(key.parts.items()))))  # order does not matter
    assert not key.made_from({**key.parts, "i": True})  # True is not 3, nor 1
    assert not key.made_from({**key.parts, "i": 3.0})
    assert not key.made_from({**key.parts, "options": "-O3"})
    assert not key.made_from({"module_id": 1})


# -------------------------------------------------------------- shared stores
def test_redis_without_a_secret_refuses_to_open(redis_server: RedisProcess) -> None:
    with pytest.raises(InsecureStoreError, match=r"RUNTIME_CACHE_SECRET.*insecure=1"):
        rc.Cache(rc.open_backend(redis_server.url))
    with pytest.raises(InsecureStoreError):
        rc.set_cache_provider(redis_server.url)
    for url in ("rediss://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"):
        with pytest.raises(InsecureStoreError):
            rc.Cache(rc.open_backend(url))
    with pytest.raises(InsecureStoreError):
        rc.Cache(rc.open_backend(f"memory://,{redis_server.url}"))


def test_a_tier_copies_nothing_up_from_a_shared_store_before_the_check(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    """An unsigned entry planted in Redis, read once by a signed cache over
    ``dir://,redis://``: it was rejected, but promoted into the private folder first. A
    cache of the same user over that folder (private: no secret needed) then served it,
    ``export --sign`` signed it for the fleet, and it hid the good entry stored later."""
    import redis

    url = f"{redis_server.url}?prefix=promo:"
    key = rc.make_key(module_id="net", runtime="opencl", purpose="program-binary")
    planted = codec.encode_entry(str(key), key.parts, b"EVIL", created_at=time.time())
    client = redis.Redis.from_url(redis_server.url)
    client.set(f"promo:{key}", planted)
    victim = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'd'},{url}"), secret="fleet")
    assert victim.get(key) is None and victim.stats().rejected == 1
    assert victim.get_many([key]) == {} and victim.stats().rejected == 2
    victim.close()
    local = rc.Cache(DirectoryBackend(tmp_path / "d"))
    assert local.get(key) is None and len(list(local.entries())) == 0
    # The good entry a fleet member stores later is served through the same tiers.
    rc.Cache(rc.open_backend(url), secret="fleet").put(key, b"GOOD")
    again = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'd'},{url}"), secret="fleet")
    assert again.get(key) == b"GOOD"
    again.close()
    assert rc.Cache(DirectoryBackend(tmp_path / "d"), secret="fleet").get(key) == b"GOOD"
    # A cache opened again over the same backend object with a rotated secret is not held
    # to the old one's check once that cache is gone (its entries were never copied up).
    import gc

    backend = rc.open_backend(f"dir://{tmp_path / 'e'},{url}")
    old = rc.Cache(backend, secret="fleet")
    del old
    gc.collect()
    newer = rc.Cache(backend, secret="fleet-2")
    other = rc.make_key(module_id="net2", runtime="opencl", purpose="program-binary")
    rc.Cache(rc.open_backend(url), secret="fleet-2").put(other, b"NEW")
    assert newer.get(other) == b"NEW"
    assert rc.Cache(DirectoryBackend(tmp_path / "e"), secret="fleet-2").get(other) == b"NEW"
    newer.close()
    # With every cache over it gone, the backend copies nothing up from the shared tier
    # (it copied unchecked: the fourth review).
    del newer
    gc.collect()
    third = rc.make_key(module_id="net3", runtime="opencl", purpose="program-binary")
    client.set(f"promo:{third}", codec.encode_entry(str(third), third.parts, b"X", created_at=1))
    assert backend.get(str(third)) is not None
    assert DirectoryBackend(tmp_path / "e").get(str(third)) is None
    client.close()


def test_insecure_1_opens_with_one_warning(
    redis_server: RedisProcess, unique_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{redis_server.url}?prefix={unique_prefix}&insecure=1"
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        backend = rc.open_backend(url)
        cache = rc.Cache(backend)
        again = rc.Cache(backend)
    warnings = [r for r in caplog.records if "unsigned (insecure=1)" in r.getMessage()]
    assert len(warnings) == 1
    assert cache.put(_key(1), b"x") and again.get(_key(1)) == b"x"
    assert not cache.signed
    backend.delete(str(_key(1)))
    backend.close()


def test_a_refused_shared_folder_is_not_made_or_changed_and_a_callers_backend_stays_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused open (`set_cache_provider`, `RUNTIME_CACHE`, the CLI) is refused from its
    URL, before the folder is made or changed. It was refused after the open, which had
    made the folder shared (setgid, group-writable): a user's own private cache folder,
    named once with ``shared=1`` and no secret, stayed ``2775``, and every later private
    cache of that user refused it. (Removing what the open made raced with another process
    that had just opened the same new folder.)"""
    monkeypatch.delenv("RUNTIME_CACHE_SECRET", raising=False)
    made = tmp_path / "made-now"
    own = tmp_path / "own"
    rc.Cache(rc.open_backend(f"dir://{own}")).put(_key(1), b"v")
    before = own.stat().st_mode
    for url in (
        f"dir://{made}?shared=1",
        f"dir://{own}?shared=1",
        f"memory://,dir://{own}?shared=1",
    ):
        with pytest.raises(InsecureStoreError, match="without a secret"):
            rc.set_cache_provider(url)
        # (``ls`` makes no folder: where there is none it says so first, exit 1.)
        assert main(["--cache", url, "ls"]) == (1 if str(made) in url else 2)
        monkeypatch.setenv("RUNTIME_CACHE", url)
        rc.reset_cache_provider()
        assert not rc.get_cache().enabled
        monkeypatch.delenv("RUNTIME_CACHE")
        rc.reset_cache_provider()
    # A blank secret is refused before the open too (it made the folder 2775 first).
    for secret in ([""], ["  "]):
        with pytest.raises(InvalidSecretError):
            cache_from_url(f"dir://{made}?shared=1", secret=secret)
    assert main(["--secret", " ", "--cache", f"dir://{own}?shared=1", "ls"]) == 2
    assert not made.exists()
    assert (
        own.stat().st_mode == before
        and rc.Cache(rc.open_backend(f"dir://{own}")).get(_key(1)) == b"v"
    )
    # A backend object the caller made is the caller's: refused, it stays open and usable
    # (a first fix closed it and removed its new folder: a retry with a secret wrote nowhere).
    mine = tmp_path / "mine"
    backend = rc.open_backend(f"dir://{mine}?shared=1")
    with pytest.raises(InsecureStoreError):
        rc.Cache(backend)
    signed = rc.Cache(backend, secret=SECRET)
    assert signed.put(_key(1), b"v") and signed.get(_key(1)) == b"v"
    backend.close()


def test_a_backend_shared_per_instance_is_judged_once_it_opens() -> None:
    """The re-attack: a third party's class whose ``shared`` is a property (or a class
    value its instances set otherwise) was refused from its URL alone."""
    from runtime_cache.registry import Registry

    class PerInstance(MemoryBackend):
        scheme = "perinstance"

        @property  # type: ignore[override]
        def shared(self) -> bool:
            return False

    registry = Registry()
    registry.register("perinstance", PerInstance)
    assert registry.shared_parts("perinstance://") == []
    assert len(registry.shared_parts("redis://h/0")) == 1


def test_a_shared_folder_needs_a_secret(tmp_path: Path) -> None:
    url = f"dir://{tmp_path}?shared=1"
    with pytest.raises(InsecureStoreError):
        rc.Cache(rc.open_backend(url))
    assert rc.Cache(rc.open_backend(url), secret="s").signed
    assert not rc.Cache(rc.open_backend(url + "&insecure=1")).signed
    assert not rc.Cache(rc.open_backend(f"dir://{tmp_path}")).signed  # private: no secret needed


@pytest.mark.parametrize("secret", ["", "   ", b"", b" \n", [], [""], 3])
def test_empty_or_blank_secrets_are_errors(secret: object) -> None:
    with pytest.raises(InvalidSecretError):
        rc.Cache(MemoryBackend(), secret=secret)  # type: ignore[arg-type]


def test_secret_rotation_accepts_either_and_signs_with_the_first() -> None:
    backend = MemoryBackend()
    old = rc.Cache(backend, secret="old")
    old.put(_key(1), b"signed with old")
    rotating = rc.Cache(backend, secret=["new", "old"])
    assert rotating.get(_key(1)) == b"signed with old"
    rotating.put(_key(2), b"signed with new")
    assert rc.Cache(backend, secret="new").get(_key(2)) == b"signed with new"
    assert old.get(_key(2)) is None and old.stats().rejected == 1
    bundle = rotating.dumps()
    assert rc.Cache(MemoryBackend(), secret=["new"]).loads(bundle) == 1  # bundle signed by new


def test_secrets_from_the_environment_and_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from runtime_cache import environment

    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "new-key-0123456789, old-key-0123456789")
    assert environment.read_secret() == ["new-key-0123456789", "old-key-0123456789"]
    # A comma inside one secret split it into keys that each verified, one of a byte.
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "x,Zq9#long-part-of-a-passphrase")
    with pytest.raises(InvalidSecretError, match="key 1 has 1 characters"):
        environment.read_secret()
    assert main(["--cache", "memory://", "--secret", "pass,word", "ls"]) == 2
    assert "secret file" in capsys.readouterr().err
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", "one-secret-of-any-length")
    assert environment.read_secret() == ["one-secret-of-any-length"]
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n\nolder\n", encoding="utf-8")
    monkeypatch.setenv("RUNTIME_CACHE_SECRET_FILE", str(secret_file))
    assert environment.read_secret() == ["from-file", "older"]
    secret_file.write_text("  \n", encoding="utf-8")
    with pytest.raises(InvalidSecretError):
        environment.read_secret()
    monkeypatch.delenv("RUNTIME_CACHE_SECRET_FILE")
    monkeypatch.delenv("RUNTIME_CACHE_SECRET")
    secret_file.write_text("cli-file\n", encoding="utf-8")
    url = f"dir://{tmp_path / 'c'}?shared=1"
    (tmp_path / "c").mkdir()  # (`ls` on a folder that is not there creates none)
    (tmp_path / "private").mkdir()
    capsys.readouterr()
    assert main(["--cache", url, "ls"]) == 2  # a shared folder without a secret: a usage error
    assert "insecure=1" in capsys.readouterr().err
    assert main(["--cache", url, "--secret-file", str(secret_file), "ls"]) == 0
    assert "signed:  yes" in capsys.readouterr().out
    assert main(["--cache", url, "--secret-file", str(secret_file), "stats", "--json"]) == 0
    assert '"signed": true' in capsys.readouterr().out
    assert main(["--cache", f"dir://{tmp_path / 'private'}", "ls"]) == 0
    assert "signed:  no" in capsys.readouterr().out


def test_ls_and_stats_with_a_secret_count_the_entries_that_carry_no_signature(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator with the secret sees that reads will reject some entries, before any
    read does (the header's flag is counted; verify checks the signatures themselves)."""
    root = tmp_path / "c"
    plain = rc.Cache(DirectoryBackend(root))
    for i in range(2):
        plain.put(rc.make_key(module_id=f"old{i}", runtime="r", purpose="p"), b"unsigned")
    signed = rc.Cache(DirectoryBackend(root), secret=SECRET)
    signed.put(rc.make_key(module_id="new", runtime="r", purpose="p"), b"signed")
    url = f"dir://{root}"
    capsys.readouterr()
    assert main(["--cache", url, "--secret", SECRET, "ls"]) == 0
    out = capsys.readouterr().out
    assert "2 entries carry no signature: reads reject them" in out
    assert main(["--cache", url, "--secret", SECRET, "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["overall"]["unsigned"] == 2
    assert main(["--cache", url, "--secret", SECRET, "ls", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unsigned"] == 2
    assert main(["--cache", url, "stats"]) == 0  # no secret: nothing is rejected, none said
    assert "no signature" not in capsys.readouterr().out
    assert main(["--cache", url, "--secret", SECRET, "verify"]) == 1
    said = capsys.readouterr().out
    assert "2 entries are unsigned (stored without a secret): reads reject them" in said
    assert main(["--cache", url, "--secret", SECRET, "verify", "--repair"]) == 1
    capsys.readouterr()
    assert main(["--cache", url, "--secret", SECRET, "ls"]) == 0
    assert "no signature" not in capsys.readouterr().out


def test_a_cache_made_in_code_says_it_does_not_read_the_secret_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variable set, Cache(backend) without secret=: the message must not say "set it"."""
    shared = DirectoryBackend(tmp_path / "s", shared=True)
    with pytest.raises(InsecureStoreError, match="Set RUNTIME_CACHE_SECRET"):
        rc.Cache(shared)
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", SECRET)
    with pytest.raises(InsecureStoreError, match=r"is set, but Cache\(backend\) does not read"):
        rc.Cache(shared)
    assert rc.Cache(shared, secret=SECRET).signed


# --------------------------------------------------------------- unsigned bundles
def test_an_unsigned_bundle_never_brings_native_code_even_into_a_private_store() -> None:
    """A driver's cache files are loaded with no check of ours: from a bundle, only signed
    (an adversarial review ran its own library in the victim through one)."""
    drv = rc.make_key(module_id="m", runtime="opencl", purpose="driver-cache")
    prog = rc.make_key(module_id="m", runtime="opencl", purpose="program-binary")
    source = rc.Cache(MemoryBackend())
    source.put(drv, b"files")
    source.put(prog, b"binary")
    private = rc.Cache(MemoryBackend())
    result = private.loads(source.dumps())
    assert (int(result), result.withheld) == (1, 1)
    assert private.get(prog) == b"binary" and private.get(drv) is None
    signer = rc.Cache(MemoryBackend(), secret=SECRET)
    signer.put(drv, b"files")
    trusting = rc.Cache(MemoryBackend(), secret=SECRET)
    assert int(trusting.loads(signer.dumps())) == 1 and trusting.get(drv) == b"files"


def test_an_unsigned_bundle_is_reported_and_never_written_to_a_shared_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    maker = rc.Cache(MemoryBackend())
    maker.put(_key(1), b"from somewhere")
    bundle = maker.dumps()
    shared = rc.Cache(rc.open_backend(f"dir://{tmp_path / 's'}?shared=1&insecure=1"))
    result = shared.loads(bundle)
    assert result == 0 and result.withheld == 1 and result.unsigned == 1
    assert list(shared.backend.keys()) == []
    private = rc.Cache(MemoryBackend()).loads(bundle)
    assert private == 1 and private.unsigned == 1 and private.withheld == 0
    (tmp_path / "b.rcb").write_bytes(bundle)
    url = f"dir://{tmp_path / 's'}?shared=1&insecure=1"
    capsys.readouterr()
    assert main(["--cache", url, "import", str(tmp_path / "b.rcb")]) == 1
    out = capsys.readouterr().out
    assert "imported 0 of 1" in out and "unsigned" in out
    assert list(shared.backend.keys()) == []


# ----------------------------------------------------------------- local trouble
def _newer(blob: bytes) -> bytes:
    return blob[:4] + bytes([codec.ENTRY_VERSION + 1]) + blob[5:]


def _stored(backend: rc.Backend, value: bytes) -> tuple[rc.Cache, bytes]:
    """A cache over ``backend`` holding ``value`` under key 1, and the stored blob."""
    cache = rc.Cache(backend)
    cache.put(_key(1), value)
    blob = backend.get(str(_key(1)))
    assert blob is not None
    return cache, blob


def test_an_entry_in_a_newer_format_is_a_miss_and_kept() -> None:
    backend = MemoryBackend()
    cache, blob = _stored(backend, b"v")
    backend.set(str(_key(1)), _newer(blob))
    assert cache.get(_key(1)) is None
    assert cache.get_many([_key(1)]) == {}
    stats = cache.stats()
    assert (stats.misses, stats.corrupt, stats.rejected) == (2, 0, 0)
    assert backend.get(str(_key(1))) == _newer(blob)
    report = verify(cache, repair=True)
    assert report.ok and report.newer == 1 and report.removed == 0
    assert backend.get(str(_key(1))) == _newer(blob)


class _RacingBackend(MemoryBackend):
    """Another process stores a good entry right after this one read a corrupt one."""

    def __init__(self) -> None:
        super().__init__()
        self.after_read: tuple[str, bytes] | None = None

    def _race(self) -> None:
        if self.after_read is not None:
            key, value = self.after_read
            self.after_read = None
            self.set(key, value)

    def get_many(self, keys: object) -> dict[str, bytes]:
        found = super().get_many(keys)  # type: ignore[arg-type]
        self._race()
        return found

    def get(self, key: str) -> bytes | None:
        found = super().get(key)
        self._race()
        return found


def test_a_good_entry_stored_during_a_discard_is_kept() -> None:
    backend = _RacingBackend()
    cache, good = _stored(backend, b"good")
    backend.set(str(_key(1)), good[:-1])  # corrupt
    backend.after_read = (str(_key(1)), good)
    # The rebuilt entry is kept by the compare-and-delete, and served by the read again
    # that follows a removal (before, this read was a miss).
    assert cache.get(_key(1)) == b"good" and cache.stats().corrupt == 1
    assert backend.get(str(_key(1))) == good
    backend.set(str(_key(1)), good[:-1])
    backend.after_read = (str(_key(1)), good)
    assert cache.get_many([_key(1)]) == {str(_key(1)): b"good"}
    assert cache.stats().corrupt == 2 and cache.stats().misses == 0


def test_verify_repair_removes_only_the_bytes_it_judged_bad() -> None:
    class Racing(MemoryBackend):
        def peek(self, key: str) -> bytes | None:
            found = super().peek(key)
            if found is not None and found == bad:
                self.set(key, good)  # rebuilt by another process meanwhile
            return found

    backend = Racing()
    cache = rc.Cache(backend)
    cache.put(_key(1), b"good")
    good = backend.get(str(_key(1))) or b""
    bad = good[:-1]
    backend.set(str(_key(1)), bad)
    report = verify(cache, repair=True)
    assert len(report.bad) == 1 and report.removed == 0
    assert cache.get(_key(1)) == b"good"


def test_redis_compare_and_delete_is_atomic_on_the_server(
    redis_server: RedisProcess, unique_prefix: str
) -> None:
    backend = rc.open_backend(f"{redis_server.url}?prefix={unique_prefix}")
    backend.set("k/a", b"bad")
    assert backend.delete_if("k/a", b"good") is False and backend.get("k/a") == b"bad"
    assert backend.delete_if("k/a", b"bad") is True and backend.get("k/a") is None
    backend.close()


def test_checksums_come_before_the_signature() -> None:
    """Damage is corrupt (removed); a forgery that fixed the checksums is rejected (kept)."""
    backend = MemoryBackend()
    cache = rc.Cache(backend, secret="s")
    cache.put(_key(1), b"value")
    blob = bytearray(backend.get(str(_key(1))) or b"")
    blob[-40] ^= 1  # inside the value: its checksum fails
    backend.set(str(_key(1)), bytes(blob))
    assert cache.get(_key(1)) is None and cache.stats().corrupt == 1
    forged = codec.encode_entry(str(_key(1)), _key(1).parts, b"evil!", created_at=time.time())
    backend.set(str(_key(1)), forged + bytes(32))
    header = bytearray(forged[: codec.HEADER_SIZE])
    header[5] = 1  # claims to be signed
    backend.set(str(_key(1)), bytes(header) + forged[codec.HEADER_SIZE :] + bytes(32))
    assert cache.get(_key(1)) is None and cache.stats().rejected == 1
    assert backend.get(str(_key(1))) is not None
    assert struct.unpack_from("<Q", forged, 28)[0] == xxhash.xxh3_64_intdigest(b"evil!")
