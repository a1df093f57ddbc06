"""The temporary files that a writer killed mid-write leaves beside its output
(cli.output): the next write of the same name removes those of this user that no writer
holds (after ``UNHELD_TEMP_SECONDS``) or older than ``STALE_TEMP_SECONDS``, and nothing
else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime_cache.cli.output import STALE_TEMP_SECONDS, UNHELD_TEMP_SECONDS, replace_file

OTHER = 12345  # another user's uid

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: it gives a file to another user"
)

# A writer that stops for good just before its temporary file takes the name: where a
# `kill -9` during `export FILE` leaves it.
_STALLED_WRITER = """
import os, sys, time
from runtime_cache.cli.output import replace_file

def stall(*args, **kwargs):
    print("stalled", flush=True)
    time.sleep(600)

os.replace = stall
replace_file(sys.argv[1], b"half" * 1000)
"""


def _temps(folder: Path) -> list[Path]:
    return sorted(path for path in folder.iterdir() if path.name.endswith(".tmp"))


def _age(path: Path, seconds: float = STALE_TEMP_SECONDS + 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def _stalled_writer(target: Path) -> subprocess.Popen[bytes]:
    """A writer of ``target`` stopped just before its temporary file takes the name."""
    writer = subprocess.Popen(
        [sys.executable, "-I", "-c", _STALLED_WRITER, str(target)],
        stdout=subprocess.PIPE,
        cwd=target.parent,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"stalled\n"
    except BaseException:
        _kill(writer)
        raise
    return writer


def _kill(writer: subprocess.Popen[bytes]) -> None:
    writer.send_signal(signal.SIGKILL)
    writer.wait()


def test_a_killed_writers_temporary_file_is_removed_once_it_is_old(tmp_path: Path) -> None:
    target = tmp_path / "bundle.rcb"
    _kill(_stalled_writer(target))
    (left,) = _temps(tmp_path)
    assert left.name.startswith(".bundle.rcb.") and not target.exists()

    replace_file(str(target), b"one")  # young: it may be another writer's, still at work
    assert target.read_bytes() == b"one" and _temps(tmp_path) == [left]

    _age(left, UNHELD_TEMP_SECONDS + 1)  # and nobody holds it: its writer is gone
    replace_file(str(target), b"two")
    assert target.read_bytes() == b"two" and _temps(tmp_path) == []


def test_a_stalled_writers_temporary_file_is_kept_while_it_lives(tmp_path: Path) -> None:
    target = tmp_path / "bundle.rcb"
    writer = _stalled_writer(target)
    try:
        (held,) = _temps(tmp_path)
        _age(held, UNHELD_TEMP_SECONDS + 60)  # old, but its writer holds it still
        replace_file(str(target), b"one")
        assert _temps(tmp_path) == [held] and target.read_bytes() == b"one"
    finally:
        _kill(writer)
    replace_file(str(target), b"two")  # dead now: nobody holds it
    assert _temps(tmp_path) == []


def test_only_regular_files_of_ours_named_as_ours_are_removed(tmp_path: Path) -> None:
    name = "out.rcb"
    ours = tmp_path / f".{name}.0123456789ab.tmp"
    ours.write_bytes(b"x")
    other_name = tmp_path / ".other.rcb.0123456789ab.tmp"  # another output's
    other_name.write_bytes(b"x")
    not_hex = tmp_path / f".{name}.0123456789zz.tmp"
    not_hex.write_bytes(b"x")
    kept_file = tmp_path / "kept"
    kept_file.write_bytes(b"kept")
    link = tmp_path / f".{name}.aaaaaaaaaaaa.tmp"
    link.symlink_to(kept_file)
    folder = tmp_path / f".{name}.bbbbbbbbbbbb.tmp"
    folder.mkdir()
    fifo = tmp_path / f".{name}.cccccccccccc.tmp"
    os.mkfifo(fifo)
    for path in (ours, other_name, not_hex, link, folder, fifo):
        _age(path)

    replace_file(str(tmp_path / name), b"data")
    assert not ours.exists()
    assert other_name.exists() and not_hex.exists() and folder.is_dir()
    assert link.is_symlink() and kept_file.read_bytes() == b"kept"
    assert fifo.exists()


@needs_root
def test_another_users_temporary_file_is_left_alone(tmp_path: Path) -> None:
    theirs = tmp_path / ".out.rcb.0123456789ab.tmp"
    theirs.write_bytes(b"theirs")
    os.chown(theirs, OTHER, OTHER)
    _age(theirs)
    replace_file(str(tmp_path / "out.rcb"), b"data")
    assert theirs.read_bytes() == b"theirs"


def test_a_long_name_is_matched_by_its_first_32_characters(tmp_path: Path) -> None:
    name = "a-rather-long-bundle-name-for-the-fleet-2026-12.rcb"
    temp = tmp_path / f".{name[:32]}.00112233aabb.tmp"
    temp.write_bytes(b"x")
    _age(temp)
    replace_file(str(tmp_path / name), b"data")
    assert not temp.exists() and (tmp_path / name).read_bytes() == b"data"
