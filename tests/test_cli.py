"""The runtime-cache command on real directory caches: listings, maintenance, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.cli.app import plugins

DEVICE = {"vendor": "Acme", "name": "Acme GPU 7", "driver": "31.0.1"}


def key(i: int, purpose: str = "program-binary", device: Any = DEVICE) -> rc.CacheKey:
    return rc.make_key(
        module_id=f"net@{i % 3}", runtime="opencl", purpose=purpose, device=device, kernel=f"k{i}"
    )


class Run:
    """Call main() in-process and capture what it prints."""

    def __init__(self, capsys: pytest.CaptureFixture[str], url: str) -> None:
        self.capsys, self.url = capsys, url

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--cache", self.url, *argv])
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self(*argv, "--json")
        assert code == 0, err
        return json.loads(out)

    def listing(self, *argv: str) -> list[Any]:
        """The entries of ``ls --json`` (after checking that none was skipped)."""
        found = self.json("ls", *argv)
        assert found["skipped"] == 0, found["skipped_entries"]
        return list(found["entries"])


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def cache(root: Path) -> Any:
    c = rc.Cache(DirectoryBackend(root, max_size=None))
    yield c
    c.close()


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str], root: Path) -> Run:
    return Run(capsys, f"dir://{root}?max_size=none")


def fill(cache: rc.Cache, n: int = 6) -> list[rc.CacheKey]:
    keys = [key(i) for i in range(n)]
    for i, k in enumerate(keys):
        cache.put(k, bytes([i]) * (100 * (i + 1)), build_seconds=0.25 * (i + 1))
    return keys


def entry_file(root: Path, k: rc.CacheKey | str) -> Path:
    digest = str(k).rsplit("/", 1)[-1]
    (path,) = root.rglob(f"{digest}.rce")
    return path


def test_ls_json_lists_every_entry_with_its_parts(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache)
    listed = run.listing()
    assert sorted(e["key"] for e in listed) == sorted(map(str, keys))
    first = next(e for e in listed if e["key"] == str(keys[2]))
    assert first["module_id"] == "net@2"
    assert first["device"] == DEVICE
    assert first["parts"]["kernel"] == "k2"
    assert first["size"] == 300 and first["stored_size"] > 300
    assert first["build_seconds"] == pytest.approx(0.75)
    assert first["hits"] == 0


def test_ls_filters_and_sorts(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache)
    tuning = key(99, purpose="tuning")
    cache.put(tuning, b"record")
    assert [e["key"] for e in run.listing("--purpose", "tuning")] == [str(tuning)]
    assert {e["module_id"] for e in run.listing("--module", "net@1")} == {"net@1"}
    by_size = [e["key"] for e in run.listing("--sort", "size", "--purpose", "program-binary")]
    assert by_size == [str(k) for k in reversed(keys)]
    smallest_first = run.listing("--sort", "size", "--reverse", "--purpose", "program-binary")
    assert [e["key"] for e in smallest_first] == [str(k) for k in keys]
    by_build = [e["key"] for e in run.listing("--sort", "build", "--runtime", "opencl")]
    assert by_build[0] == str(keys[-1]) and by_build[-1] == str(tuning)
    # By the SIZE column (the value's size), not the stored size: a small value with large
    # metadata was listed before a larger one (the new-user review).
    small, large = key(200, purpose="sizes"), key(201, purpose="sizes")
    cache.put(small, b"s" * 10, extra={"note": "n" * 400})
    cache.put(large, b"l" * 200)
    listed = run.listing("--sort", "size", "--purpose", "sizes")
    assert [e["key"] for e in listed] == [str(large), str(small)], listed
    assert listed[0]["stored_size"] < listed[1]["stored_size"]


def test_ls_table_shows_short_keys_and_device(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache, 2)
    code, out, _ = run("ls")
    assert code == 0
    assert str(keys[0]).rsplit("/", 1)[-1][:12] in out
    assert "Acme GPU 7 / 31.0.1" in out
    assert "2 entries" in out
    code, out, _ = run("ls", "--full-keys")
    assert str(keys[1]) in out


def test_ls_empty_cache(run: Run, cache: rc.Cache) -> None:
    code, out = run("ls")[:2]
    assert code == 0 and out.startswith("no entries\nsigned:  no")
    assert run.listing() == []


@pytest.mark.parametrize(
    "argv",
    [
        ["ls"],
        ["stats"],
        ["show", "abc"],
        ["verify"],
        ["export", "-"],
        ["verify", "--repair"],
        ["rm", "abc"],
        ["clear", "--yes"],
        ["prune", "--max-size", "1MB"],
    ],
)
def test_a_command_that_only_reads_or_removes_creates_no_cache_folder(
    run: Run, root: Path, tmp_path: Path, argv: list[str]
) -> None:
    """A mistyped --cache folder: said so, and nothing made there. rm, clear, prune and
    verify --repair made it and said "removed 0 entries" (exit 0); import may make it."""
    code, _, err = run(*argv)
    assert code == 1 and f"no cache at {root}" in err
    assert not root.exists()
    bundle = tmp_path / "empty.rcb"
    bundle.write_bytes(rc.Cache(rc.open_backend("memory://")).dumps())
    assert run("import", str(bundle))[0] == 0 and root.is_dir()


@pytest.mark.parametrize(
    "url",
    ["memory://,dir://{root}", "dir://{root} ", " dir://{root}", "dir://{root}, memory://"],
    ids=["a tier", "a trailing space", "a leading space", "a first tier, stripped"],
)
def test_no_cache_folder_is_made_for_a_tier_or_an_odd_spelling(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, url: str
) -> None:
    """The folder checked is the folder the registry would open: each tier, and a single
    URL, stripped, as ``RUNTIME_CACHE`` is. (The operator review, helper-77: with a leading
    space, ``stats`` made the folder; with a trailing one, ``--cache`` wrote into another
    folder than the same text in ``RUNTIME_CACHE``.)"""
    root = tmp_path / "nothing-here"
    code, _, err = Run(capsys, url.format(root=root))("ls")
    assert code == 1 and "no cache at" in err and "nothing-here" in err
    assert list(tmp_path.iterdir()) == []
    backend = rc.open_backend(url.format(root=root))
    backend.set("k/x", b"v")
    backend.close()
    assert [p.name for p in tmp_path.iterdir()] == ["nothing-here"]


def test_no_cache_folder_is_made_from_the_environment_or_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNTIME_CACHE", f"dir://{tmp_path / 'from-env'}")
    capsys.readouterr()
    assert main(["ls"]) == 1
    assert f"no cache at {tmp_path / 'from-env'}" in capsys.readouterr().err
    monkeypatch.delenv("RUNTIME_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    assert main(["stats"]) == 1
    assert f"no cache at {tmp_path / 'xdg' / 'runtime-cache'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]
    assert list((tmp_path / "tmp").iterdir()) == []
    # A temporary fallback folder from another time changes nothing while the home works.
    import os

    (tmp_path / "tmp" / f"runtime-cache-{os.getuid()}-cache").mkdir(mode=0o700)
    assert main(["ls"]) == 1
    assert f"no cache at {tmp_path / 'xdg' / 'runtime-cache'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]


def test_a_typo_in_a_url_option_is_said_before_a_missing_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = Run(capsys, f"dir://{tmp_path / 'nothing'}?max_sise=1GB")("ls")
    assert code == 2 and "unknown option(s) max_sise" in err
    code, _, err = Run(capsys, f"dir://{tmp_path / 'nothing'}?insecure=1")("ls")
    assert code == 1 and "no cache at" in err  # insecure= is the registry's, not a typo
    assert list(tmp_path.iterdir()) == []


def test_caching_off_says_why_the_environments_cache_did_not_open(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "team").mkdir()
    monkeypatch.setenv("RUNTIME_CACHE", f"memory://,dir://{tmp_path / 'team'}?shared=1")
    monkeypatch.delenv("RUNTIME_CACHE_SECRET", raising=False)
    capsys.readouterr()
    assert main(["ls"]) == 2  # opened as --cache would be: the same error, the same code
    err = capsys.readouterr().err
    assert "refusing to use" in err and "without a secret" in err
    assert err.count("refusing") == 1  # said once: the log line is the command's to say


def test_a_cache_the_environment_names_fails_as_the_same_option_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`RUNTIME_CACHE=dir:///a-file ls` exited 2, `--cache dir:///a-file ls` 1."""
    (tmp_path / "a-file").write_text("")
    url = f"dir://{tmp_path / 'a-file'}"
    capsys.readouterr()
    assert main(["--cache", url, "ls"]) == 1
    given = capsys.readouterr().err
    monkeypatch.setenv("RUNTIME_CACHE", url)
    assert main(["ls"]) == 1
    assert capsys.readouterr().err == given and "not a directory" in given


