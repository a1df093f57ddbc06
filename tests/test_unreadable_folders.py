"""A folder of a ``dir://`` cache that cannot be read: the listing says it is partial.

A folder this user cannot read (``chmod 000``, another user's, an I/O error) hides the
entries in it. It was skipped without a word: ``ls`` and ``verify`` said all was well,
and ``clear`` said "removed 9 entries" (or "the cache is empty") while entries stayed.
Each command now names the folder, says what it shows is partial, and exits 1.

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

from runtime_cache.backends.directory import DirectoryBackend

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
    assert "could not be read" in done.stderr  # a warning for an app that lists


@pytest.mark.parametrize("command", [["ls"], ["verify"], ["stats"], ["clear", "--yes"]])
def test_a_command_over_an_unreadable_folder_says_it_is_partial_and_exits_1(
    half_shut: Path, tmp_path: Path, command: list[str]
) -> None:
    done = _run("-m", "runtime_cache", "--cache", f"dir://{half_shut}", *command, cwd=tmp_path)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "could not read folder app/shut" in done.stderr
    assert "partial" in done.stderr and "Traceback" not in done.stderr
    half_shut.joinpath("app", "shut").chmod(0o700)
    assert sorted(DirectoryBackend(half_shut).keys()) == (
        [k for k in KEYS if "/shut/" in k] if command[0] == "clear" else KEYS
    )
