"""Where export writes a file it is given (cli.output_path): links followed only where
nobody else can have put them, at every hop, with each folder held open so that nothing
is swapped between the check and the write."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime_cache.cli.output import replace_file
from runtime_cache.cli.output_path import find_output

OTHER = 12345  # another user's uid: its links are never followed

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: it plants another user's links"
)


def _planted(link: Path, target: Path | str) -> Path:
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)
    return link


def test_a_link_of_this_users_is_followed_and_so_is_the_next(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "a.rcb").symlink_to("b.rcb")  # relative, two hops, through ".."
    (tmp_path / "b.rcb").symlink_to("real/../real/c.rcb")
    replace_file(str(tmp_path / "a.rcb"), b"data")
    assert (tmp_path / "real" / "c.rcb").read_bytes() == b"data"
    assert (tmp_path / "a.rcb").is_symlink() and (tmp_path / "b.rcb").is_symlink()
    replace_file(str(tmp_path / "a.rcb"), b"again")  # the file it leads to is replaced
    assert (tmp_path / "real" / "c.rcb").read_bytes() == b"again"


def test_a_loop_of_links_and_a_folder_are_errors_not_hangs(tmp_path: Path) -> None:
    (tmp_path / "x").symlink_to("y")
    (tmp_path / "y").symlink_to("x")
    with pytest.raises(OSError) as loop:
        replace_file(str(tmp_path / "x"), b"data")
    assert loop.value.errno == errno.ELOOP
    for path in (str(tmp_path), f"{tmp_path}/", f"{tmp_path}/..", f"{tmp_path}/new/"):
        with pytest.raises(IsADirectoryError):
            replace_file(path, b"data")
    with pytest.raises(FileNotFoundError):
        replace_file(str(tmp_path / "missing" / "b.rcb"), b"data")
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_bytes(b"")
        replace_file(str(tmp_path / "file" / "b.rcb"), b"data")


@needs_root
def test_a_planted_link_at_the_second_hop_is_not_followed(tmp_path: Path) -> None:
    """The fourth review: only the first link was checked; the rest were followed by the
    kernel, so this user's own link into a group's folder reached a member's link."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o2775)  # a group's folder
    _planted(shared / "x.rcb", victim)
    (tmp_path / "out.rcb").symlink_to(shared / "x.rcb")
    replace_file(str(tmp_path / "out.rcb"), b"data")
    assert victim.read_text() == "the user's own file"
    assert (shared / "x.rcb").read_bytes() == b"data"  # the planted link was replaced
    # A planted link on the way (not the last name) is an error, never followed.
    (tmp_path / "safe").mkdir()
    _planted(shared / "sub", tmp_path / "safe")
    (tmp_path / "via.rcb").symlink_to(shared / "sub" / "y.rcb")
    with pytest.raises(PermissionError, match="another user"):
        replace_file(str(tmp_path / "via.rcb"), b"data")
    assert not (tmp_path / "safe" / "y.rcb").exists()


_EXCHANGE = 2  # RENAME_EXCHANGE


@needs_root
def test_a_folder_swapped_during_the_write_never_redirects_it(tmp_path: Path) -> None:
    """The fourth review: a member who can write the parent of the user's folder swapped
    it (renameat2 RENAME_EXCHANGE) with a folder of theirs between the check and the
    write, and the export overwrote a file of the user's after 21-219 tries."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this C library")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    parent = tmp_path / "parent"
    parent.mkdir()
    parent.chmod(0o777)  # a member can rename what is in it
    ours, theirs = parent / "ours", parent / "theirs"
    ours.mkdir()
    (ours / "out.rcb").symlink_to("real.rcb")  # this user's own link: followed
    (ours / "real.rcb").write_bytes(b"")
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    _planted(theirs / "out.rcb", victim)
    a, b = bytes(ours), bytes(theirs)
    if libc.renameat2(-100, a, -100, b, _EXCHANGE) != 0:
        pytest.skip(f"renameat2 failed: {os.strerror(ctypes.get_errno())}")
    libc.renameat2(-100, a, -100, b, _EXCHANGE)
    stop, hold, wrote = threading.Event(), threading.Lock(), 0

    def swap() -> None:
        while not stop.is_set():
            with hold:
                libc.renameat2(-100, a, -100, b, _EXCHANGE)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            try:
                replace_file(str(ours / "out.rcb"), b"data")
                wrote += 1
            except OSError:
                pass  # (a name gone for a moment, mid-swap)
            with hold:  # the member plants the link again where it was replaced
                for folder in (ours, theirs):
                    link = folder / "out.rcb"
                    if not (folder / "real.rcb").exists() and not link.is_symlink():
                        link.unlink()
                        _planted(link, victim)
            assert victim.read_text() == "the user's own file"
    finally:
        stop.set()
        swapper.join()
    assert wrote > 20


def test_dev_stdout_and_dev_fd_reach_the_pipe_or_file_the_shell_gave(tmp_path: Path) -> None:
    """Links under /proc (where /dev/stdout leads) are followed by the kernel alone: their
    targets are no paths (pipe:[...]). A file opened with >> is appended to."""
    code = (
        "import sys; from runtime_cache.cli.output import replace_file; "
        "replace_file(sys.argv[1], b'data\\n')"
    )
    for path in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        piped = subprocess.run([sys.executable, "-c", code, path], capture_output=True)
        assert piped.returncode == 0 and piped.stdout == b"data\n", piped.stderr
        log = tmp_path / "log"
        log.write_bytes(b"before\n")
        with open(log, "ab") as appended:
            done = subprocess.run([sys.executable, "-c", code, path], stdout=appended)
        assert done.returncode == 0 and log.read_bytes() == b"before\ndata\n"


def test_a_fifo_of_this_users_is_written_into(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    replace_file(str(fifo), b"data")
    assert reader.communicate(timeout=30)[0] == b"data"
    output = find_output(str(tmp_path / "new.rcb"))
    try:
        assert output.fd is None and output.name == "new.rcb"
    finally:
        output.close()