@pytest.mark.parametrize("argv", [["--cache", "", "ls"], ["--cache", " ", "stats"]])
def test_an_empty_cache_option_is_a_usage_error_not_the_default(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """``--cache "$UNSET"`` must not quietly work on the app's default cache."""
    assert main(argv) == 2
    assert "--cache needs a URL" in capsys.readouterr().err


def test_an_empty_secret_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cache", "memory://", "--secret", "", "ls"]) == 2
    assert "may not be empty" in capsys.readouterr().err


def test_a_missing_folder_is_named_with_its_escapes_decoded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The folder reported is the one the backend would open: ``%20`` is a space."""
    code, _, err = Run(capsys, f"dir://{tmp_path}/my%20cache")("ls")
    assert code == 1 and f"no cache at {tmp_path / 'my cache'} " in err
    assert list(tmp_path.iterdir()) == []


def test_show_by_digest_prefix_never_prints_the_value(run: Run, cache: rc.Cache) -> None:
    k = key(1)
    cache.put(k, b"SECRET-BINARY" * 10, build_seconds=1.5, extra={"compiler": "clang 17"})
    digest = str(k).rsplit("/", 1)[-1]
    code, out, _ = run("show", digest[:8])
    assert code == 0
    assert str(k) in out and "clang 17" in out and "kernel" in out
    assert "SECRET-BINARY" not in out
    shown = run.json("show", str(k))
    assert shown["key"] == str(k)
    assert run.json("show", str(k)[:-20])["key"] == str(k)  # a prefix of the whole key
    assert shown["extra"] == {"compiler": "clang 17"}
    assert shown["parts"] == k.parts
    assert shown["build_seconds"] == 1.5


def test_show_raw_writes_the_checked_value(run: Run, cache: rc.Cache, tmp_path: Path) -> None:
    k = key(1)
    cache.put(k, b"\x00RAWVALUE\xff")
    target = tmp_path / "value.bin"
    code, out, _ = run("show", str(k), "--raw", str(target))
    assert code == 0
    assert target.read_bytes() == b"\x00RAWVALUE\xff"
    assert "RAWVALUE" not in out
    # Over a file of the user's own, its mode stays, as with `>` (the re-attack review of
    # session 41: a 0600 file was made 0644, a 0755 one lost its x).
    for mode in (0o600, 0o755):
        target.chmod(mode)
        assert run("show", str(k), "--raw", str(target))[0] == 0
        assert stat.S_IMODE(target.stat().st_mode) == mode
    target.chmod(0o6755)  # (never set-user-ID: new bytes from a cache)
    assert run("show", str(k), "--raw", str(target))[0] == 0
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: it gives a link to another user")
def test_show_raw_never_follows_a_planted_link_nor_waits_on_a_fifo(
    cache: rc.Cache, root: Path, tmp_path: Path
) -> None:
    """The attack review of session 41: ``show KEY --raw F`` opened F with a plain
    ``open()``: it wrote the value over the file a link another user planted led to, and
    waited for good on a FIFO. It writes as ``export`` does now."""
    k = key(1)
    cache.put(k, b"VALUE")
    shared = tmp_path / "shared"  # a folder another user's group may write
    shared.mkdir()
    os.chown(shared, -1, 12345)
    shared.chmod(0o2775)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    planted = shared / "kernel.bin"
    planted.symlink_to(victim)
    os.lchown(planted, 12345, 12345)
    done = _cli(root, "show", str(k), "--raw", str(planted), capture_output=True)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "the user's own file" and not planted.is_symlink()
    assert planted.read_bytes() == b"VALUE" and b"was a link; replaced" in done.stderr
    fifo = shared / "k2.bin"
    os.mkfifo(fifo)
    os.chown(fifo, 12345, 12345)
    done = _cli(root, "show", str(k), "--raw", str(fifo), capture_output=True)
    assert done.returncode == 1 and b"cannot write" in done.stderr, done.stderr
    assert fifo.is_fifo()


def _cli(root: Path, *argv: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "runtime_cache.cli", "--cache", f"dir://{root}", *argv]
    return subprocess.run(command, timeout=60, check=False, **kwargs)


def test_show_raw_dash_writes_only_the_value_to_stdout(cache: rc.Cache, root: Path) -> None:
    """``--raw -`` made a file named ``-`` in the current folder."""
    k = key(1)
    cache.put(k, b"\x00RAWVALUE\xff")
    done = _cli(root, "show", str(k), "--raw", "-", capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"\x00RAWVALUE\xff"
    both = _cli(root, "show", str(k), "--raw", "-", "--json", capture_output=True)
    # The JSON was dropped silently; no JSON error either, where stdout is the value's.
    assert both.returncode == 2 and both.stdout == b""


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.parametrize(
    "argv",
    [
        ["export", "-"],
        ["show", "<key>", "--raw", "-"],
        ["export", "/dev/stdout"],  # (the attack review of session 41: written to it)
        ["show", "<key>", "--raw", "/dev/stdout"],
    ],
)
def test_binary_output_is_refused_on_a_terminal(
    cache: rc.Cache, root: Path, argv: list[str]
) -> None:
    """``export -`` wrote the bundle's bytes to the terminal."""
    import pty

    k = key(1)
    cache.put(k, b"\x00RAWVALUE\xff")
    leader, follower = pty.openpty()
    argv = [str(k) if a == "<key>" else a for a in argv]
    done = _cli(root, *argv, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    os.set_blocking(leader, False)
    try:
        drawn = os.read(leader, 4096)
    except (BlockingIOError, OSError):
        drawn = b""
    os.close(leader)
    assert done.returncode == 2, done.stderr
    assert b"terminal" in done.stderr and b"RAWVALUE" not in drawn and b"RCB" not in drawn


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and a pty")
@pytest.mark.parametrize("command", ["export", "show"])
@pytest.mark.parametrize("named", ["/dev/pts", "/proc/self/fd"])
def test_binary_output_to_a_terminal_named_as_a_file_is_refused(
    cache: rc.Cache, root: Path, command: str, named: str
) -> None:
    """Session 42's closing note: ``export /dev/tty`` (and ``show --raw``) wrote the
    bytes to the terminal; only ``-`` and standard output were refused there. Any output
    that is a terminal is refused the same way (exit 2), before a byte is written."""
    import pty

    k = key(1)
    cache.put(k, b"\x00RAWVALUE\xff")
    leader, follower = pty.openpty()
    try:
        path = os.ttyname(follower) if named == "/dev/pts" else f"/proc/self/fd/{follower}"
        argv = ["export", path] if command == "export" else ["show", str(k), "--raw", path]
        done = _cli(root, *argv, capture_output=True, pass_fds=(follower,))
        os.set_blocking(leader, False)
        try:
            drawn = os.read(leader, 4096)
        except (BlockingIOError, OSError):
            drawn = b""
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 2, done.stderr
    assert b"terminal" in done.stderr and drawn == b"", (done.stderr, drawn)
    assert b"exported" not in done.stdout + done.stderr and b"wrote" not in done.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs a pty")
def test_export_to_a_terminal_is_refused_before_the_store_is_read() -> None:
    """Session 42's closing note: ``export /dev/pts/N`` was refused only after the whole
    bundle was built (minutes, on a big store). The output is opened first, as a shell's
    ``>`` is: here the store is a dead server, which would fail the export (exit 1)."""
    import pty

    leader, follower = pty.openpty()
    try:
        command = [
            sys.executable,
            "-m",
            "runtime_cache.cli",
            "--cache",
            "redis://127.0.0.1:1/0?insecure=1",
        ]
        done = subprocess.run(
            [*command, "export", os.ttyname(follower)],
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert done.returncode == 2, done.stderr
    assert b"terminal" in done.stderr and b"127.0.0.1" not in done.stderr, done.stderr


def test_show_missing_and_ambiguous(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache, 40)
    assert run("show", "opencl/program-binary/" + "0" * 32)[0] == 1
    assert run("show", "zzzz")[0] == 1
    # 40 digests share at most 16 first hex digits: some single digit is ambiguous
    first_digits = [str(k).rsplit("/", 1)[-1][0] for k in keys]
    shared = next(d for d in first_digits if first_digits.count(d) > 1)
    code, _, err = run("show", shared)
    assert code == 2 and "matches" in err
    # A runtime's name alone is the prefix "opencl/" (the operator review: it said "no
    # entry opencl", where "opencl/program-binary/" said "matches 40 keys").
    for prefix in ("opencl", "opencl/", "opencl/program-binary/"):
        code, _, err = run("show", prefix)
        assert code == 2 and f"{prefix!r} matches 40 keys" in err, err
    cache.put(rc.make_key(module_id="m", runtime="lonely", purpose="p"), b"v")
    code, out, _ = run("show", "lonely")  # one key under it: that one, as with "lonely/"
    assert code == 0 and "lonely/p/" in out


def test_show_corrupt_head_is_reported(run: Run, cache: rc.Cache, root: Path) -> None:
    k = key(1)
    cache.put(k, b"v" * 100)
    path = entry_file(root, k)
    data = bytearray(path.read_bytes())
    data[40] ^= 0xFF  # inside the metadata
    path.write_bytes(bytes(data))
    code, _, err = run("show", str(k))
    assert code == 1 and "corrupt" in err


def test_stats_counts_hits_kept_by_the_backend(run: Run, cache: rc.Cache, root: Path) -> None:
    keys = fill(cache, 3)
    tuning = key(7, purpose="tuning")
    cache.put(tuning, b"rec", build_seconds=2.0)
    other = rc.Cache(DirectoryBackend(root, max_size=None))  # another "process"
    for _ in range(3):
        assert other.get(keys[0]) is not None
    assert other.get(tuning) == b"rec"
    other.close()  # flushes the hits journal
    stats = run.json("stats")
    overall = stats["overall"]
    assert overall["entries"] == 4
    assert overall["hits"] == 4
    assert overall["misses"] == 4
    assert overall["hit_rate"] == pytest.approx(4 / 8)
    assert overall["seconds_saved"] == pytest.approx(3 * 0.25 + 2.0)
    assert overall["bytes"] == sum(e["stored_size"] for e in run.listing())
    groups = {(g["runtime"], g["purpose"]): g for g in stats["groups"]}
    assert groups["opencl", "tuning"]["hits"] == 1
    assert groups["opencl", "program-binary"]["entries"] == 3
    assert set(stats["sources"]) >= {"hits", "misses", "hit_rate", "seconds_saved"}
    code, out, _ = run("stats")
    assert code == 0 and "total" in out and "50.0%" in out
    # Its size is the stored one, named so (the new-user review: stats' SIZE and ls' SIZE
    # told one entry as 684.8 and 684.1 KiB).
    assert "STORED" in out.splitlines()[0] and "ls SIZE is the value's" in out


def test_stats_where_the_backend_keeps_no_hits(
    capsys: pytest.CaptureFixture[str], cache: rc.Cache, root: Path
) -> None:
    fill(cache, 2)
    assert main(["--cache", f"dir://{root}?track_access=0", "stats", "--json"]) == 0
    overall = json.loads(capsys.readouterr().out)["overall"]
    assert overall["entries"] == 2
    assert overall["hits"] is None and overall["hit_rate"] is None
    assert overall["seconds_saved"] is None
    assert main(["--cache", f"dir://{root}?track_access=0", "stats"]) == 0
    assert "-" in capsys.readouterr().out


def test_rm_removes_and_reports_missing(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache, 3)
    code, out, _ = run("rm", str(keys[0]))
    assert code == 0 and str(keys[0]) in out
    assert cache.get(keys[0]) is None and cache.get(keys[1]) is not None
    code, _, err = run("rm", str(keys[1]), str(keys[0]))
    assert code == 1 and "no entry" in err
    assert cache.get(keys[1]) is None and cache.get(keys[2]) is not None


def test_clear_needs_yes_without_a_terminal(run: Run, cache: rc.Cache) -> None:
    fill(cache, 3)
    code, _, err = run("clear")
    assert code == 2 and "--yes" in err
    assert len(run.listing()) == 3
    assert run("clear", "--yes")[0] == 0
    assert run.listing() == []


@pytest.mark.skipif(sys.platform == "win32", reason="needs a POSIX pseudo-terminal")
@pytest.mark.parametrize(("answer", "code", "left"), [("y", 0, 0), ("n", 1, 2)])
def test_clear_asks_on_a_terminal(
    cache: rc.Cache, root: Path, answer: str, code: int, left: int
) -> None:
    import pty

    fill(cache, 2)
    leader, follower = pty.openpty()
    os.write(leader, answer.encode() + b"\n")
    proc = subprocess.run(
        [sys.executable, "-m", "runtime_cache.cli", "--cache", f"dir://{root}", "clear"],
        stdin=follower,
        capture_output=True,
        text=True,
        timeout=60,
    )
    os.close(follower)
    os.close(leader)
    assert proc.returncode == code, proc.stderr
    assert f"Remove all 2 entries from the folder {root}? [y/N]" in proc.stderr
    assert len(list(cache.entries())) == left


def test_prune_max_size_evicts_least_recently_used_first(
    run: Run, cache: rc.Cache, root: Path
) -> None:
    keys = fill(cache, 5)
    sizes = {e["key"]: e["stored_size"] for e in run.listing()}
    # Access order, oldest first: 3, 0, 4, 1, 2 (set through the files' access stamps).
    order = [3, 0, 4, 1, 2]
    base = 1_700_000_000
    for rank, i in enumerate(order):
        os.utime(entry_file(root, keys[i]), (base + rank * 60, base + rank * 60))
    keep = order[2:]
    limit = sum(sizes[str(keys[i])] for i in keep)
    report = run.json("prune", "--max-size", f"{limit}B")
    assert report["removed"] == 2
    assert report["remaining_bytes"] <= limit
    assert {e["key"] for e in run.listing()} == {str(keys[i]) for i in keep}


def test_prune_older_than(run: Run, cache: rc.Cache, root: Path) -> None:
    import time

    keys = fill(cache, 3)
    old = time.time() - 40 * 86400
    os.utime(entry_file(root, keys[1]), (old, old))
    code, out, _ = run("prune", "--older-than", "30d")
    assert code == 0 and "removed 1 entry" in out
    assert {e["key"] for e in run.listing()} == {str(keys[0]), str(keys[2])}
    # A bare number was seconds: "--older-than 3", meant as days, emptied the cache.
    for option, bare in (("--older-than", "3"), ("--older-than", "3.5"), ("--max-size", "500")):
        code, _, err = run("prune", option, bare)  # --max-size 500 emptied the cache too
        assert code == 2 and "has no unit" in err
    assert len(run.listing()) == 2
    # "6M" is months to some (systemd): it took 6 minutes and emptied the cache (session 37).
    code, _, err = run("prune", "--older-than", "6M")
    assert code == 2 and "ambiguous" in err and "6min" in err
    assert len(run.listing()) == 2
    # A bare 0 is taken for an age (older than no time at all), but not for a size: a
    # max_size of 0 in a cache's URL means no cap, and this emptied the cache (new-user and
    # operator review, session 38). 0B says it.
    code, _, err = run("prune", "--max-size", "0")
    assert code == 2 and "0B" in err and len(run.listing()) == 2
    code, out, _ = run("prune", "--max-size", "0B")
    assert code == 0 and "removed 2 entries" in out
    assert run.listing() == []


def test_verify_finds_a_hand_corrupted_entry_and_repair_removes_only_it(
    run: Run, cache: rc.Cache, root: Path
) -> None:
    keys = fill(cache, 5)
    path = entry_file(root, keys[3])
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x55  # inside the value: only a full check sees it
    path.write_bytes(bytes(data))
    code, out, _ = run("verify")
    assert code == 1 and f"BAD  {keys[3]}" in out and "--repair" in out
    code, out, _ = run("verify", "--json")
    report = json.loads(out)
    assert code == 1
    assert report["checked"] == 5
    assert [b["key"] for b in report["bad"]] == [str(keys[3])]
    assert path.exists()  # no repair without --repair
    code, out, _ = run("verify", "--repair")
    assert code == 1 and "1 removed" in out
    assert not path.exists()
    for i in (0, 1, 2, 4):
        assert cache.get(keys[i]) == bytes([i]) * (100 * (i + 1))
    assert run("verify")[0] == 0


def test_verify_with_a_secret_rejects_unsigned_entries(run: Run, cache: rc.Cache) -> None:
    fill(cache, 2)
    code, out, _ = run("--secret", "s3cret", "verify", "--json")
    assert code == 1
    assert len(json.loads(out)["bad"]) == 2
    assert json.loads(out)["signatures_checked"] is True


def test_export_clear_import_round_trip(run: Run, cache: rc.Cache, tmp_path: Path) -> None:
    binaries = fill(cache, 4)
    tuning = [
        rc.make_key(module_id="net@0", runtime="opencl", purpose="tuning", device=DEVICE, sym=s)
        for s in ("conv_1", "conv_2")
    ]
    for t in tuning:
        cache.put(t, b"\x81\xa4tile\x04", build_seconds=3.0)
    before = run.listing()
    bundle = tmp_path / "app-assets" / "kernels.rcb"
    bundle.parent.mkdir()
    exported = run.json("export", str(bundle))
    assert exported["entries"] == 6 and exported["signed"] is False
    assert run("clear", "--yes")[0] == 0
    assert run.listing() == []
    imported = run.json("import", str(bundle))
    assert imported["accepted"] == 6 and imported["corrupt"] == 0
    after = run.listing()

    def same(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k not in ("hits", "last_access")} for e in entries]

    assert same(after) == same(before)
    for k in [*binaries, *tuning]:
        assert cache.get(k) is not None


def test_export_filters(run: Run, cache: rc.Cache, tmp_path: Path) -> None:
    fill(cache, 3)
    cache.put(key(5, purpose="tuning"), b"t")
    assert run.json("export", str(tmp_path / "t.rcb"), "--purpose", "tuning")["entries"] == 1
    assert run.json("export", str(tmp_path / "m.rcb"), "--module", "net@1")["entries"] == 1


def test_bundle_from_another_device_is_accepted_but_never_matches(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    device_a = {**DEVICE, "name": "Acme GPU 7"}
    device_b = {**DEVICE, "name": "Acme GPU 8"}
    phone_a = rc.Cache(DirectoryBackend(tmp_path / "a"))
    keys_a = [key(i, device=device_a) for i in range(3)]
    for k in keys_a:
        phone_a.put(k, b"binary for A")
    phone_a.close()
    bundle = tmp_path / "a.rcb"
    assert main(["--cache", f"dir://{tmp_path / 'a'}", "export", str(bundle)]) == 0
    capsys.readouterr()
    assert main(["--cache", f"dir://{tmp_path / 'b'}", "import", str(bundle), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["accepted"] == 3
    phone_b = rc.Cache(DirectoryBackend(tmp_path / "b"))
    assert all(phone_b.get(key(i, device=device_b)) is None for i in range(3))
    assert all(phone_b.get(k) == b"binary for A" for k in keys_a)
    phone_b.close()


def test_signed_bundles(run: Run, cache: rc.Cache, tmp_path: Path) -> None:
    signer = rc.Cache(cache.backend, secret="fleet-secret")
    signer.put(key(1), b"signed value")
    bundle = tmp_path / "signed.rcb"
    assert run.json("--secret", "fleet-secret", "export", str(bundle))["signed"] is True
    assert run("clear", "--yes")[0] == 0
    code, _, err = run("--secret", "wrong", "import", str(bundle))
    assert code == 1 and "signature" in err
    assert run.listing() == []
    assert run.json("--secret", "fleet-secret", "import", str(bundle))["accepted"] == 1
    assert signer.get(key(1)) == b"signed value"
    unsigned = tmp_path / "unsigned.rcb"
    assert run("export", str(unsigned))[0] == 0
    code, _, err = run("--secret", "fleet-secret", "import", str(unsigned))
    assert code == 1 and "not signed" in err


def test_import_rejects_a_damaged_bundle(run: Run, cache: rc.Cache, tmp_path: Path) -> None:
    fill(cache, 2)
    bundle = tmp_path / "b.rcb"
    assert run("export", str(bundle))[0] == 0
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 1
    bundle.write_bytes(bytes(data))
    code, _, err = run("import", str(bundle))
    assert code == 1 and "not a valid bundle" in err
    # With --json the report says so too (the new-user review: stdout was empty).
    code, out, err = run("import", "--json", str(bundle))
    assert code == 1 and "not a valid bundle" in json.loads(out)["error"]
    code, out, _ = run("import", "--json", str(tmp_path / "missing.rcb"))
    assert code == 1 and json.loads(out)["accepted"] == 0
    assert run("import", str(tmp_path / "absent.rcb"))[0] == 1


def test_import_skips_one_short_entry_and_takes_the_rest(
    run: Run, cache: rc.Cache, tmp_path: Path
) -> None:
    """An entry shorter than an entry's header made the reader stop, and the whole bundle
    was refused ("checksum mismatch"), where Cache.loads skips that entry (third review)."""
    from runtime_cache.codec import decode_bundle, encode_bundle

    fill(cache, 3)
    whole = tmp_path / "whole.rcb"
    assert run("export", str(whole))[0] == 0
    blobs = decode_bundle(whole.read_bytes())
    mixed = tmp_path / "mixed.rcb"
    mixed.write_bytes(encode_bundle([*blobs, b"abc"]))
    target = Run(run.capsys, f"dir://{tmp_path / 'target'}")
    code, out, err = target("import", str(mixed))
    assert code == 1 and "imported 3 of 4" in out, (out, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["ls", "--sort", "bogus"],
        ["prune"],
        ["prune", "--max-size", "5 parsecs"],
        ["prune", "--older-than", "soon"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_2(run: Run, argv: list[str]) -> None:
    assert run(*argv)[0] == 2


def test_bad_cache_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cache", "nosuchscheme://x", "ls"]) == 2
    assert "no backend" in capsys.readouterr().err
    assert main(["--cache", "dir:///tmp?bogus_option=1", "ls"]) == 2


def test_default_cache_is_the_providers(capsys: pytest.CaptureFixture[str]) -> None:
    # conftest points RUNTIME_CACHE at a private folder; the CLI must use it.
    rc.get_cache().put(key(1), b"from the app")
    assert main(["ls", "--json"]) == 0
    assert [e["key"] for e in json.loads(capsys.readouterr().out)["entries"]] == [str(key(1))]
    os.environ["RUNTIME_CACHE"] = "off"
    rc.reset_cache_provider()
    assert main(["ls"]) == 2
    assert "caching is off" in capsys.readouterr().err


def test_global_options_go_before_or_after_the_command(run: Run, cache: rc.Cache) -> None:
    fill(cache, 1)
    code = main(["ls", "--json", "--cache", run.url])
    out = run.capsys.readouterr().out
    assert code == 0 and len(json.loads(out)["entries"]) == 1


def test_plugin_subcommand_comes_through_the_entry_point_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A real distribution on sys.path, as pip would install it: one module and
    # its entry point in the group runtime_cache.cli, with the built-ins' handler signature.
    (tmp_path / "rc_plugin_example.py").write_text(
        "def hello(args, ctx):\n"
        "    print('hello ' * args.times, file=ctx.out)\n"
        "    return 40 + args.times\n"
        "def add_parser(sub):\n"
        "    p = sub.add_parser('hello', help='say hello')\n"
        "    p.add_argument('--times', type=int, default=1)\n"
        "    p.set_defaults(handler=hello)\n"
        "    return p\n"
    )
    info = tmp_path / "rc_plugin_example-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rc-plugin-example\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[runtime_cache.cli]\n"
        "hello = rc_plugin_example:add_parser\n"
        "ghost = no_such_plugin_module:add_parser\n"
        "demo = rc_plugin_example:add_parser\n"  # the project's own name: ignored
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins()["hello"] == "rc_plugin_example:add_parser"
    assert plugins()["demo"] == "runtime_cache.demo.cli:add_parser"
    assert main(["hello", "--times", "2"]) == 42
    captured = capsys.readouterr()
    assert "hello hello" in captured.out
    assert "plug-in 'ghost' not loaded" in captured.err  # a broken plug-in costs only itself
    assert main(["demo", "--help"]) == 0
    assert "first inference" in capsys.readouterr().out


def test_installed_script_runs_in_a_subprocess(cache: rc.Cache, root: Path) -> None:
    keys = fill(cache, 3)
    script = shutil.which("runtime-cache")
    assert script is not None, "the runtime-cache console script is not installed"
    proc = subprocess.run(
        [script, "--cache", f"dir://{root}", "ls", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(e["key"] for e in json.loads(proc.stdout)["entries"]) == sorted(map(str, keys))
    proc = subprocess.run([script, "rm", "--cache", f"dir://{root}", "nothere"], timeout=120)
    assert proc.returncode == 1


def test_export_and_verify_do_not_count_as_uses(
    run: Run, cache: rc.Cache, root: Path, tmp_path: Path
) -> None:
    keys = fill(cache, 3)
    reader = rc.Cache(DirectoryBackend(root, max_size=None))
    assert reader.get(keys[0]) is not None
    reader.close()
    old = 1_700_000_000
    for k in keys:
        os.utime(entry_file(root, k), (old, old))
    before = {e["key"]: (e["hits"], e["last_access"]) for e in run.listing()}
    assert before[str(keys[0])] == (1, old)
    assert run("export", str(tmp_path / "b.rcb"))[0] == 0
    assert run("verify")[0] == 0
    assert {e["key"]: (e["hits"], e["last_access"]) for e in run.listing()} == before
    # A real use still counts.
    reader = rc.Cache(DirectoryBackend(root, max_size=None))
    assert reader.get(keys[1]) is not None
    reader.close()
    after = {e["key"]: e for e in run.listing()}
    assert after[str(keys[1])]["hits"] == 1 and after[str(keys[1])]["last_access"] > old


def test_progress_bar_only_on_a_terminal(
    run: Run, cache: rc.Cache, root: Path, tmp_path: Path
) -> None:
    fill(cache, 3)
    code, _, err = run("export", str(tmp_path / "quiet.rcb"))
    assert code == 0 and "\r" not in err and "[" not in err
    if sys.platform == "win32":
        return
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime_cache.cli",
            "--cache",
            f"dir://{root}",
            "export",
            str(tmp_path / "tty.rcb"),
        ],
        stderr=follower,
        stdout=subprocess.PIPE,
        timeout=60,
    )
    os.close(follower)
    drawn = os.read(leader, 4096).decode()
    os.close(leader)
    assert proc.returncode == 0
    assert "export [" in drawn and "3/3" in drawn


def test_rm_with_an_ambiguous_prefix_removes_nothing(run: Run, cache: rc.Cache) -> None:
    keys = fill(cache, 40)
    digits = [str(k).rsplit("/", 1)[-1][0] for k in keys]
    shared = next(d for d in digits if digits.count(d) > 1)
    code, _, err = run("rm", str(keys[0]), shared)
    assert code == 2 and "matches" in err
    assert len(run.listing()) == 40


def test_export_to_stdout_piped_into_import_from_stdin(
    cache: rc.Cache, root: Path, tmp_path: Path
) -> None:
    keys = fill(cache, 4)
    other = tmp_path / "other"
    cli = [sys.executable, "-m", "runtime_cache.cli"]
    exporter = subprocess.Popen(
        [*cli, "--cache", f"dir://{root}", "export", "-"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    importer = subprocess.run(
        [*cli, "--cache", f"dir://{other}", "import", "-", "--json"],
        stdin=exporter.stdout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert exporter.stdout is not None and exporter.stderr is not None
    exporter.stdout.close()
    assert exporter.wait(timeout=120) == 0
    with exporter.stderr:
        assert b"exported 4 entries" in exporter.stderr.read()
    assert importer.returncode == 0, importer.stderr
    assert json.loads(importer.stdout)["accepted"] == 4
    copy = rc.Cache(DirectoryBackend(other))
    assert all(copy.get(k) == cache.get(k) for k in keys)
    copy.close()


def test_an_unsigned_bundle_is_refused_at_its_header_with_a_secret(
    cache: rc.Cache, tmp_path: Path
) -> None:
    """The attacker review of session 40: with a secret set, `curl ... | runtime-cache
    import -` read a whole unsigned bundle (up to its 4 GiB cap, about three times that in
    memory) before refusing it. Its header says it is unsigned: refused there, and the
    rest of the stream is never waited for."""
    fill(cache, 2)
    head = cache.dumps()[:20]  # the header and the first entry's length, then nothing
    importer = subprocess.Popen(
        [
            *(sys.executable, "-m", "runtime_cache.cli", "--cache", f"dir://{tmp_path / 'o'}"),
            *("--secret", "a-fleet-secret-of-16+", "import", "-", "--json"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    assert importer.stdin is not None
    importer.stdin.write(head)
    importer.stdin.flush()  # and kept open: a reader of the whole stream would wait
    try:
        assert importer.wait(timeout=60) == 1  # (stdin still open)
    finally:
        importer.kill()
        out, _ = importer.communicate()
    assert "not signed, and a secret is set" in json.loads(out)["error"]
    assert not (tmp_path / "o").exists()


def test_import_counts_a_repeated_key_apart(
    capsys: pytest.CaptureFixture[str], cache: rc.Cache, tmp_path: Path
) -> None:
    """The attacker review of session 40: a bundle holding one key twice, imported into an
    empty cache, said "kept 1 entry already in the cache"."""
    from runtime_cache.codec import encode_bundle

    keys = fill(cache, 2)
    blobs = [cache.backend.peek(str(k)) for k in keys]
    cache.put(keys[0], b"the same key, another value")
    again = cache.backend.peek(str(keys[0]))
    assert all(isinstance(b, bytes) for b in (*blobs, again))
    bundle = tmp_path / "twice.rcb"
    bundle.write_bytes(encode_bundle([*blobs, again]))  # type: ignore[list-item]
    other = Run(capsys, f"dir://{tmp_path / 'other'}")
    report = other.json("import", str(bundle))
    assert (report["accepted"], report["repeated_keys"], report["kept_existing"]) == (2, 1, 0)
    code, out, _ = other("import", str(bundle), "--keep-existing")
    assert code == 0 and "kept 2 entries already in the cache" in out
    assert "1 entry of the bundle repeated a key" in out
    assert rc.Cache(DirectoryBackend(tmp_path / "other")).get(keys[0]) == cache.get(keys[0])
    # A refused copy is no repeat (the re-attack review: it hid the entry kept).
    secret = "a-fleet-secret-of-16+"
    signed = rc.Cache(DirectoryBackend(tmp_path / "signed"), secret=secret)
    for k in keys:
        signed.put(k, b"signed value")
    good = [signed.backend.peek(str(k)) for k in keys]
    assert all(isinstance(b, bytes) for b in good)
    forged = bytearray(good[0])  # type: ignore[arg-type]
    forged[-1] ^= 1  # its signature's last byte
    bundle.write_bytes(encode_bundle([good[0], bytes(forged), good[1]], secret=secret.encode()))  # type: ignore[list-item]
    third = rc.Cache(DirectoryBackend(tmp_path / "third"), secret=secret)
    third.put(keys[1], b"signed value")
    third.close()
    capsys.readouterr()
    url = f"dir://{tmp_path / 'third'}"
    argv = ["--cache", url, "--secret", secret, "import", str(bundle), "--keep-existing"]
    assert main([*argv, "--json"]) == 1  # (one refused)
    report = json.loads(capsys.readouterr().out)
    counts = ("accepted", "rejected_signature", "repeated_keys", "kept_existing")
    assert tuple(report[name] for name in counts) == (1, 1, 0, 1), report


def test_import_says_why_native_code_was_not_written(
    capsys: pytest.CaptureFixture[str], run: Run, cache: rc.Cache, tmp_path: Path
) -> None:
    """An unsigned bundle's driver-cache entry, imported into a private folder, was
    reported as "unsigned entries to a shared store"."""
    fill(cache, 3)
    cache.put(rc.make_key(module_id="m", runtime="opencl", purpose="driver-cache"), b"\x7fELF")
    bundle = tmp_path / "b.rcb"
    assert run("export", str(bundle))[0] == 0
    other = Run(capsys, f"dir://{tmp_path / 'other'}")
    code, out, _ = other("import", str(bundle))
    assert code == 1
    assert "imported 3 of 4" in out and "entries read had no signature to check" in out
    assert "1 unsigned entries that hold native code" in out and "shared store" not in out
    # A signed bundle read without a secret was called unsigned too (the new-user review).
    signed = tmp_path / "signed.rcb"
    assert run("--secret", "s" * 16, "export", "--sign", str(signed))[0] == 0
    code, out, _ = Run(capsys, f"dir://{tmp_path / 'third'}")("import", str(signed))
    assert code == 1 and "the bundle is signed, but no secret was given to check it" in out
    assert "1 unchecked entries that hold native code" in out and "unsigned" not in out


def test_export_sign_vouches_for_a_private_caches_unsigned_entries(
    capsys: pytest.CaptureFixture[str], run: Run, cache: rc.Cache, tmp_path: Path
) -> None:
    """With a secret, an unsigned cache's entries were all left out ("corrupt: entry is not
    signed, and a secret is set"): a signed bundle could not be made from it."""
    keys = fill(cache, 3)
    bundle = tmp_path / "signed.rcb"
    code, _, err = run("--secret", "s3cret", "export", str(bundle))
    assert code == 1 and "rejected: entry is not signed" in err
    # Said as it is, with the way out (it said "skipped 3 entries as corrupt or unreadable").
    assert "skipped 3 entries that carry no signature" in err and "corrupt" not in err
    assert "`export --sign` signs them" in err
    code, out, err = run("--secret", "s3cret", "export", "--sign", str(bundle), "--json")
    assert code == 0, err
    assert json.loads(out)["entries"] == 3 and json.loads(out)["signed"]
    shared = tmp_path / "team"
    shared.mkdir(mode=0o700)
    team = Run(capsys, f"dir://{shared}?shared=1")
    code, out, err = team("--secret", "s3cret", "import", str(bundle))
    assert code == 0, (out, err)
    signed = rc.Cache(rc.open_backend(f"dir://{shared}?shared=1"), secret="s3cret")
    assert [signed.get(k) for k in keys] == [cache.get(k) for k in keys]
    # Its checks still hold: a bundle signed so reads under no other secret.
    other = rc.Cache(rc.open_backend(f"dir://{shared}?shared=1"), secret="other")
    assert other.get(keys[0]) is None
    # --sign needs a secret, and never signs a shared store's entries.
    assert run("export", "--sign", str(bundle))[0] == 2
    code, _, err = team("--secret", "s3cret", "export", "--sign", str(bundle))
    assert code == 2 and "shared store" in err


def test_output_cut_short_exits_quietly_with_sigpipes_code(cache: rc.Cache, root: Path) -> None:
    """A closed pipe made any command exit 0, a failing one too (`clear -y 2>&1 | head -3`
    on a read-only cache: 1 1 0 1 1 over five runs)."""
    fill(cache, 50)
    command = [sys.executable, "-m", "runtime_cache.cli", "--cache", f"dir://{root}", "ls"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first line
    err = process.stderr.read()
    assert process.wait(timeout=60) == 141
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_export_with_a_filter_that_matches_nothing_keeps_the_file(
    run: Run, cache: rc.Cache, tmp_path: Path
) -> None:
    """The new-user review: a typo in a filter replaced the bundle with an empty one, and
    said "exported 0 entries", exit 0."""
    fill(cache, 3)
    bundle = tmp_path / "kernels.rcb"
    assert run("export", str(bundle))[0] == 0
    before = bundle.read_bytes()
    code, _, err = run("export", str(bundle), "--runtime", "nosuch")
    assert code == 1 and "no entry matches --runtime nosuch" in err and "not written" in err
    assert bundle.read_bytes() == before
    assert run("export", str(tmp_path / "all.rcb"), "--runtime", "opencl")[0] == 0
