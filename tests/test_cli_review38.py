"""The command line as the session-38 new-user and operator review found it.

Each test names what the reviewer ran and what it did before.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RUNTIME_CACHE", "RUNTIME_CACHE_SECRET", "RUNTIME_CACHE_SECRET_FILE"):
        monkeypatch.delenv(name, raising=False)


def _bundle(tmp_path: Path) -> Path:
    source = f"dir://{tmp_path / 'source'}"
    rc.Cache(rc.open_backend(source)).put(
        rc.make_key(module_id="m", runtime="r", purpose="p"), b"value"
    )
    bundle = tmp_path / "b.rcb"
    assert main(["--cache", source, "export", str(bundle)]) == 0
    return bundle


def test_a_tier_that_cannot_be_opened_is_said_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--cache "memory://,dir:///etc/passwd" ls` said "no entries", exit 0, and `import`
    "imported 1 of 1" into the memory tier alone; the tier left out was said only with -v."""
    bundle = _bundle(tmp_path)
    capsys.readouterr()
    url = f"memory://,dir://{tmp_path / 'b.rcb'}"  # a file, not a folder
    assert main(["--cache", url, "ls"]) == 1
    err = capsys.readouterr().err
    assert "could not be opened" in err and "left out" in err and "b.rcb" in err
    assert main(["--cache", url, "import", str(bundle)]) == 1
    assert "could not be opened" in capsys.readouterr().err


def test_import_reads_its_bundle_before_making_the_cache_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing bundle made the cache folder (and its parents) before it was found missing."""
    target = tmp_path / "made" / "deep"
    assert main(["--cache", f"dir://{target}", "import", str(tmp_path / "absent.rcb")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert not (tmp_path / "made").exists()
    bundle = _bundle(tmp_path)
    assert main(["--cache", f"dir://{target}", "import", str(bundle)]) == 0
    assert target.is_dir()


def test_import_into_memory_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--cache memory:// import x.rcb` said "imported 1 of 1" and kept nothing."""
    bundle = _bundle(tmp_path)
    capsys.readouterr()
    assert main(["--cache", "memory://", "import", str(bundle)]) == 1
    assert "memory://" in capsys.readouterr().err


def test_secret_and_secret_file_together_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file won, silently: a right file and a wrong --secret verified 0 bad."""
    key_file = tmp_path / "key"
    key_file.write_text("a-long-enough-secret-key\n")
    url = f"dir://{tmp_path / 'c'}"
    assert main(["--cache", url, "--secret", "x", "--secret-file", str(key_file), "ls"]) == 2
    assert "not both" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_ls_says_when_verify_repair_removes_unsigned_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The footer said "verify --repair deletes them" of a cache filled without a secret,
    whose entries --repair keeps."""
    folder = tmp_path / "c"
    rc.Cache(DirectoryBackend(folder)).put(
        rc.make_key(module_id="m", runtime="r", purpose="p"), b"v"
    )
    assert main(["--cache", f"dir://{folder}", "--secret", "s" * 20, "ls"]) == 0
    out = capsys.readouterr().out
    assert "where some entry verifies with this secret" in out
    assert main(["--cache", f"dir://{folder}", "--secret", "s" * 20, "verify", "--repair"]) == 1
    assert len(list(folder.rglob("*.rce"))) == 1  # kept: nothing verifies with this secret
    assert os.path.isdir(folder)


