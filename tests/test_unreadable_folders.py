"""Folders a ``dir://`` listing leaves out, and says so: a folder that cannot be read,
another cache's folder inside this one; and ``/``, which is no cache folder.

A folder this user cannot read (``chmod 000``, another user's, an I/O error) hides the
entries in it. It was skipped without a word: ``ls`` and ``verify`` said all was well,
and ``clear`` said "removed 9 entries" (or "the cache is empty") while entries stayed.
Each command now names the folder, says what it shows is partial, and exits 1.

A cache opened one folder too high (``dir:///srv/cache`` for ``.../cache/app``) saw the
inner cache's entries as stored under other keys: ``verify`` called them bad and advised
``--repair``, which removed them all, and a prune took them first.

Root reads any folder, so as root the commands run in a child without the capabilities
that let it (``setpriv``), as an ordinary user would; otherwise in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.errors import InvalidURLError

KEYS = [f"app/{group}/k{i}" for group in ("open", "shut") for i in range(3)]
AS_USER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def half_shut(tmp_path: Path) -> Iterator[Path]:
    """A cache of six entries, three of them in a folder nobody may read."""
    if ROOT and shutil.which("setpriv") is None:
        pytest.skip("as root, needs setpriv to run without its read-any-file capability")
    root = tmp_path / "cache"
    backend = DirectoryBackend(root)
    for key in KEYS:
        backend.set(key, key.encode())
    backend.close()
    shut = root / "app" / "shut"
    shut.chmod(0)
    yield root
    shut.chmod(0o700)


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [*(AS_USER if ROOT else []), sys.executable, *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_backend_names_the_folder_it_could_not_read(half_shut: Path, tmp_path: Path) -> None:
    script = (
        "import json, sys\n"
        "from runtime_cache.backends.directory import DirectoryBackend\n"
        "b = DirectoryBackend(sys.argv[1])\n"
        "print(json.dumps([sorted(b.keys()), b.unlisted_folders]))\n"
    )
    done = _run("-c", script, str(half_shut), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    keys, unlisted = json.loads(done.stdout)
    assert keys == [k for k in KEYS if "/open/" in k]
    assert [folder for folder, _ in unlisted] == ["app/shut"]
    assert "app/shut left out of the listing" in done.stderr  # a warning for an app that lists


@pytest.mark.parametrize("command", [["ls"], ["verify"], ["stats"], ["clear", "--yes"]])
def test_a_command_over_an_unreadable_folder_says_it_is_partial_and_exits_1(
    half_shut: Path, tmp_path: Path, command: list[str]
) -> None:
    done = _run("-m", "runtime_cache", "--cache", f"dir://{half_shut}", *command, cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "folder app/shut left out (Permission denied)" in done.stderr
    assert "partial" in done.stderr and "Traceback" not in done.stderr
    half_shut.joinpath("app", "shut").chmod(0o700)
    assert sorted(DirectoryBackend(half_shut).keys()) == (
        [k for k in KEYS if "/shut/" in k] if command[0] == "clear" else KEYS
    )


@pytest.mark.parametrize(
    "command", [["ls"], ["verify", "--repair"], ["prune", "--max-size", "1B"], ["stats"]]
)
def test_a_cache_opened_one_folder_too_high_leaves_the_inner_cache_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    inner = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'cache' / 'app'}"))
    device = {"vendor": "Acme", "name": "GPU", "driver": "1"}
    keys = [
        rc.make_key(module_id="m", runtime="opencl", purpose="program-binary", device=device, k=i)
        for i in range(5)
    ]
    for key in keys:
        inner.put(key, b"binary")
    capsys.readouterr()
    assert main(["--cache", f"dir://{tmp_path / 'cache'}", *command]) == 1
    err = capsys.readouterr().err
    assert "folder app left out (the folder of another cache)" in err
    assert all(inner.get(key) == b"binary" for key in keys)


def test_the_file_systems_root_is_no_cache_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dir://$UNSET``: ``ls`` walked the whole file system and left a mark in ``/``."""
    with pytest.raises(InvalidURLError, match="root"):
        DirectoryBackend("/")
    assert main(["--cache", "dir:///", "ls"]) == 2
    assert "file system's root" in capsys.readouterr().err
    from runtime_cache.provider import reset_cache_provider

    monkeypatch.setenv("RUNTIME_CACHE", "dir:///")
    reset_cache_provider()
    try:
        assert not rc.get_cache().enabled  # an app runs on, with caching off (logged)
    finally:
        monkeypatch.delenv("RUNTIME_CACHE")
        reset_cache_provider()


def test_a_planted_mark_in_a_shared_cache_hides_nothing(tmp_path: Path) -> None:
    """In a store a group writes, any member could make any folder look like another
    cache's: its entries would leave eviction, listing and upkeep (the review's case: 2,051
    files under max_files=100, none listed). There the rule is off."""
    root = tmp_path / "team"
    backend = DirectoryBackend(root, max_size=None, max_files=20, shared=True)
    for i in range(5):
        backend.set(f"app/v/k{i}", b"x")
    (root / "app" / ".vacuumed").touch()  # what another member plants
    assert len(list(backend.keys())) == 5 and backend.unlisted_folders == []
    for i in range(5, 60):
        backend.set(f"app/v/k{i}", b"x")
    assert len(list(backend.keys())) <= 20  # the cap still holds


def test_a_prefix_inside_an_inner_cache_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folders above where a prefix starts are looked at too: ``rm`` of an inner
    cache's key through the outer one removed it."""
    inner = DirectoryBackend(tmp_path / "outer" / "app")
    inner.set("opencl/program-binary/k1", b"binary")
    inner.close()
    outer = DirectoryBackend(tmp_path / "outer")
    assert list(outer.keys("app/opencl/")) == []
    assert outer.unlisted_folders == [("app", "the folder of another cache")]
    capsys.readouterr()
    main(["--cache", f"dir://{tmp_path / 'outer'}", "rm", "app/opencl/program-binary/k1"])
    assert DirectoryBackend(tmp_path / "outer" / "app").get("opencl/program-binary/k1") == (
        b"binary"
    )
