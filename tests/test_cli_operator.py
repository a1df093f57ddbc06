"""Honest operator output: hostile metadata, unparseable names, odd files and flags.

Every case runs the real ``runtime-cache`` (``main(argv)`` in-process, or the
console entry in a subprocess where a hang or a crash is the risk) on real
caches, and checks the exit code and that no traceback is printed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from forged_entries import forge

import runtime_cache as rc
from conftest import tmpfs
from runtime_cache.backends.callback import CallbackBackend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.codec import decode_entry, decode_meta, encode_bundle, encode_entry
from runtime_cache.errors import (
    BackendError,
    CorruptEntryError,
    InvalidURLError,
    InvalidValueError,
)
from runtime_cache.units import parse_size

pytest_plugins = ["redis_servers"]

ESC = "\x1b"
HOSTILE = "evil\x1b]0;pwned\x07\x1b[2J\u202emod"


def key(i: int, module: str = "net@1", device: Any = None) -> rc.CacheKey:
    device = device or {"vendor": "Acme", "name": "Acme GPU", "driver": "1.0"}
    return rc.make_key(
        module_id=module, runtime="opencl", purpose="program-binary", device=device, kernel=i
    )


class Run:
    """``main(argv)`` in-process with the output captured."""

    def __init__(
        self, capsys: pytest.CaptureFixture[str], url: str, secret: str | None = None
    ) -> None:
        self.capsys, self.url, self.secret = capsys, url, secret

    def __call__(self, *argv: str, secret: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        secret = secret if secret is not None else self.secret
        extra = ["--secret", secret] if secret is not None else []
        code = main(["--cache", self.url, *extra, *argv])
        out, err = self.capsys.readouterr()
        assert "Traceback" not in out + err
        return code, out, err


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def backend(root: Path) -> Any:
    b = DirectoryBackend(root, max_size=None)
    yield b
    b.close()


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], root: Path) -> Run:
    return Run(capsys, f"dir://{root}?max_size=none")


def cli(*argv: str, stdin: Any = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The command in a fresh process (where a hang or an uncaught error would show)."""
    done = subprocess.run(
        [sys.executable, "-m", "runtime_cache", *argv],
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done


# ---------------------------------------------------------------------- decoder
BAD_TIMES = [math.nan, math.inf, -math.inf, 1e18, -1.0]


@pytest.mark.parametrize("value", BAD_TIMES)
@pytest.mark.parametrize("field", ["created_at", "build_seconds"])
def test_decoder_refuses_non_finite_and_out_of_range_times(field: str, value: float) -> None:
    blob = forge(key(1), **{field: value})  # type: ignore[arg-type]
    with pytest.raises(CorruptEntryError, match=field):
        decode_entry(blob)
    with pytest.raises(CorruptEntryError):
        decode_meta(blob)
    with pytest.raises(InvalidValueError):
        encode_entry(str(key(1)), key(1).parts, b"v", **{"created_at": 1.7e9, field: value})


def test_a_nan_entry_is_a_counted_miss_and_is_removed(backend: DirectoryBackend) -> None:
    cache = rc.Cache(backend)
    backend.set(str(key(1)), forge(key(1), build_seconds=math.nan))
    assert cache.get(key(1)) is None
    stats = cache.stats()
    assert (stats.corrupt, stats.seconds_saved) == (1, 0.0)
    assert backend.get(str(key(1))) is None


# ------------------------------------------------------------------ the listings
def test_ls_stats_export_report_what_they_skip_and_escape_what_they_print(
    run: Run, backend: DirectoryBackend, tmp_path: Path
) -> None:
    cache = rc.Cache(backend)
    good = [key(i) for i in range(3)]
    for k in good:
        cache.put(k, b"good")
    backend.set(str(key(10)), forge(key(10), created_at=math.nan))
    escaped = key(11, module=HOSTILE, device={"name": "gpu\x1b[31m", "driver": "\x1b[0m"})
    backend.set(str(escaped), forge(escaped, producer="\x1b]52;c;ZXZpbA==\x07"))

    code, out, err = run("ls")
    assert code == 1
    assert ESC not in out + err and "\u202e" not in out
    for k in [*good, escaped]:
        assert str(k).rsplit("/", 1)[-1][:12] in out
    assert "skipped 1 entry as corrupt or unreadable" in err
    assert str(key(10)) in err and "created_at" in err

    code, out, err = run("ls", "--json")
    listing = json.loads(out)
    assert code == 1 and listing["skipped"] == 1 and len(listing["entries"]) == 4
    assert listing["skipped_entries"][0]["key"] == str(key(10))

    code, out, err = run("stats")
    assert code == 1 and "skipped 1 entry" in err and ESC not in out + err
    code, out, _ = run("stats", "--json")
    assert code == 1 and json.loads(out)["overall"]["skipped"] == 1
    assert json.loads(out)["overall"]["entries"] == 4

    bundle = tmp_path / "out.rcb"
    code, out, err = run("export", str(bundle), "--json")
    report = json.loads(out)
    assert code == 1 and report["skipped"] == 1 and report["entries"] == 4
    assert report["left_out"] == [str(key(10))]

    code, out, err = run("show", str(escaped))
    assert code == 0 and ESC not in out + err and "\u202e" not in out
    assert "\\x1b" in out  # shown, escaped, not swallowed
    code, out, err = run("show", str(key(10)))
    assert code == 1 and "corrupt" in err


def test_show_checks_the_signature_when_a_secret_is_given(
    run: Run, backend: DirectoryBackend
) -> None:
    signed = rc.Cache(backend, secret="s3")
    signed.put(key(1), b"real")
    backend.set(str(key(2)), forge(key(2), signature=b"\x00" * 32))  # flag set, junk HMAC

    code, out, _ = run("show", str(key(2)))
    assert code == 0 and "signature flag" in out and "not checked" in out
    code, out, _ = run("show", str(key(2)), secret="s3")
    assert code == 1 and "BAD" in out
    assert "signed" not in out.replace("signature", "")
    code, out, _ = run("show", str(key(2)), "--json", secret="s3")
    assert code == 1 and json.loads(out)["signature_valid"] is False
    code, out, _ = run("show", str(key(1)), secret="s3")
    assert code == 0 and "valid (checked with the secret)" in out
    code, out, _ = run("show", str(key(1)), secret="wrong")
    assert code == 1 and "BAD" in out


# ------------------------------------------------------- verify, clear, oddities
def test_verify_and_clear_skip_names_they_cannot_parse(
    run: Run, backend: DirectoryBackend, root: Path
) -> None:
    cache = rc.Cache(backend)
    keys = [key(i) for i in range(3)]
    for k in keys:
        cache.put(k, b"v")
    bad = key(9)
    backend.set(str(bad), forge(bad)[:-1] + b"X")  # value checksum fails
    shard = next(root.rglob("*.rce")).parent.parent / "82"
    shard.mkdir(exist_ok=True)
    (shard / "82 copy.rce").write_bytes(b"a Finder copy")
    stray = "opencl/program-binary/82 copy"

    code, out, err = run("verify")
    assert code == 1 and "checked 4 entries" in out and f"BAD  {bad}" in out
    assert "82 copy" in err and "not a cache key" in err

    code, out, _ = run("verify", "--repair", "--json")
    report = json.loads(out)
    assert code == 1 and report["removed"] == 1 and report["checked"] == 4
    assert [s["key"] for s in report["skipped"]] == [stray]
    assert (shard / "82 copy.rce").exists()  # never deleted: it is no entry of ours

    code, out, err = run("clear", "--yes", "--json")
    cleared = json.loads(out)
    assert code == 1 and cleared["removed"] == 3 and len(cleared["skipped"]) == 1
    assert list(backend.keys()) == [stray]


def test_one_unreadable_entry_does_not_abort_verify(capsys: pytest.CaptureFixture[str]) -> None:
    store: dict[str, bytes] = {}
    broken = str(key(2))

    def get(k: str) -> bytes | None:
        if k == broken:
            raise BackendError(f"read {k}: permission denied")
        return store.get(k)

    backend = CallbackBackend(
        get,
        store.__setitem__,
        delete=lambda k: store.pop(k, None) is not None,
        keys=lambda: list(store),
    )
    cache = rc.Cache(backend)
    for i in range(4):
        store[str(key(i))] = encode_entry(str(key(i)), key(i).parts, b"v", created_at=1.7e9)
    from runtime_cache.maintenance import verify

    report = verify(cache)
    assert report.checked == 3 and report.bad == []
    assert report.skipped == [(broken, f"unreadable: read {broken}: permission denied")]
    assert not report.ok


def test_verify_with_a_secret_on_an_unsigned_cache_does_not_advise_repair(
    run: Run, backend: DirectoryBackend
) -> None:
    cache = rc.Cache(backend)
    for i in range(3):
        cache.put(key(i), b"unsigned")
    code, out, _ = run("verify", secret="fleet-secret")
    assert code == 1
    assert "--repair" not in out.replace("--repair keeps", "")
    assert "the cache is unsigned" in out
    code, out, _ = run("verify", "--json", secret="fleet-secret")
    assert json.loads(out)["unsigned"] == 3
    code, out, _ = run("verify", "--repair", secret="fleet-secret")  # (removed all 3)
    assert code == 1 and "0 removed" in out
    assert len(list(backend.keys())) == 3


def test_verify_repair_with_a_wrong_secret_removes_nothing(
    run: Run, backend: DirectoryBackend
) -> None:
    """The operator review: a mistyped secret made every entry "bad", and --repair, as
    advised, removed the whole cache. Once one entry verifies, a forged one goes."""
    cache = rc.Cache(backend, secret="the-right-secret")
    for i in range(3):
        cache.put(key(i), b"signed")
    code, out, _ = run("verify", "--repair", secret="a-mistyped-secret")
    assert code == 1 and "0 removed" in out and "either the secret is wrong" in out
    assert len(list(backend.keys())) == 3
    forged = rc.Cache(backend, secret="someone-elses-secret")
    forged.put(key(9), b"forged")
    code, out, _ = run("verify", "--repair", "--json", secret="the-right-secret")
    report = json.loads(out)
    assert report["removed"] == 1 and report["signature_failures_kept"] == 0
    assert sorted(backend.keys()) == sorted(str(key(i)) for i in range(3))


def test_show_raw_into_a_missing_folder_is_an_error_not_a_traceback(
    run: Run, backend: DirectoryBackend
) -> None:
    rc.Cache(backend).put(key(1), b"value")
    code, _, err = run("show", str(key(1)), "--raw", "/no/such/dir/x.bin")
    assert code == 1 and "cannot write /no/such/dir/x.bin" in err


def test_import_keep_existing_counts_no_hits(
    run: Run, backend: DirectoryBackend, tmp_path: Path
) -> None:
    cache = rc.Cache(backend)
    keys = [key(i) for i in range(3)]
    for k in keys:
        cache.put(k, b"v")
    bundle = tmp_path / "b.rcb"
    assert run("export", str(bundle))[0] == 0
    hits_before = {e["key"]: e["hits"] for e in json.loads(run("ls", "--json")[1])["entries"]}
    code, out, _ = run("import", str(bundle), "--keep-existing", "--json")
    assert code == 0 and json.loads(out)["kept_existing"] == 3
    hits_after = {e["key"]: e["hits"] for e in json.loads(run("ls", "--json")[1])["entries"]}
    assert hits_after == hits_before
    code, out, _ = run("import", str(bundle), "--keep-existing")  # says why none came in
    assert code == 0 and "imported 0 of 3" in out and "kept 3 entries already in the cache" in out


def test_a_bundle_whose_header_lies_is_named_invalid_not_too_large(
    run: Run, backend: DirectoryBackend, tmp_path: Path
) -> None:
    """The operator review (helper-77): one flipped bit in a bundle's entry count (byte 9)
    of a 30 KB file was reported as "larger than 4.0 GiB"; the file is no such thing."""
    cache = rc.Cache(backend)
    for i in range(3):
        cache.put(key(i), b"v" * 10_000)
    bundle = tmp_path / "b.rcb"
    assert run("export", str(bundle))[0] == 0
    data = bytearray(bundle.read_bytes())
    data[9] ^= 1
    bundle.write_bytes(bytes(data))
    code, _, err = run("import", str(bundle))
    assert code == 1 and "not a valid bundle" in err and "GiB" not in err, err
    assert f"holds {len(data)}" in err


def test_import_refuses_fifos_and_devices_without_hanging(root: Path, tmp_path: Path) -> None:
    url = f"dir://{root}"
    fifo = tmp_path / "bundle.fifo"
    os.mkfifo(fifo)
    done = cli("--cache", url, "import", str(fifo), timeout=20)
    assert done.returncode == 1 and "not a regular file" in done.stderr
    done = cli("--cache", url, "import", "/dev/zero", timeout=20)
    assert done.returncode == 1 and "not a regular file" in done.stderr
    with open("/dev/zero", "rb") as zeros:
        done = cli("--cache", url, "import", "-", stdin=zeros, timeout=20)
    assert done.returncode == 1 and "not a valid bundle" in done.stderr
    assert "MemoryError" not in done.stderr


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
@pytest.mark.parametrize("count", [2**32 - 1, 1_000_000])
def test_import_of_a_bundle_claiming_many_entries_costs_no_memory(
    root: Path, tmp_path: Path, count: int
) -> None:
    """A sparse 256 MiB file (4 KiB on disk): a header claiming ``count`` entries, then
    zeros (entries of length 0). The reader kept 8 bytes and two objects per claimed
    entry before the decoder refused the count: 7.6 GB resident, 40 s (attacker review)."""
    from runtime_cache.codec import _BUNDLE_HEADER, BUNDLE_MAGIC, BUNDLE_VERSION

    bundle = tmp_path / "sparse.rcb"
    with open(bundle, "wb") as out:
        out.write(_BUNDLE_HEADER.pack(BUNDLE_MAGIC, BUNDLE_VERSION, 0, 0, count))
        out.truncate(256 << 20)
    # The peak of this process's own memory (VmHWM: ru_maxrss may hold the parent's peak at
    # the fork, 466 MB under a long pytest run).
    measure = (
        "import sys\n"
        "from runtime_cache.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "peak = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')]\n"
        "print('maxrss', peak[0], file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", measure, "--cache", f"dir://{root}", "import", str(bundle)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 1 and "not a valid bundle" in done.stderr, done.stderr
    if count > 1_000_000:
        assert f"claims {count} entries" in done.stderr
    assert "Traceback" not in done.stderr
    maxrss_kib = int(done.stderr.split("maxrss")[1].split()[0])
    assert maxrss_kib < 200_000, done.stderr  # a Python process with the library: ~40 MB


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM")
@pytest.mark.parametrize("source", ["-", "file"])
def test_import_holds_a_bundle_once_before_its_checks(
    root: Path, tmp_path: Path, source: str
) -> None:
    """The attack review: ``import -`` of a stream whose one entry claims 1 GB (bytes that
    fail the checksum) peaked at 1.98 GB before the checksum was checked, 3 GB at 5.9 GB: the
    pieces read were kept, then joined. Standard input is now kept in a temporary file, and
    the bundle read from there (a file from itself) in one piece: its size once."""
    from runtime_cache.codec import _BUNDLE_HEADER, BUNDLE_MAGIC, BUNDLE_VERSION

    size = 96 << 20
    bundle = tmp_path / "one.rcb"
    with open(bundle, "wb") as out:  # sparse: zeros that cost no disk
        out.write(_BUNDLE_HEADER.pack(BUNDLE_MAGIC, BUNDLE_VERSION, 0, 0, 1))
        out.write(size.to_bytes(8, "little"))
        out.truncate(_BUNDLE_HEADER.size + 8 + size + 8)
    measure = (
        "import sys\n"
        "from runtime_cache.cli import main\n"
        "def kib(name):\n"
        "    lines = open('/proc/self/status').read().splitlines()\n"
        "    return int([l.split()[1] for l in lines if l.startswith(name)][0])\n"
        "before = kib('VmRSS')\n"
        "code = main(sys.argv[1:])\n"
        "print('grew', kib('VmHWM') - before, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    named = "-" if source == "-" else str(bundle)
    with open(bundle, "rb") as stdin:
        done = subprocess.run(
            [sys.executable, "-I", "-c", measure, "--cache", f"dir://{root}", "import", named],
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert done.returncode == 1 and "checksum mismatch" in done.stderr, done.stderr
    grew_kib = int(done.stderr.split("grew")[1].split()[0])
    assert grew_kib < 1.4 * size / 1024, done.stderr  # was twice its size


def test_bad_cache_urls_name_the_problem(tmp_path: Path) -> None:
    done = cli("--cache", "dir:///etc/passwd", "ls")
    assert done.returncode == 1 and "not a directory" in done.stderr
    done = cli("--cache", "dir://user:hunter2@host/srv/cache", "ls")
    assert done.returncode == 2 and "takes no host" in done.stderr
    assert "hunter2" not in done.stderr
    done = cli("--cache", f"dir://{tmp_path}?fsync=maybe", "ls")  # (a folder that exists)
    assert done.returncode == 2 and "not a boolean" in done.stderr
    done = cli("prune", "--max-size", "5XB")
    assert done.returncode == 2 and "not a size" in done.stderr
    with pytest.raises(InvalidValueError) as raised:  # a value error, no longer a URL error
        parse_size("5XB")
    assert not isinstance(raised.value, InvalidURLError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("on", True), ("1", True), ("YES", True), ("true", True), ("off", False), ("0", False)],
)
def test_url_booleans_are_strict(tmp_path: Path, text: str, expected: bool) -> None:
    backend = rc.open_backend(f"dir://{tmp_path}/c?fsync={text}")
    assert isinstance(backend, DirectoryBackend) and backend.fsync is expected
    backend.close()


def test_export_errors_name_the_users_file_and_never_follow_a_planted_link(
    run: Run, backend: DirectoryBackend, tmp_path: Path
) -> None:
    rc.Cache(backend).put(key(1), b"v")
    code, _, err = run("export", str(tmp_path / "missing" / "b.rcb"))
    assert code == 1 and f"cannot write {tmp_path / 'missing' / 'b.rcb'}" in err
    assert ".tmp" not in err
    drop = tmp_path / "drop"
    drop.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for pid in range(os.getpid() - 5, os.getpid() + 50):  # the old, guessable temp names
        (drop / f"b.rcb.tmp-{pid}").symlink_to(victim)
    code, _, _ = run("export", str(drop / "b.rcb"))
    assert code == 0 and victim.read_text() == "keep me"
    assert (drop / "b.rcb").read_bytes()[:4] == b"RCB\x01"


def test_rm_and_clear_speak_json(run: Run, backend: DirectoryBackend) -> None:
    cache = rc.Cache(backend)
    for i in range(3):
        cache.put(key(i), b"v")
    code, out, _ = run("rm", str(key(0)), "nosuchkey", "--json")
    assert code == 1 and json.loads(out) == {
        "removed": [str(key(0))],
        "missing": ["nosuchkey"],
        "failed": [],
    }
    code, out, _ = run("clear", "--yes", "--json")
    assert code == 0 and json.loads(out) == {"removed": 2, "partly_removed": 0, "skipped": []}


def test_python_dash_m_runtime_cache_and_every_help_has_examples() -> None:
    done = cli("--help")
    assert done.returncode == 0 and "examples:" in done.stdout
    for command in ("ls", "show", "stats", "rm", "clear", "prune", "verify", "export", "import"):
        done = cli(command, "--help")
        tail = done.stdout.rsplit("examples:", 1)
        assert done.returncode == 0 and len(tail) == 2, command
        shown = [line for line in tail[1].splitlines() if line.strip()]
        assert 2 <= len(shown) <= 3 and all("runtime-cache" in line for line in shown)


# ------------------------------------------------------------------ with Redis
def test_ls_on_nan_escape_and_foreign_redis_key_exits_1_and_says_what_it_skipped(
    redis_server: Any, unique_prefix: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The acceptance case: one NaN entry, one escape-laden entry, one foreign key."""
    import redis

    url = f"{redis_server.url}?prefix={unique_prefix}"
    backend = rc.open_backend(url)
    cache = rc.Cache(backend, secret="test-secret")
    good = [key(i) for i in range(3)]
    for k in good:
        cache.put(k, b"good")
    backend.set(str(key(10)), forge(key(10), build_seconds=math.nan))
    escaped = key(11, module=HOSTILE)
    backend.set(str(escaped), forge(escaped))
    client = redis.Redis.from_url(redis_server.url)
    client.hset(f"{unique_prefix}opencl/program-binary/foreign", mapping={"a": "b"})

    run = Run(capsys, url, secret="test-secret")  # a shared cache is opened with its secret
    code, out, err = run("ls")
    assert code == 1 and ESC not in out + err
    for k in [*good, escaped]:
        assert str(k).rsplit("/", 1)[-1][:12] in out
    assert "skipped 1 entry as corrupt or unreadable" in err and str(key(10)) in err
    assert "5 entries" not in out and "4 entries" in out

    for argv in (["stats"], ["verify"], ["prune", "--older-than", "3650d"]):
        code, out, err = run(*argv)
        assert code in (0, 1) and "WRONGTYPE" not in out + err, argv
    code, out, err = run("export", str(tmp_path / "fleet.rcb"), "--json")
    exported = json.loads(out)
    # With the secret, the forged (unsigned) escape-laden entry is left out of a bundle too.
    assert code == 1 and exported["entries"] == 3
    assert sorted(exported["left_out"]) == sorted([str(key(10)), str(escaped)])
    assert client.type(f"{unique_prefix}opencl/program-binary/foreign") == b"hash"
    client.delete(f"{unique_prefix}opencl/program-binary/foreign")
    client.close()
    run("clear", "--yes")
    cache.close()


def test_verify_and_prune_draw_a_progress_bar_on_a_terminal_only(
    backend: DirectoryBackend, root: Path
) -> None:
    import pty

    cache = rc.Cache(backend)
    for i in range(5):
        cache.put(key(i), b"v")
    for argv in (["verify"], ["prune", "--older-than", "3650d"]):
        leader, follower = pty.openpty()
        try:
            done = subprocess.run(
                [sys.executable, "-m", "runtime_cache", "--cache", f"dir://{root}", *argv],
                stdout=subprocess.PIPE,
                stderr=follower,
                text=True,
                timeout=30,
            )
            os.close(follower)
            drawn = b""
            while True:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # EIO: the other end is closed and drained
                    break
                if not chunk:
                    break
                drawn += chunk
        finally:
            os.close(leader)
        assert done.returncode == 0
        assert f"{argv[0]} [".encode() in drawn and b"5/5" in drawn, drawn
        assert "[" not in done.stdout  # the bar goes to the terminal, not into the output
        plain = cli("--cache", f"dir://{root}", *argv)
        assert "5/5" not in plain.stderr  # not a terminal: no bar


def test_an_import_into_a_cache_its_cap_cannot_hold_says_what_is_left(tmp_path: Path) -> None:
    """Noted in session 27 (helper-77): 150 entries imported into a 40 KB dir:// cache said
    "imported 150 of 150" and exit 0, and 8 were left. The report says how many of the
    bundle's entries the cache no longer holds (exit 1); one that fits says nothing more."""
    source = rc.Cache(rc.open_backend("memory://"))
    for i in range(150):
        source.put(rc.make_key(module_id=f"m{i}", runtime="r", purpose="p"), b"v" * 1000)
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    for cap, code in (("40KB", 1), ("10MB", 0)):
        folder = tmp_path / cap
        done = cli("--cache", f"dir://{folder}?max_size={cap}", "import", "--json", str(bundle))
        assert done.returncode == code, done.stdout + done.stderr
        report = json.loads(done.stdout)
        left = len(list(DirectoryBackend(folder).keys()))
        assert report["accepted"] == 150 and report["gone_since"] == 150 - left
        assert (left < 150) == (code == 1)
    text = cli("--cache", f"dir://{tmp_path / 'again'}?max_size=40KB", "import", str(bundle))
    assert "of the bundle's are no longer in the cache" in text.stdout


def test_an_import_whose_remote_tier_takes_nothing_says_so(tmp_path: Path) -> None:
    """The near tier took the entries, the remote one (down) none: not a plain success."""
    source = rc.Cache(rc.open_backend("memory://"), secret="s3cret-0123456789")
    for i in range(3):
        source.put(rc.make_key(module_id=f"m{i}", runtime="r", purpose="p"), b"v")
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    (tmp_path / "near").mkdir(mode=0o700)
    url = f"dir://{tmp_path / 'near'},redis://127.0.0.1:1/0"
    command = ["--cache", url, "--secret", "s3cret-0123456789", "import", "--json", str(bundle)]
    done = subprocess.run(
        [sys.executable, "-m", "runtime_cache", *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    # Entries, not operations: a failed batch was counted once per entry and once more.
    assert report["accepted"] == 3 and list(report["tiers_not_written"].values()) == [3]


def test_rm_and_clear_with_a_tier_down_say_what_they_removed(tmp_path: Path) -> None:
    """Noted in session 27: with the remote tier down, ``rm`` said "not removed" for an entry
    it had removed from the near tier, and ``clear`` said "removed 0 entries" after emptying
    it. Each now says the entry is gone but from the tier that could not be reached (exit 1:
    that tier may still hold it)."""
    secret = "s3cret-0123456789"
    near = tmp_path / "near"
    near.mkdir(mode=0o700)
    local = rc.Cache(DirectoryBackend(near), secret=secret)
    keys = [rc.make_key(module_id=f"m{i}", runtime="r", purpose="p") for i in range(3)]
    for k in keys:
        local.put(k, b"v")
    url = f"dir://{near},redis://127.0.0.1:1/0"

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runtime_cache", "--cache", url, "--secret", secret, *command],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )

    done = run("rm", str(keys[0]))
    assert done.returncode == 1 and "not removed" not in done.stderr, done.stderr
    assert "removed, except from <RedisBackend" in done.stderr and "Traceback" not in done.stderr
    assert local.get(keys[0]) is None and local.get(keys[1]) == b"v"
    # (helper-82) Again: no tier reached holds it now, so nothing was removed.
    done = run("rm", str(keys[0]))
    assert done.returncode == 1 and "removed, except" not in done.stderr, done.stderr
    assert "in no tier reached" in done.stderr
    done = run("clear", "--yes")
    assert done.returncode == 1, done.stderr
    assert "removed 0 entries, and 2 from the tiers that could be reached" in done.stdout
    assert list(DirectoryBackend(near).keys()) == []
    for k in keys:
        local.put(k, b"v")
    done = run("clear", "--yes", "--json")
    report = json.loads(done.stdout)
    assert report["removed"] == 0 and report["partly_removed"] == 3
    assert all("could not be reached" in s["reason"] for s in report["skipped"])


def test_a_tier_that_cannot_be_listed_makes_maintenance_say_so(tmp_path: Path) -> None:
    url = f"dir://{tmp_path / 'near'},redis://:pw@127.0.0.1:1/0?insecure=1"
    (tmp_path / "near").mkdir(mode=0o700)  # (a command that only reads makes no tier folder)
    for command in (["ls"], ["verify"], ["stats"], ["export", str(tmp_path / "x.rcb")]):
        done = subprocess.run(
            [sys.executable, "-m", "runtime_cache", "--cache", url, *command],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert "could not list tier" in done.stderr and "partial" in done.stderr
        assert "Traceback" not in done.stderr and "pw@" not in done.stderr + done.stdout


def test_links_and_fifos_at_entry_names_are_reported_and_repaired(tmp_path: Path) -> None:
    """The operator review: a sparse 10 GiB file at an entry's name was removed by `ls` (a
    reading command) with exit code 0, while a FIFO or a link was named and left (exit 1);
    with all three, `ls` named 2 and said "found 1 non-entries ... removed". Now the three
    are named alike, left, and removed by verify --repair."""
    root = tmp_path / "cache"
    url = f"dir://{root}"
    cache = rc.Cache(rc.open_backend(url))
    cache.put(key(1), b"kept")
    entry = next(root.rglob("*.rce"))
    link = entry.with_name(entry.name[:-9] + "zzzzz.rce")
    link.symlink_to(tmp_path / "elsewhere")
    fifo = entry.with_name(entry.name[:-9] + "yyyyy.rce")
    os.mkfifo(fifo)
    sparse = entry.with_name(entry.name[:-9] + "xxxxx.rce")
    with open(sparse, "wb") as handle:
        handle.truncate(10 << 30)  # 10 GiB, no blocks: over max_entry_size

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "runtime_cache", "--cache", url, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path)

    for command in (["ls"], ["verify"], ["stats"]):
        done = cli(*command)
        assert sparse.exists() and link.is_symlink() and fifo.exists(), command  # not removed
        assert done.returncode == 1 and done.stderr.count("is no entry") == 3, done.stderr
        assert "non-entries" not in done.stderr and "Traceback" not in done.stderr
    done = cli("verify", "--repair")
    assert done.returncode == 1 and "removed" in done.stdout + done.stderr
    assert not link.is_symlink() and not fifo.exists() and not sparse.exists() and entry.exists()
    assert not (tmp_path / "elsewhere").exists()
    assert cli("verify").returncode == 0


def test_a_link_at_a_fan_out_folder_is_reported_and_repaired(tmp_path: Path) -> None:
    """The operator review: a fan-out folder moved out of the cache with a link in its
    place went unreported by ls, verify and verify --repair ("0 bad", exit 0), its entries
    silently gone. Now each names the link and exits 1; --repair removes the link alone."""
    root = tmp_path / "cache"
    url = f"dir://{root}"
    cache = rc.Cache(rc.open_backend(url))
    for i in range(3):
        cache.put(key(i), b"v")
    shard = next(root.rglob("*.rce")).parent
    elsewhere = tmp_path / "elsewhere"
    shard.rename(elsewhere)
    shard.symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "runtime_cache", "--cache", url, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=tmp_path)

    named = str(shard.relative_to(root))
    for command in (["ls"], ["verify"], ["stats"]):
        done = cli(*command)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert f"folder {named} is a symbolic link" in done.stderr, done.stderr
    assert shard.is_symlink()
    done = cli("verify", "--repair")
    assert done.returncode == 1 and f"{named}: a symbolic link" in done.stderr, done.stderr
    assert "removed" in done.stderr
    assert not os.path.lexists(shard)  # the link alone removed, never followed
    assert sorted(p.name for p in elsewhere.iterdir()) == before
    assert cli("verify").returncode == 0


def test_an_import_that_writes_over_junk_at_an_entry_name_succeeds(
    run: Run, backend: DirectoryBackend, tmp_path: Path
) -> None:
    """The operator review (helper-77): a FIFO at one of a bundle's entry names was
    replaced by the import, and verify passed after; yet the import exited 1 with a clean
    report ("imported 3 of 3"), which a script cannot tell from a failed import."""
    cache = rc.Cache(backend)
    for i in range(3):
        cache.put(key(i), b"v" * 100)
    bundle = tmp_path / "b.rcb"
    assert run("export", str(bundle))[0] == 0
    entry = next(Path(backend.root).rglob("*.rce"))
    entry.unlink()
    os.mkfifo(entry)
    code, out, err = run("import", str(bundle), "--keep-existing", "--json")
    report = json.loads(out)
    assert (report["accepted"], report["kept_existing"]) == (1, 2), out
    assert code == 0 and "found 1 non-entry at" in err, err
    assert run("verify")[0] == 0


def _filled(tmp_path: Path, entries: int, size: int) -> str:
    url = f"dir://{tmp_path / 'big'}"
    cache = rc.Cache(rc.open_backend(url))
    for i in range(entries):
        cache.put(key(i), os.urandom(size))
    return url


def test_output_cut_short_is_never_a_success(tmp_path: Path) -> None:
    """The operator review: a buffered write into a pipe whose reader closes returned a
    short count, so `export - | head -c 10` said "exported" and exited 0 (and so did
    `ls --json | head -n 1`). Cut short is 141, as cli.md says."""
    big = _filled(tmp_path / "big", 8, 256 * 1024)  # 2 MiB: more than a pipe holds
    many = _filled(tmp_path / "many", 1500, 8)  # a listing of more than a pipe holds
    for url, command in ((big, ["export", "-"]), (many, ["ls", "--json"])):
        cut = "head -c 10"
        done = subprocess.run(
            f"{sys.executable} -m runtime_cache --cache {url} {' '.join(command)} | {cut}"
            " > /dev/null; echo ${PIPESTATUS[0]}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert done.stdout.split()[-1] == "141", (command, done.stdout, done.stderr)
        assert "exported" not in done.stderr and "Traceback" not in done.stderr


def test_export_writes_into_a_device_or_fifo_and_through_a_link(
    tmp_path: Path, closed_folder: Path
) -> None:
    """The operator review: export replaced /dev/full (and a FIFO, and /dev/stdout's link)
    with a regular file and said it had exported. They are written into or followed where
    only this user or root can have put them (see test_cli_output_path.py)."""
    url = _filled(tmp_path, 2, 1024)
    if os.geteuid() == 0:  # a /dev/full of the test's own (the real one was replaced)
        full = closed_folder / "full"
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        done = cli("--cache", url, "export", str(full))
        assert done.returncode == 1 and "No space left" in done.stderr, done.stderr
        assert full.is_char_device()
    target = closed_folder / "real.rcb"
    link = closed_folder / "link.rcb"
    link.symlink_to(target)
    done = cli("--cache", url, "export", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and target.stat().st_size > 2048
    if os.geteuid() == 0:  # anyone else's link is replaced
        victim = closed_folder / "victim.txt"
        victim.write_text("the user's own file")
        planted = closed_folder / "planted.rcb"
        planted.symlink_to(victim)
        os.lchown(planted, 12345, 12345)
        done = cli("--cache", url, "export", str(planted))
        assert done.returncode == 0, done.stderr
        assert victim.read_text() == "the user's own file" and not planted.is_symlink()
    shared = closed_folder / "shared"
    shared.mkdir()
    if os.geteuid() == 0:
        os.chown(shared, -1, 12345)  # a group with others in it (root's own has root alone)
    shared.chmod(0o2775 if os.geteuid() == 0 else 0o777)  # a member could swap the link
    mine = shared / "mine.rcb"
    mine.symlink_to(closed_folder / "victim-2.txt")
    (closed_folder / "victim-2.txt").write_text("kept")
    done = cli("--cache", url, "export", str(mine))
    assert done.returncode == 0 and (closed_folder / "victim-2.txt").read_text() == "kept"
    assert not mine.is_symlink() and "not followed" in done.stderr, done.stderr
    fifo = closed_folder / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    done = cli("--cache", url, "export", str(fifo))
    data = reader.communicate(timeout=30)[0]
    assert done.returncode == 0 and len(data) == target.stat().st_size
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_export_to_dev_stdout_keeps_its_message_out_of_the_bundle(tmp_path: Path) -> None:
    """The attacker review: `export /dev/stdout > f` printed "exported ..." into f, over
    the bundle's first bytes (and after it with `| wc -c` or `>> f`)."""
    url = _filled(tmp_path, 3, 1024)
    whole = tmp_path / "whole.rcb"
    assert cli("--cache", url, "export", str(whole)).returncode == 0
    for name in ("/dev/stdout", "/dev/fd/1"):
        for mode in ("wb", "ab"):
            out = tmp_path / "out.rcb"
            out.unlink(missing_ok=True)
            with open(out, mode) as handle:
                done = subprocess.run(
                    [sys.executable, "-m", "runtime_cache", "--cache", url, "export", name],
                    stdout=handle,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            assert done.returncode == 0 and "exported 3 entries" in done.stderr, done.stderr
            assert out.read_bytes() == whole.read_bytes(), (name, mode)
        piped = subprocess.run(
            [sys.executable, "-m", "runtime_cache", "--cache", url, "export", name, "--json"],
            capture_output=True,
        )
        assert piped.returncode == 0 and piped.stdout == whole.read_bytes()
        assert json.loads(piped.stderr)["entries"] == 3


def test_output_onto_a_full_disk_or_in_ascii_is_a_line_not_a_traceback(tmp_path: Path) -> None:
    """The operator review of the output fixes: without PYTHONUNBUFFERED, `ls > /dev/full`
    said the error, then failed again at exit ("Exception ignored", exit code 120); and an
    ascii stdout (PYTHONIOENCODING=ascii) ended `ls` and `show` of a non-ASCII module id
    in a UnicodeEncodeError."""
    url = f"dir://{tmp_path / 'c'}"
    rc.Cache(rc.open_backend(url)).put(key(1, module="net\U0001f600@1"), b"v")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if Path("/dev/full").is_char_device():
        runs = [(argv, env) for argv in (["ls"], ["stats"], ["ls", "--json"], ["--help"])]
        unbuffered = {**env, "PYTHONUNBUFFERED": "1"}  # argparse dropped the error there
        runs += [(["--help"], unbuffered), (["--version"], unbuffered), (["ls"], unbuffered)]
        for argv, run_env in runs:
            with open("/dev/full", "w") as full:
                done = subprocess.run(
                    [sys.executable, "-m", "runtime_cache", "--cache", url, *argv],
                    stdout=full,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=run_env,
                )
            assert done.returncode == 1, (argv, done.returncode, done.stderr)
            assert done.stderr.count("No space left") == 1, (argv, done.stderr)
            assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr
    ascii_env = {**env, "PYTHONIOENCODING": "ascii"}
    for argv in (["ls"], ["show", str(key(1, module="net\U0001f600@1"))]):
        done = subprocess.run(
            [sys.executable, "-m", "runtime_cache", "--cache", url, *argv],
            capture_output=True,
            text=True,
            env=ascii_env,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)
        assert "\\U0001f600" in done.stdout, done.stdout


def test_main_in_a_process_whose_stdout_is_text_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the output fixes: main() called with sys.stdout a StringIO raised
    AttributeError for `export -`; it is a usage error, and sys.stdout is left as it was."""
    import io

    url = _filled(tmp_path, 1, 100)
    text = io.StringIO()
    monkeypatch.setattr(sys, "stdout", text)
    assert main(["--cache", url, "export", "-"]) == 2
    assert main(["--cache", url, "ls", "--json"]) == 0
    assert sys.stdout is text and json.loads(text.getvalue())["entries"]


def test_export_to_a_closed_stdout_is_a_line_not_a_traceback(tmp_path: Path) -> None:
    """And (the attacker review) a command that writes a file or lists, with stdout closed,
    ended in a traceback; /dev/stdout then led to whatever the process had opened as 1."""
    url = _filled(tmp_path, 1, 1024)

    def closed(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            f"{sys.executable} -m runtime_cache --cache {url} {command} >&-",
            shell=True,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )

    for command in ("export -", "export /dev/stdout", "export /dev/fd/1"):  # (the last two:
        done = closed(command)  # the re-attack review of session 41: /dev/null, exit 0)
        assert done.returncode == 2 and "standard output is closed" in done.stderr, done.stderr
    # With --json too (the operator review of session 41: a traceback, exit 1): the
    # output goes nowhere, as print()'s does.
    json_commands = ("ls --json", "stats --json", "verify --json", "export out2.rcb --json")
    for command in ("export out.rcb", "ls", *json_commands):
        done = closed(command)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (command, done.stderr)
    assert (tmp_path / "out.rcb").read_bytes()[:4] == b"RCB\x01"


def test_a_secret_file_that_is_no_regular_file_or_is_endless_is_refused(tmp_path: Path) -> None:
    """The operator review: a FIFO or /dev/zero as RUNTIME_CACHE_SECRET_FILE hung the
    command line and an app's first get_cache()."""
    fifo = tmp_path / "secret-fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        done = subprocess.run(
            [sys.executable, "-m", "runtime_cache", "--cache", "memory://", "ls"],
            env={**os.environ, "RUNTIME_CACHE_SECRET_FILE": path},
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        assert done.returncode == 2 and "not a regular file" in done.stderr, done.stderr
    # Lines end at \n, \r or \r\n alone, as before: \f, \v or U+2028 inside a key keep it whole.
    odd = tmp_path / "odd-secret"
    odd.write_text("correct\x0chorse\u2028battery\x0bstaple\r\nold-key\n", newline="")
    assert rc.environment.read_secret_file(str(odd)) == [
        "correct\x0chorse\u2028battery\x0bstaple",
        "old-key",
    ]
    big = tmp_path / "big-secret"
    big.write_text("x" * 70_000)
    with pytest.raises(rc.errors.InvalidSecretError, match="larger than"):
        rc.environment.read_secret_file(str(big))


def test_a_secret_of_undecodable_bytes_signs_as_those_bytes(tmp_path: Path) -> None:
    """The operator review: RUNTIME_CACHE_SECRET=$'\\xff\\xfe-x' (or --secret) ended in a
    UnicodeEncodeError traceback. The bytes as given are the key."""
    code = (
        "import os, runtime_cache as rc\n"
        "c = rc.get_cache()\n"
        "print(c.signed, c.secret_keys() == (os.environb[b'RUNTIME_CACHE_SECRET'],))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "RUNTIME_CACHE_SECRET": "\udcff\udcfe-x", "RUNTIME_CACHE": "memory://"},
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert done.stdout.split() == ["True", "True"], done.stderr
    with pytest.raises(TypeError, match="open_backend"):
        rc.Cache("memory://")  # type: ignore[arg-type]


def test_import_onto_a_full_disk_counts_what_it_wrote(tmp_path: Path) -> None:
    """The operator review: a batch that failed part way was written again an entry at a
    time, and the entries it had stored failed again there, so the report said "imported
    0 of 300" with 51 good entries stored."""
    url = _filled(tmp_path / "source", 300, 8 * 1024)
    bundle = tmp_path / "all.rcb"
    assert main(["--cache", url, "export", str(bundle)]) == 0
    with tmpfs(tmp_path / "full", "1m") as full:
        done = cli("--cache", f"dir://{full / 'cache'}", "import", "--json", str(bundle))
        report = json.loads(done.stdout)
        stored = rc.Cache(rc.open_backend(f"dir://{full / 'cache'}"))
        good = sum(stored.get(key(i)) is not None for i in range(300))
        assert 0 < good < 300 and report["accepted"] == good, (good, report)
        assert report["not_written"] == 300 - good


def test_import_goes_on_past_an_entry_whose_key_the_folder_cannot_hold(tmp_path: Path) -> None:
    """The attack review: an entry named ``x.rce`` (make_key, Redis and memory take it; a
    ``dir://`` folder cannot hold it) first in a bundle stopped the whole import: exit 1,
    "InvalidKeyError", no report, and none of the other 599 entries written."""
    odd = rc.make_key(module_id="m", runtime="x.rce", purpose="program-binary", device=None)
    blobs = [encode_entry(str(odd), odd.parts, b"odd", created_at=time.time())]
    blobs += [encode_entry(str(key(i)), key(i).parts, b"v", created_at=0.0) for i in range(599)]
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(encode_bundle(blobs))
    url = f"dir://{tmp_path / 'c'}"
    done = cli("--cache", url, "import", "--json", str(bundle))
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["accepted"] == 599, (report, done.stderr)
    assert report["not_written"] == report["unstorable_keys"] == 1
    assert "x.rce" in report["write_errors"][0] and report["kept_existing"] == 0
    assert len(list(rc.open_backend(url).keys(""))) == 599
    done = cli("--cache", url, "import", "--keep-existing", str(bundle))
    assert done.returncode == 1 and "kept 599 entries already in the cache" in done.stdout
    assert "not written: 1 entry whose key this store cannot hold" in done.stdout, done


def test_prune_goes_on_past_an_entry_it_cannot_remove(tmp_path: Path) -> None:
    """The operator review: one immutable entry stopped prune after its first removal, and
    the cache stayed over the cap (clear went on past it). The review of that fix: an
    entry that cannot go and fills the cap alone must not make prune empty the rest."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    url = _filled(tmp_path, 6, 1024)
    root = tmp_path / "big"
    stuck = sorted(root.rglob("*.rce"))[2]
    if subprocess.run(["chattr", "+i", str(stuck.parent)]).returncode:
        pytest.skip("this file system has no immutable flag")
    try:
        done = cli("--cache", url, "prune", "--max-size", "3000B")  # room for it and one more
        assert done.returncode == 0 and "1 entry (1.2 KiB) cannot be removed" in done.stderr
        assert "Traceback" not in done.stderr
        left = list(root.rglob("*.rce"))
        assert stuck in left and len(left) == 2, (left, done.stdout)
    finally:
        subprocess.run(["chattr", "-i", str(stuck.parent)])
    # The fourth review: it was known only once prune tried it, so met last (the most
    # recently used) it still let prune empty the rest. Now it is known before.
    for name, when in (("first", 1.0), ("last", time.time() + 3600)):
        url = _filled(tmp_path / name, 6, 1024)
        root = tmp_path / name / "big"
        stuck = sorted(root.rglob("*.rce"))[2]
        os.utime(stuck, (when, when))
        subprocess.run(["chattr", "+i", str(stuck.parent)], check=True)
        try:
            done = cli("--cache", url, "prune", "--max-size", "1B")  # it alone is over the cap
            assert done.returncode == 1 and "the others were kept too" in done.stderr
            assert len(list(root.rglob("*.rce"))) == 6, (name, done.stdout)  # the rest stays
        finally:
            subprocess.run(["chattr", "-i", str(stuck.parent)])


@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_output_into_a_non_blocking_pipe_waits_for_its_reader(
    tmp_path: Path, unbuffered: str
) -> None:
    """The review of the write check: stdout inherited non-blocking (node, some CI
    runners), merely full, was taken for a closed pipe: exit 141 and 64 KiB of the bundle.
    The fourth review: without PYTHONUNBUFFERED the last flush, at exit, met the full pipe
    and raised (exit 120, the end of the output lost)."""
    url = _filled(tmp_path, 8, 100 * 1024)
    many = _filled(tmp_path / "many", 1500, 8)
    whole = tmp_path / "whole.rcb"
    assert cli("--cache", url, "export", str(whole)).returncode == 0
    listing = cli("--cache", many, "ls", "--json").stdout
    table = cli("--cache", many, "ls").stdout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    for argv, expected in (
        (["--cache", url, "export", "-"], whole.read_bytes()),
        (["--cache", many, "ls", "--json"], listing.encode()),
        (["--cache", many, "ls"], table.encode()),
    ):
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        child = subprocess.Popen(
            [sys.executable, "-m", "runtime_cache", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
            env=env,
        )
        os.close(write_end)
        time.sleep(1)  # the reader comes late, and reads slowly: the pipe stays full
        chunks = []
        while chunk := os.read(read_end, 16384):
            chunks.append(chunk)
            time.sleep(0.005)
        os.close(read_end)
        got = b"".join(chunks)
        assert child.wait(60) == 0, child.stderr.read() if child.stderr else ""
        if argv[-1] == "ls":  # (its ages move on between runs)
            got, expected = got.splitlines()[-1], expected.splitlines()[-1]
        assert got == expected, (argv, len(got), len(expected))


def test_import_goes_on_past_an_entry_it_cannot_replace(tmp_path: Path) -> None:
    """An immutable entry (its file's folder) ended the import: "ReadOnlyBackendError", and
    none of the bundle's other entries were written. A read-only store still stops it, once."""
    if os.geteuid() != 0 or shutil.which("chattr") is None:
        pytest.skip("needs root and chattr")
    source = _filled(tmp_path / "src", 6, 1024)
    bundle = tmp_path / "b.rcb"
    assert cli("--cache", source, "export", str(bundle)).returncode == 0
    target = _filled(tmp_path / "dst", 6, 1024)  # the same keys, written at another time
    root = tmp_path / "dst" / "big"
    stuck = sorted(root.rglob("*.rce"))[2]
    before = stuck.read_bytes()
    if subprocess.run(["chattr", "+i", str(stuck.parent)]).returncode:
        pytest.skip("this file system has no immutable flag")
    try:
        done = cli("--cache", target, "import", "--json", str(bundle))
        report = json.loads(done.stdout)
        assert done.returncode == 1 and report["accepted"] == 5, (report, done.stderr)
        assert report["not_written"] == 1 and "Traceback" not in done.stderr
        assert stuck.read_bytes() == before  # kept as it was
        imported = {p.read_bytes() for p in (tmp_path / "src").rglob("*.rce")}
        assert sum(p.read_bytes() in imported for p in root.rglob("*.rce")) == 5
    finally:
        subprocess.run(["chattr", "-i", str(stuck.parent)], check=True)
    with tmpfs(tmp_path / "ro", "1m") as ro:  # a read-only store: one error, no per-entry list
        rc.Cache(rc.open_backend(f"dir://{ro / 'c'}")).put(key(99), b"there")
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        done = cli("--cache", f"dir://{ro / 'c'}", "import", str(bundle))
        assert done.returncode == 1 and "read-only" in done.stderr, done
        assert done.stderr.count("\n") == 1, done.stderr


def test_a_relative_folder_with_the_current_folder_gone_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Operator review, session 37: ``--cache dir://rel/x`` run from a folder that was
    removed printed a traceback (``os.path.abspath`` found no current folder)."""
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        for command in (["ls"], ["clear", "--yes"]):
            assert main(["--cache", "dir://rel/x", *command]) == 1
            err = capsys.readouterr().err
            assert "relative, and the current folder is gone" in err and "Traceback" not in err
        assert not rc.set_cache_provider("dir://rel/x").enabled  # logged: caching is off
    finally:
        os.chdir(here)


def test_clear_says_what_it_removed_before_the_store_went_away(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Operator review, session 37: a Redis server that stopped answering during ``clear``
    ended it with the error alone; 2,124 of 3,000 entries were gone, unsaid."""
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.errors import BackendUnavailableError

    class GoesAway(MemoryBackend):
        def delete(self, key: str) -> bool:
            if len(self._data) <= 3:
                raise BackendUnavailableError("delete on the store failed: timeout")
            return super().delete(key)

    cache = rc.Cache(GoesAway())
    for i in range(8):
        cache.put(rc.make_key(module_id=f"m{i}", runtime="r", purpose="p"), b"v")
    monkeypatch.delenv("RUNTIME_CACHE", raising=False)
    # (The command looks for the default folder first, which it would not create: one of
    # the test's own, not the user's, which passed only where an earlier run had made it.)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "runtime-cache").mkdir(parents=True, mode=0o700)
    rc.set_cache_provider(cache)  # the store the command works on
    assert main(["clear", "--yes"]) == 1
    err = capsys.readouterr().err
    assert "timeout (removed 5 of 8 before)" in err and "Traceback" not in err


def test_import_of_standard_input_without_a_temporary_folder_holds_it_in_memory(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-attack of session 43: with no temporary folder this user may write (a container
    whose file systems are read-only), ``import -`` failed ("No usable temporary
    directory"), where ``import FILE`` worked; the stream is kept in memory there."""
    import io
    import tempfile

    from runtime_cache.cli.bundle_read import read_bundle_file
    from runtime_cache.codec import DEFAULT_LIMITS

    cache = rc.Cache(rc.open_backend(f"dir://{root}"))
    cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"value")
    data = cache.dumps()

    def none_there() -> str:
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", none_there)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert read_bundle_file("-", DEFAULT_LIMITS, signed_only=False) == data


def test_import_names_what_a_cut_or_closed_input_is(root: Path, tmp_path: Path) -> None:
    """Re-attack of session 43: ``import - <&-`` ended in a traceback, and a bundle cut
    in an entry's length said "bundle is 12 bytes" of a 15-byte file."""
    cache = rc.Cache(rc.open_backend(f"dir://{root}"))
    cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"value")
    cut = tmp_path / "cut.rcb"
    cut.write_bytes(cache.dumps()[:15])
    done = cli("--cache", f"dir://{root}", "import", str(cut))
    assert done.returncode == 1 and "bundle is 15 bytes" in done.stderr, done.stderr
    closed = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "runtime_cache.cli",
            "--cache",
            f"dir://{root}",
            "import",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        preexec_fn=lambda: os.close(0),
    )
    assert closed.returncode == 1 and "standard input: it is closed" in closed.stderr
    assert "Traceback" not in closed.stderr


def test_import_of_a_non_blocking_standard_input_waits_for_the_bundle(
    root: Path, tmp_path: Path
) -> None:
    """Re-attack of session 43: standard input left non-blocking by a parent answered
    ``None`` while the writer had not written yet, taken for the end: a valid bundle was
    "not a valid bundle: bad magic"."""
    cache = rc.Cache(rc.open_backend(f"dir://{root}"))
    cache.put(rc.make_key(module_id="m", runtime="r", purpose="p"), b"value")
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(cache.dumps())
    code = (
        "import os, sys\n"
        "os.set_blocking(0, False)\n"
        "from runtime_cache.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    late = f"sleep 1; cat {bundle}"
    done = subprocess.run(
        f"({late}) | {sys.executable} -I -c '{code}' --cache dir://{tmp_path / 'other'} import -",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and "imported 1" in done.stdout, done.stderr


def test_an_empty_output_name_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator review: `show KEY --raw ""` (an unset $OUT in a script) printed the
    metadata, wrote nothing and exited 0; `export ""` said "cannot write : no file named"."""
    cache = rc.Cache(DirectoryBackend(tmp_path))
    key = rc.make_key(module_id="m", runtime="r", purpose="p")
    cache.put(key, b"value")
    url = f"dir://{tmp_path}"
    assert main(["--cache", url, "show", str(key), "--raw", ""]) == 2
    assert "--raw needs a file name" in capsys.readouterr().err
    assert main(["--cache", url, "export", ""]) == 2
    assert "export needs a file name" in capsys.readouterr().err
    assert main(["--cache", url, "import", ""]) == 2
    assert "import needs a file name" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text", ["\u0661MB", "\u0661d", "1\u0660m", "\uff11GB", "5\u017f", "1\u212aB", "1\u212a"]
)
def test_sizes_and_durations_take_ascii_digits_alone(text: str) -> None:
    """The operator review: `--max-size` took an Arabic-Indic digit for a 1 (Python's
    float() reads any script's digits); sizes and durations take 0-9 alone. The re-attack:
    and ASCII unit letters alone (a long s for s raised KeyError, a Kelvin sign was k)."""
    from runtime_cache.units import parse_duration, parse_size

    with pytest.raises(ValueError):
        parse_size(text)
    with pytest.raises(ValueError):
        parse_duration(text)


def test_an_import_names_entries_of_a_newer_format_for_what_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator review: a bundle entry in a newer format was "corrupt" to `import`
    (verify, on the same entry in a cache, says "newer format"); it is left out as one."""
    keys = [rc.make_key(module_id=f"m{i}", runtime="r", purpose="p") for i in range(2)]
    blobs = [bytearray(encode_entry(str(k), k.parts, b"v", created_at=time.time())) for k in keys]
    blobs[1][4] = 2  # the entry format's version: one this reader does not know
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(encode_bundle([bytes(b) for b in blobs]))
    result = rc.Cache(rc.open_backend("memory://")).loads(bundle.read_bytes())
    assert (int(result), result.newer, result.corrupt) == (1, 1, 0)
    url = f"dir://{tmp_path / 'cache'}"
    assert main(["--cache", url, "import", str(bundle)]) == 1
    out = capsys.readouterr().out
    assert "left out 1 entry in a newer format" in out and "corrupt" not in out, out
    assert main(["--cache", url, "import", "--json", str(bundle)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["newer_format"], report["corrupt"], report["accepted"]) == (1, 0, 1)
