"""The crash guard's lists written anew (a trim, an unblock): a disk that takes only part of
the new list keeps the old one whole, a part-line is never read as an entry, and a
temporary file that a killed writer left is removed by a later process."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import fill, tmpfs
from runtime_cache.opencl import guard_files
from runtime_cache.opencl.guard import LoadGuard
from runtime_cache.opencl.guard_files import replace_lines, rewrite_lines
from runtime_cache.opencl.known_list import read_lines

D1, D2 = "a" * 32, "b" * 32
#: 300 blocked digests: 9,900 bytes of list, more than two pages.
MANY = [f"{i:032x}" for i in range(300)]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "guard"
    folder.mkdir(mode=0o700)
    return folder


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_a_rewrite_on_a_nearly_full_disk_keeps_the_old_list_whole(tmp_path: Path) -> None:
    """Operator review (t27): the new list was written with one ``os.write`` whose count
    was not checked, and the part a nearly full disk took was renamed into place: 175 of
    300 blocked digests were forgotten, and the last line was cut in two."""
    with tmpfs(tmp_path / f"full-{uuid.uuid4().hex[:6]}", "256k") as where:
        folder = _folder(where)
        (folder / "blocklist").write_text("".join(f"{d}\n" for d in MANY))
        (folder / "blocklist.lock").touch()
        guard = LoadGuard(str(folder))
        try:
            assert guard.blocked([MANY[299]])  # started: its mark file took its page
            filler = fill(where, leave=4096)  # room for one page of the new list
            assert os.statvfs(where).f_bavail * os.statvfs(where).f_frsize < 9_900
            guard.unblock([MANY[0]])  # written anew without MANY[0]: does not fit
            assert not rewrite_lines(str(folder / "blocklist"), lambda old: old[1:])
        finally:
            guard.close()
        assert read_lines(str(folder / "blocklist")) == MANY  # the old list, whole
        assert _temps(folder) == []  # and no part of the new one left beside it
        filler.unlink()
        fresh = LoadGuard(str(folder))
        try:
            assert all(fresh.blocked([d]) for d in MANY)  # MANY[0] too: not taken off
        finally:
            fresh.close()


def test_a_write_the_disk_cuts_short_is_never_renamed_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same short write without a full disk (no root needed): the disk takes half,
    then says it is full; the list stays as it was, and ``replace_lines`` says it failed."""
    path = tmp_path / "blocklist"
    path.write_text("".join(f"{d}\n" for d in MANY))
    real_write = os.write
    calls: list[int] = []

    def half_then_full(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data[: len(data) // 2]))

    with monkeypatch.context() as patch:
        patch.setattr(guard_files.os, "write", half_then_full)
        assert not replace_lines(str(path), MANY[1:])
    assert len(calls) == 2  # the rest was asked for, not taken as written
    assert read_lines(str(path)) == MANY
    assert _temps(tmp_path) == []
    # A disk that takes the list in parts (each write short, none failing) writes it all.
    parts: list[int] = []

    def in_parts(fd: int, data: bytes | memoryview) -> int:
        parts.append(len(data))
        return real_write(fd, bytes(data[:1000]))

    with monkeypatch.context() as patch:
        patch.setattr(guard_files.os, "write", in_parts)
        assert replace_lines(str(path), MANY[1:])
    assert len(parts) == 10 and read_lines(str(path)) == MANY[1:]


def test_a_part_line_at_the_end_of_a_list_is_no_entry(tmp_path: Path) -> None:
    """A list whose last line has no newline after it (cut short by a full disk or a killed
    writer) was read with that part-line as an entry."""
    folder = _folder(tmp_path)
    (folder / "blocklist").write_text(f"{D1}\n{D2[:10]}")
    (folder / "set-aside").write_text(f"{D2}@{int(time.time())}\n{D1}@1")
    assert read_lines(str(folder / "blocklist")) == [D1]
    assert read_lines(str(folder / "set-aside")) == [f"{D2}@{int(time.time())}"]
    (folder / "whole").write_text(f"{D1}\n{D2}\n")
    assert read_lines(str(folder / "whole")) == [D1, D2]
    (folder / "none").write_text(D1[:20])  # no whole line at all
    assert read_lines(str(folder / "none")) == []
    guard = LoadGuard(str(folder))
    try:
        assert guard.blocked([D1]) and not guard.blocked([D2[:10]])
        assert guard._blocked == {D1}
    finally:
        guard.close()


def _start(folder: Path) -> None:
    """Start a guard in ``folder`` (as a process's first load does), and close it."""
    guard = LoadGuard(str(folder))
    guard.blocked([])
    guard.close()


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_temporary_file_a_killed_rewrite_left_is_removed_later(tmp_path: Path) -> None:
    """Operator review (t26): a process killed during a blocklist rewrite (before its
    rename) left ``blocklist.<hex>.tmp`` in the guard folder for good. A later process
    removes such a file once it is a few minutes old, and only names of that pattern."""
    folder = _folder(tmp_path)
    (folder / "blocklist").write_text(f"{D1}\n{D2}\n")
    killed = (  # killed at the rename, as a SIGKILL mid-rewrite would
        "import os, signal\n"
        "from runtime_cache.opencl.guard import LoadGuard\n"
        f"guard = LoadGuard({str(folder)!r}); guard.blocked([])\n"
        "os.replace = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"guard.unblock([{D1!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", killed], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    (left,) = _temps(folder)
    assert left.startswith("blocklist.") and read_lines(str(folder / left)) == [D2]
    hexes = uuid.uuid4().hex[:12]
    others = {  # none of these is a leftover of ours: kept, however old
        f"blocklist.{hexes.upper()}.tmp",
        f"blocklist.{hexes}0.tmp",
        f"blocklist.{hexes[:11]}.tmp",
        f"vetted.{hexes}.tmp",
        f"blocklist.{hexes}.tmp.x",
        f"blocklist.{hexes}",
    }
    for name in [*others, f"set-aside.{hexes}.tmp"]:
        (folder / name).write_text(f"{D1}\n")
        _age(folder / name, 3600)
    young = f"blocklist.{uuid.uuid4().hex[:12]}.tmp"  # a live writer's, being written
    (folder / young).write_text(f"{D1}\n")
    _start(folder)  # the killed writer's is a moment old: kept, as a live writer's
    assert left in _temps(folder) and f"set-aside.{hexes}.tmp" not in _temps(folder)
    _age(folder / left, 600)
    _start(folder)
    names = {p.name for p in folder.iterdir()}
    assert left not in names and young in names and others <= names
    assert read_lines(str(folder / "blocklist")) == [D1, D2]  # the list as it was
