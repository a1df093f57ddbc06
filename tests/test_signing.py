"""Signed entries: with a shared secret set, nothing unsigned or forged is ever served.

The attacker here can write anything into the shared store (Redis) but does not
know the secret. Forged entries are written straight into the store, the way a
compromised fleet member or an open Redis would hold them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

import runtime_cache as rc
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.codec import decode_entry, encode_bundle, encode_entry
from runtime_cache.errors import InvalidBundleError, InvalidSecretError

if TYPE_CHECKING:
    from redis_servers import RedisCluster, RedisProcess

pytest_plugins = ["redis_servers"]

SECRET = b"fleet secret"
GOOD = b"\x7fELF trusted binary"
EVIL = b"\x7fELF evil binary"


def _key(i: int = 0) -> rc.CacheKey:
    return rc.make_key(
        module_id="net@1", runtime="opencl", purpose="program-binary", device={"d": 1}, i=i
    )


def _forge(key: rc.CacheKey, value: bytes, secret: bytes | None) -> bytes:
    return encode_entry(str(key), key.parts, value, created_at=time.time(), secret=secret)


def _forgeries(key: rc.CacheKey) -> dict[str, bytes]:
    """Ways to forge an entry for ``key`` without knowing SECRET."""
    signed_elsewhere = _forge(_key(99), GOOD, SECRET)  # genuine, but for another key
    genuine = _forge(key, GOOD, SECRET)
    evil = _forge(key, EVIL, None)
    swapped = genuine[: -32 - len(GOOD)] + EVIL.ljust(len(GOOD), b"\0") + genuine[-32:]
    return {
        "unsigned": evil,
        "other-secret": _forge(key, EVIL, b"guessed secret"),
        "signature-stripped": genuine[:-32],
        "value-swapped": swapped,
        "signature-grafted": evil + genuine[-32:],
        "replayed-under-another-key": signed_elsewhere,
    }


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def store(request: pytest.FixtureRequest, unique_prefix: str) -> Iterator[rc.Backend]:
    """The shared store, and a raw writer into it that bypasses the Cache front."""
    if request.param == "memory":
        backend: rc.Backend = MemoryBackend()
    else:
        fixture = "redis_server" if request.param == "redis" else "redis_cluster"
        server: RedisProcess | RedisCluster = request.getfixturevalue(fixture)
        backend = rc.open_backend(f"{server.url}?prefix={unique_prefix}")
    yield backend
    for key in list(backend.keys()):
        backend.delete(key)
    backend.close()


@pytest.mark.parametrize("kind", list(_forgeries(_key())))
def test_forged_entry_is_rejected_and_never_served(store: rc.Backend, kind: str) -> None:
    key = _key()
    store.set(str(key), _forgeries(key)[kind])  # written straight into the store
    cache = rc.Cache(store, secret=SECRET)
    assert cache.get(key) is None
    stats = cache.stats()
    # A bad signature or another key's entry is "rejected" (kept: it may be another
    # fleet's entry); a blob that is malformed or fails its checksums is "corrupt" (deleted).
    rejected = ("unsigned", "other-secret", "replayed-under-another-key")
    expected = "rejected" if kind in rejected else "corrupt"
    assert (stats.hits, stats.rejected, stats.corrupt) == (
        0,
        int(expected == "rejected"),
        int(expected == "corrupt"),
    )
    assert cache.get_many([key]) == {}
    assert cache.stats().hits == 0

    # The consumer flow: a poisoned store cannot feed a value; the build runs.
    built = cache.get_or_build(key, lambda: GOOD)
    assert built == GOOD
    assert cache.stats().builds == 1
    blob = store.get(str(key))
    assert blob is not None
    assert decode_entry(blob, secret=SECRET).value == GOOD  # replaced by a signed entry
    assert cache.get(key) == GOOD


def test_signed_entries_are_shared_between_caches_with_the_secret(store: rc.Backend) -> None:
    writer = rc.Cache(store, secret=SECRET)
    writer.put(_key(1), GOOD, build_seconds=2.0)
    reader = rc.Cache(store, secret=SECRET.decode())  # str and bytes secrets agree
    assert reader.get(_key(1)) == GOOD
    assert reader.stats().rejected == 0
    assert [info.signed for info in reader.entries(runtime="opencl")] == [True]
    assert rc.Cache(store, secret=b"another fleet").get(_key(1)) is None


def test_unsigned_entry_is_not_deleted_by_a_signing_reader() -> None:
    # A fleet member with another (or no) secret must not be able to erase ours, nor we theirs.
    store = MemoryBackend()
    rc.Cache(store).put(_key(2), b"theirs")
    assert rc.Cache(store, secret=SECRET).get(_key(2)) is None
    assert rc.Cache(store).get(_key(2)) == b"theirs"


def test_bundles_cannot_smuggle_forged_entries() -> None:
    cache = rc.Cache(MemoryBackend(), secret=SECRET)
    forgeries = _forgeries(_key(3))
    del forgeries["replayed-under-another-key"]  # genuine for its own key: loads keeps it
    forged = list(forgeries.values())
    with pytest.raises(InvalidBundleError):
        cache.loads(encode_bundle(forged))  # an unsigned bundle
    with pytest.raises(InvalidBundleError):
        cache.loads(encode_bundle(forged, secret=b"guessed secret"))
    # Even inside a bundle signed with the secret, each entry is checked on its own.
    assert cache.loads(encode_bundle(forged, secret=SECRET)) == 0
    assert cache.stats().rejected + cache.stats().corrupt == len(forged)
    assert cache.get(_key(3)) is None


def test_secret_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisProcess, unique_prefix: str
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE_SECRET", SECRET.decode())
    url = f"{redis_server.url}?prefix={unique_prefix}"
    cache = rc.set_cache_provider(url)
    assert cache.signed
    raw = rc.open_backend(url)
    raw.set(str(_key(4)), _forge(_key(4), EVIL, None))
    assert cache.get_or_build(_key(4), lambda: GOOD) == GOOD
    assert cache.stats().rejected == 1
    monkeypatch.setenv("RUNTIME_CACHE", url)
    rc.reset_cache_provider()
    assert rc.get_cache().signed and rc.get_cache().get(_key(4)) == GOOD
    raw.close()


def _cl_context() -> Any:
    from conftest import need

    try:
        import pyopencl as cl

        from runtime_cache.opencl import choose_device

        return cl.Context([choose_device()])
    except Exception as exc:  # no driver or no device
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))


KERNEL = "__kernel void plus_one(__global float *x) { x[get_global_id(0)] += 1.0f; }"


def test_poisoned_store_cannot_feed_a_program_binary(store: rc.Backend) -> None:
    """A garbage "binary" under every key of a module never reaches the OpenCL driver."""
    ctx = _cl_context()
    from runtime_cache.opencl import OpenCLModule, opencl_stats, reset_opencl_stats

    honest = OpenCLModule(ctx, {"plus_one": KERNEL}, cache=rc.Cache(store, secret=SECRET))
    honest.build_all(workers=1)
    cached = list(store.keys("opencl/"))
    assert cached
    for skey in cached:  # overwrite each stored binary with an unsigned forgery
        meta = decode_entry(store.get(skey) or b"", secret=SECRET)
        store.set(skey, encode_entry(skey, meta.parts, EVIL, created_at=time.time()))
    reset_opencl_stats()
    cache = rc.Cache(store, secret=SECRET)
    module = OpenCLModule(ctx, {"plus_one": KERNEL}, cache=cache)
    assert module.build_all(workers=1) == 1  # rebuilt from source, not loaded
    assert cache.stats().rejected == len(cached) and cache.stats().hits == 0
    assert opencl_stats().binary_loads == 0 and opencl_stats().source_builds == 1


def test_a_short_key_is_taken_with_a_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    """A key of under 16 bytes signs and verifies as before (fleets that use one keep
    working), and is warned about once a process: a writer who reads one signed entry can
    guess it offline. The command says so without --verbose."""
    from runtime_cache.cli import main
    from runtime_cache.signing import normalize_secret

    short, long_ = "tiny-k3y-s40", "a-key-of-16-bytes"
    with caplog.at_level("WARNING", logger="runtime_cache.signing"):
        assert normalize_secret([long_, short]) == (long_.encode(), short.encode())
        normalize_secret(short)
        a, b = rc.Cache(MemoryBackend(), secret=short), rc.Cache(MemoryBackend(), secret=long_)
    said = [r.getMessage() for r in caplog.records if r.name == "runtime_cache.signing"]
    assert (
        len(said) == 1
        and said[0].startswith("runtime-cache: ")
        and "12 bytes is short" in said[0]
        and "16 or more" in said[0]
    )
    a.close()
    b.close()
    caplog.clear()  # the command keeps the warning on without --verbose
    assert main(["--cache", "memory://", "--secret", "tiny-k3y-s40b", "ls"]) == 0
    assert main(["--cache", "memory://", "--secret", long_ + "x", "ls"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name == "runtime_cache.signing"]
    assert len(said) == 1 and "13 bytes is short" in said[0]


def test_whitespace_around_a_key_is_not_part_of_it(tmp_path: Any) -> None:
    """The attacker review of session 40: an app that read its key with open(path).read()
    signed with the file's newline; the command's --secret-file strips it, so verify then
    failed every entry. Keys are stripped everywhere now."""
    from runtime_cache.cli import main
    from runtime_cache.signing import normalize_secret

    assert normalize_secret(" fleet-key-0123456789\n") == (b"fleet-key-0123456789",)
    assert normalize_secret([b"\tfleet-key-0123456789\r\n"]) == (b"fleet-key-0123456789",)
    # Bytes as text strips them (a no-break space too): the re-attack review of session 40.
    nbsp = "fleet-key-0123456789\u00a0"
    assert normalize_secret(nbsp.encode()) == normalize_secret(nbsp) == (b"fleet-key-0123456789",)
    assert normalize_secret(b"\xff-not-utf-8-key-0123\x1f") == (b"\xff-not-utf-8-key-0123",)
    as_text = b"\xff-not-utf-8-key-0123\x1f".decode("utf-8", "surrogateescape")  # (argv's)
    assert normalize_secret(as_text) == (b"\xff-not-utf-8-key-0123",)
    secret_file = tmp_path / "secret"
    secret_file.write_text("fleet-key-0123456789\n")
    secret_file.chmod(0o600)
    root = tmp_path / "cache"
    cache = rc.Cache(rc.open_backend(f"dir://{root}"), secret=secret_file.read_text())
    cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"value")
    cache.close()
    argv = ["--cache", f"dir://{root}", "--secret-file", str(secret_file), "verify"]
    assert main(argv) == 0


def test_a_secret_file_others_can_write_is_warned_about(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from runtime_cache.environment import read_secret_file

    secret_file = tmp_path / "secret"
    secret_file.write_text("fleet-key-0123456789\n")
    for mode, said in ((0o600, None), (0o644, None), (0o620, "its group"), (0o666, "anyone")):
        secret_file.chmod(mode)
        caplog.clear()
        with caplog.at_level("WARNING", logger="runtime_cache.environment"):
            assert read_secret_file(str(secret_file)) == ["fleet-key-0123456789"]
            read_secret_file(str(secret_file))  # (once a process a file)
        lines = [r.getMessage() for r in caplog.records if "can be written" in r.getMessage()]
        if said is None:
            assert lines == []
        else:
            assert len(lines) == 1 and said in lines[0] and "choose the key" in lines[0]
            from runtime_cache import environment

            environment._WARNED_MODES.clear()
    if os.geteuid() != 0:
        return  # (making another user's file needs root)
    # A file another user owns (and so may rewrite at will): the re-attack review.
    secret_file.chmod(0o644)
    os.chown(secret_file, 4242, 4242)
    caplog.clear()
    with caplog.at_level("WARNING", logger="runtime_cache.environment"):
        read_secret_file(str(secret_file))
    lines = [r.getMessage() for r in caplog.records if "can be written" in r.getMessage()]
    assert len(lines) == 1 and "another user" in lines[0]
    # A link to a good file, in a folder another user owns (the second re-attack review:
    # the folder's owner can point it at a file they can read, /etc/machine-id).
    from runtime_cache import environment

    os.chown(secret_file, 0, 0)
    secret_file.chmod(0o600)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "secret").symlink_to(secret_file)
    shared = tmp_path / "shared"  # a sticky folder others write (as /tmp): no warning
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "secret").write_text("fleet-key-0123456789\n")
    (shared / "secret").chmod(0o600)
    os.chown(theirs, 4242, 4242)
    # A link of this user's own, in its own folder, to a file in a folder others may write
    # (no sticky bit): they can swap the file (the attack review of session 41).
    loose = tmp_path / "team"
    loose.mkdir()
    (loose / "secret").write_text("fleet-key-0123456789\n")
    (loose / "secret").chmod(0o600)
    loose.chmod(0o2770)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    (mine / "secret").symlink_to(loose / "secret")
    (mine / "sticky").symlink_to(shared / "secret")
    for path, said in (
        (theirs / "secret", "who owns its folder"),
        (shared / "secret", None),
        (mine / "secret", "write its folder (where the link leads)"),
        (mine / "sticky", None),
    ):
        environment._WARNED_MODES.clear()
        caplog.clear()
        with caplog.at_level("WARNING", logger="runtime_cache.environment"):
            assert read_secret_file(str(path)) == ["fleet-key-0123456789"]
        lines = [r.getMessage() for r in caplog.records if "can be written" in r.getMessage()]
        assert (lines == []) if said is None else (len(lines) == 1 and said in lines[0]), lines


def test_a_key_with_a_line_break_is_refused(tmp_path: Any) -> None:
    """Session 40's note: ``Cache(secret=open(f).read())`` of a two-line secret file (a
    fleet rotating keys) took ``"new\\nold"`` as one key, so neither key's entries
    verified, while the command's ``--secret-file`` read the same file as two keys."""
    from runtime_cache.environment import read_secret_file
    from runtime_cache.signing import normalize_secret

    secret_file = tmp_path / "secret"
    secret_file.write_text("fleet-key-new-0123456789\nfleet-key-old-0123456789\n")
    for whole in (secret_file.read_text(), secret_file.read_bytes(), "a-key-0123456789\r\nb"):
        with pytest.raises(InvalidSecretError, match="line break"):
            normalize_secret(whole)
        with pytest.raises(InvalidSecretError, match="line break"):
            rc.Cache(MemoryBackend(), secret=whole)
    keys = read_secret_file(str(secret_file))
    assert normalize_secret(keys) == (b"fleet-key-new-0123456789", b"fleet-key-old-0123456789")
    assert normalize_secret("fleet-key-0123456789\n") == (b"fleet-key-0123456789",)