def test_a_wrong_url_from_the_environment_says_where_it_came_from(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`RUNTIME_CACHE=garbage runtime-cache ls` said "not a backend URL ... 'garbage'", as if
    typed on the line; and a dir:// `max_files=-1` was "not a size" with byte examples."""
    monkeypatch.setenv("RUNTIME_CACHE", "garbage")
    assert main(["ls"]) == 2
    assert "RUNTIME_CACHE: not a backend URL" in capsys.readouterr().err
    monkeypatch.delenv("RUNTIME_CACHE")
    assert main(["--cache", "dir:///tmp/nowhere-s38?max_files=-1", "ls"]) == 2
    assert "max_files is a count of files" in capsys.readouterr().err


def test_the_demo_stops_at_once_on_a_store_it_cannot_reach(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`demo --tiny` with a Redis that refuses connections warned twice ("could not be
    listed"), compiled, and failed after 5.4 s; now one error before any run."""
    import socket
    import time

    pytest.importorskip("pyopencl")
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    code = main(["--cache", f"redis://127.0.0.1:{port}/0?insecure=1", "demo", "--tiny"])
    err = capsys.readouterr().err
    assert code != 0 and "warning" not in err and "Connection refused" in err, err
    assert time.monotonic() - started < 30  # (no compiling: it took 5.4 s, two runs' worth)


def test_a_reading_command_writes_nothing_in_a_folder_that_is_no_cache(tmp_path: Path) -> None:
    """Session 38's review, left then: `ls` on a folder that is no cache (a checkout) left a
    vacuum's marker (`.vacuumed`) there; the vacuum ran as the folder was opened. Reading
    commands open it without the vacuum now, and main() puts the setting back after."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    (folder / "README").write_text("not a cache\n")
    url = f"dir://{folder}"
    for command in (["ls"], ["stats"], ["verify"], ["export", str(tmp_path / "out.rcb")]):
        assert main(["--cache", url, *command]) == (1 if command[0] == "export" else 0)
        assert sorted(p.name for p in folder.iterdir()) == ["README"], command
    assert not (tmp_path / "out.rcb").exists()  # no entry to export: no empty bundle
    assert main(["--cache", url, "import", str(_bundle(tmp_path))]) == 0  # writes: vacuums
    assert (folder / ".vacuumed").exists()


def test_reading_only_is_this_threads_and_put_back(tmp_path: Path) -> None:
    """The re-attack of session 39: the first form, a class attribute saved and put back by
    main(), stayed off for good when two threads of one process ran reading commands that
    overlapped, and turned the vacuum off for the process's other threads meanwhile. It is a
    context variable now: this thread's, and reset when main() returns."""
    import threading

    from runtime_cache.api import READING_ONLY

    url = f"dir://{tmp_path / 'cache'}"
    assert main(["--cache", url, "import", str(_bundle(tmp_path))]) == 0
    seen: list[bool] = []
    started, release = threading.Event(), threading.Event()

    def other_thread() -> None:
        started.set()
        release.wait(10)
        seen.append(READING_ONLY.get())

    helper = threading.Thread(target=other_thread)
    helper.start()
    started.wait(10)
    token = READING_ONLY.set(True)  # as main() sets it for a reading command
    release.set()
    helper.join(10)
    READING_ONLY.reset(token)
    assert seen == [False]  # another thread still vacuums what it opens
    for command in (["ls"], ["stats"]):
        assert main(["--cache", url, *command]) == 0
        assert READING_ONLY.get() is False


def test_an_export_whose_entries_were_all_left_out_writes_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Session 39's new-user review: `--secret S export k.rcb` over a cache of unsigned
    entries left out every entry, exited 1, and wrote an empty bundle (52 bytes) over the
    file, which could then be shipped. The file is left as it was now."""
    source = f"dir://{tmp_path / 'source'}"
    rc.Cache(rc.open_backend(source)).put(
        rc.make_key(module_id="m", runtime="r", purpose="p"), b"value"
    )
    bundle = tmp_path / "k.rcb"
    bundle.write_bytes(b"the bundle shipped last time")
    assert main(["--secret", "s" * 32, "--cache", source, "export", str(bundle)]) == 1
    captured = capsys.readouterr()
    assert "not written" in captured.out and "--sign" in captured.err + captured.out
    assert bundle.read_bytes() == b"the bundle shipped last time"
    assert main(["--secret", "s" * 32, "--cache", source, "export", str(bundle), "--sign"]) == 0
    assert bundle.read_bytes() != b"the bundle shipped last time"