def test_a_byte_order_mark_is_no_part_of_a_secret_files_key(tmp_path: Any) -> None:
    """The operator review of session 41: a secret file saved with a UTF-8 byte-order mark
    (PowerShell 5's ``-Encoding UTF8``) signed with ``"\ufeff"`` + the key, and every entry
    another host signed with the key alone failed its signature."""
    from runtime_cache.environment import read_secret_file

    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"\xef\xbb\xbffleet-key-0123456789\r\nold-fleet-key-0123456789\r\n")
    secret_file.chmod(0o600)
    assert read_secret_file(str(secret_file)) == [
        "fleet-key-0123456789",
        "old-fleet-key-0123456789",
    ]
    # And an app that reads the file itself signs with the same key (the re-attack review).
    from runtime_cache.signing import normalize_secret

    first = secret_file.read_text(encoding="utf-8").splitlines()[0]
    assert normalize_secret(first) == normalize_secret(first.encode()) == (b"fleet-key-0123456789",)


def test_a_planted_entry_at_a_hot_key_is_warned_of_once(caplog: pytest.LogCaptureFixture) -> None:
    """The attack review: an unsigned entry planted at a hot key logged a warning on every
    read (1,000 gets, 1,000 lines); once per key a process now, then at DEBUG. Each read
    still counts its rejection."""
    backend = MemoryBackend()
    cache = rc.Cache(backend, secret="a-long-enough-secret-for-tests")
    keys = [rc.make_key(module_id=f"m{i}", runtime="opencl", purpose="bin") for i in range(2)]
    for key in keys:
        backend.set(str(key), encode_entry(str(key), key.parts, b"evil", created_at=time.time()))
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        for _ in range(50):
            assert cache.get(keys[0]) is None and cache.get(keys[1]) is None
    warned = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(warned) == 2, [r.getMessage() for r in warned]
    assert cache.stats().rejected == 100
