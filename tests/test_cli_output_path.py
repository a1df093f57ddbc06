"""Where export writes a file it is given (cli.output_path): a link, FIFO or device used
only where nobody else can have put it (every folder from / down is this user's or
root's, closed to others), with each folder held open so that nothing is swapped between
the check and the write."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import system_users

from runtime_cache.cli.output import replace_file
from runtime_cache.cli.output_path import find_output

OTHER = 12345  # another user's uid: what it owns is never trusted

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: it gives files to another user"
)


def _planted(link: Path, target: Path | str) -> Path:
    link.symlink_to(target)
    os.lchown(link, OTHER, OTHER)
    return link


def _group_folder(path: Path, mode: int = 0o2775) -> Path:
    """A folder others can write: its group (another user's group, as root), or all."""
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, -1, OTHER)  # (root's own group has root alone: closed)
    else:
        mode |= 0o777  # this user's group may be theirs alone
    path.chmod(mode)
    return path


def test_this_users_links_are_followed_where_only_they_can_write(closed_folder: Path) -> None:
    top = closed_folder
    (top / "real").mkdir()
    (top / "a.rcb").symlink_to("b.rcb")  # relative, two hops, through ".."
    (top / "b.rcb").symlink_to("real/../real/c.rcb")
    replace_file(str(top / "a.rcb"), b"data")
    assert (top / "real" / "c.rcb").read_bytes() == b"data"
    assert (top / "a.rcb").is_symlink() and (top / "b.rcb").is_symlink()
    replace_file(str(top / "a.rcb"), b"again")  # the file it leads to is replaced
    assert (top / "real" / "c.rcb").read_bytes() == b"again"
    fifo = top / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    replace_file(str(fifo), b"data")
    assert reader.communicate(timeout=30)[0] == b"data"


def test_in_a_sticky_folder_links_are_replaced_and_fifos_refused(tmp_path: Path) -> None:
    """The attacker review of the first walk: a sticky folder (/tmp) counted as closed, but
    anyone can move an entry into it. A member moved the user's own link, left in a group
    folder, into /tmp under the name the user exported to: it was followed onto the
    user's file. A FIFO moved there hung the export."""
    sticky = _group_folder(tmp_path / "tmp", 0o1777)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    (sticky / "moved.rcb").symlink_to(victim)  # this user's own link, moved in
    replace_file(str(sticky / "moved.rcb"), b"data")
    assert victim.read_text() == "the user's own file"
    assert (sticky / "moved.rcb").read_bytes() == b"data"
    os.mkfifo(sticky / "pipe.rcb")
    with pytest.raises(PermissionError, match="another user may have put it"):
        replace_file(str(sticky / "pipe.rcb"), b"data")  # neither opened (a hang) nor replaced
    assert (sticky / "pipe.rcb").is_fifo()


def test_a_folder_of_this_users_moved_under_a_group_folder_is_not_trusted(
    tmp_path: Path,
) -> None:
    """The attacker review: a member renamed the user's own folder, holding the user's own
    link, to the name the user exported into; the walk asked only the link's own folder."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    group = _group_folder(tmp_path / "group")
    (group / "results").mkdir(mode=0o755)  # this user's, closed: only its parent is open
    (group / "results" / "cache.rcb").symlink_to(victim)
    replace_file(str(group / "results" / "cache.rcb"), b"data")
    assert victim.read_text() == "the user's own file"


def test_loops_folders_and_odd_names_are_errors_not_hangs(
    tmp_path: Path, closed_folder: Path
) -> None:
    (closed_folder / "x").symlink_to("y")
    (closed_folder / "y").symlink_to("x")
    with pytest.raises(OSError) as loop:
        replace_file(str(closed_folder / "x"), b"data")
    assert loop.value.errno == errno.ELOOP
    (tmp_path / "file").write_bytes(b"keep")
    for path in (
        tmp_path,
        f"{tmp_path}/",
        f"{tmp_path}/..",
        f"{tmp_path}/new/",
        f"{tmp_path}/file/.",
    ):
        with pytest.raises(IsADirectoryError):
            replace_file(str(path), b"data")
    assert (tmp_path / "file").read_bytes() == b"keep"
    with pytest.raises(FileNotFoundError):
        replace_file(str(tmp_path / "missing" / "b.rcb"), b"data")
    with pytest.raises(NotADirectoryError):
        replace_file(str(tmp_path / "file" / "b.rcb"), b"data")
    long_name = "é" * 127  # 254 bytes: the temporary name must not be longer than 255
    replace_file(str(tmp_path / long_name), b"data")
    assert (tmp_path / long_name).read_bytes() == b"data"


def test_a_relative_path_is_judged_from_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group_folder(tmp_path / "group")
    victim = tmp_path / "victim.txt"
    victim.write_text("kept")
    (group / "out.rcb").symlink_to(victim)
    monkeypatch.chdir(group)  # "out.rcb" from inside a group's folder
    replace_file("out.rcb", b"data")
    assert victim.read_text() == "kept" and (group / "out.rcb").read_bytes() == b"data"
    output = find_output("new.rcb")
    try:
        assert output.fd is None and output.name == "new.rcb"
    finally:
        output.close()


@needs_root
def test_a_planted_link_at_the_second_hop_is_not_followed(closed_folder: Path) -> None:
    """The fourth review: only the first link was checked; the rest were followed by the
    kernel, so this user's own link into a group's folder reached a member's link."""
    top = closed_folder
    victim = top / "victim.txt"
    victim.write_text("the user's own file")
    shared = _group_folder(top / "shared")
    _planted(shared / "x.rcb", victim)
    (top / "out.rcb").symlink_to(shared / "x.rcb")
    replace_file(str(top / "out.rcb"), b"data")
    assert victim.read_text() == "the user's own file"
    assert (shared / "x.rcb").read_bytes() == b"data"  # the planted link was replaced
    # A planted link on the way (not the last name) is an error, never followed.
    (top / "safe").mkdir()
    _planted(shared / "sub", top / "safe")
    (top / "via.rcb").symlink_to(shared / "sub" / "y.rcb")
    with pytest.raises(PermissionError, match="another user"):
        replace_file(str(top / "via.rcb"), b"data")
    assert not (top / "safe" / "y.rcb").exists()


# A member's process: swaps two names (renameat2 RENAME_EXCHANGE) as fast as it can, and
# plants its link again in its own folder wherever an export replaced it.
SWAPPER = textwrap.dedent(
    """
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    a, b, victim, uid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    theirs = os.lstat(b).st_ino
    print("ready", flush=True)
    while True:
        libc.renameat2(-100, a.encode(), -100, b.encode(), 2)
        for side in (a, b) if victim else ():
            link = os.path.join(side, "out.rcb")
            try:
                if os.lstat(side).st_ino == theirs and not os.path.islink(link):
                    if os.path.lexists(link):
                        os.unlink(link)
                    os.symlink(victim, link)
                    os.lchown(link, uid, uid)
            except OSError:
                pass
    """
)


def _exports_while_swapped(a: Path, b: Path, target: Path, victim: Path, plant: bool = True) -> int:
    """Export to ``target`` for 3 s while another process swaps ``a`` and ``b`` (and, with
    ``plant``, plants its link to ``victim`` again); the victim must never change.
    Returns how many exports went through."""
    planted = str(victim) if plant else ""
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(a), str(b), planted, str(OTHER)],
        stdout=subprocess.PIPE,
    )
    wrote = 0
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"ready\n"
        before = victim.read_bytes()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                replace_file(str(target), b"data")
                wrote += 1
            except OSError:
                pass  # (a name gone for a moment, or the member's entry met: refused)
            assert victim.read_bytes() == before
    finally:
        swapper.kill()
        swapper.wait()
    return wrote


@needs_root
def test_names_swapped_during_the_write_never_redirect_it(tmp_path: Path) -> None:
    """The fourth review: a member who can write a folder above FILE swapped the user's
    folder (renameat2 RENAME_EXCHANGE) with one of theirs between the check and the
    write, and the export overwrote a file of the user's after 21-219 tries. The attacker
    review of the fix: a folder swapped with a link must not be followed either."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this C library")
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's own file")
    parent = _group_folder(tmp_path / "parent", 0o777)  # a member can rename what is in it
    ours, theirs = parent / "ours", parent / "theirs"
    ours.mkdir()
    (ours / "out.rcb").symlink_to("real.rcb")  # this user's own link
    (ours / "real.rcb").write_bytes(b"")
    theirs.mkdir()
    os.chown(theirs, OTHER, OTHER)
    _planted(theirs / "out.rcb", victim)
    if libc.renameat2(-100, bytes(ours), -100, bytes(theirs), 2) != 0:
        pytest.skip(f"renameat2 failed: {os.strerror(ctypes.get_errno())}")
    libc.renameat2(-100, bytes(ours), -100, bytes(theirs), 2)
    assert _exports_while_swapped(ours, theirs, ours / "out.rcb", victim) > 20
    # A folder on the way swapped with a member's link to a folder of the user's.
    private = tmp_path / "private"
    private.mkdir()
    secret = private / "secret"
    secret.write_text("the user's own file")
    (parent / "d").mkdir()
    _planted(parent / "e", private)
    assert _exports_while_swapped(
        parent / "d", parent / "e", parent / "d" / "secret", secret, False
    )


def test_dot_dot_goes_back_to_the_folder_held_not_to_a_moved_ones_parent(
    closed_folder: Path,
) -> None:
    """The attacker review of the walk: `G/sub/../../out.rcb` (meaning the user's own
    folder) went up through the parent of whatever was at G/sub by then; a member swapped
    G/sub with G/A/sub and the walk came back to G, took it for the user's folder, and
    followed the user's own link the member had moved to G/out.rcb (4,217 overwrites in
    16,569 exports)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("no renameat2 in this C library")
    top = closed_folder
    victim = top / "victim.txt"
    victim.write_text("the user's own file")
    group = _group_folder(top / "G")
    (group / "sub").mkdir()
    (group / "A" / "sub").mkdir(parents=True)
    (group / "out.rcb").symlink_to(victim)  # the user's own link, moved here by a member
    target = group / "sub" / ".." / ".." / "out.rcb"
    a, b = group / "sub", group / "A" / "sub"
    assert _exports_while_swapped(a, b, target, victim, plant=False) > 20
    assert (top / "out.rcb").read_bytes() == b"data"


def test_a_relative_path_from_a_closed_folder_under_an_open_one(
    closed_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged from /, not from the current folder: the user's own folder, closed, under a
    group's folder a member can rename it in."""
    victim = closed_folder / "victim.txt"
    victim.write_text("kept")
    mine = _group_folder(closed_folder / "group") / "mine"
    mine.mkdir(mode=0o755)
    (mine / "out.rcb").symlink_to(victim)
    monkeypatch.chdir(mine)
    replace_file("out.rcb", b"data")
    assert victim.read_text() == "kept" and (mine / "out.rcb").read_bytes() == b"data"
    gone = closed_folder / "gone"  # a current folder removed: nothing above it is known
    gone.mkdir()
    (closed_folder / "link.rcb").symlink_to(victim)
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert replace_file("../link.rcb", b"data")  # replaced, and says why
    assert victim.read_text() == "kept"


def test_a_folder_its_owners_private_group_can_write_is_closed(closed_folder: Path) -> None:
    """umask 002 with a group per user makes folders 0775: the user's own link there is
    followed (OpenSSH judges such a group so), where a group with others in it is not."""
    import grp
    import pwd

    me = pwd.getpwuid(os.geteuid())
    if grp.getgrgid(me.pw_gid).gr_mem not in ([], [me.pw_name]):
        pytest.skip(f"{me.pw_name}'s group has other members")
    upg = closed_folder / "upg"
    upg.mkdir()
    os.chown(upg, -1, me.pw_gid)
    upg.chmod(0o775)
    (upg / "link.rcb").symlink_to(closed_folder / "real.rcb")
    assert replace_file(str(upg / "link.rcb"), b"data") == ""
    assert (closed_folder / "real.rcb").read_bytes() == b"data"


@needs_root
def test_a_group_that_is_another_users_primary_one_is_not_private(closed_folder: Path) -> None:
    """The review of the private-group rule: a user whose primary group is the folder's,
    without being listed in it, could move the owner's link into it, and it was followed."""
    from runtime_cache.environment import group_of_one as _group_of_one

    if shutil.which("useradd") is None:
        pytest.skip("needs useradd")
    if not _group_of_one(0, 0):
        pytest.skip("root's group is not root's alone here")
    name = f"rc-upg-{os.getpid()}"
    system_users.add_user(name, "0", own_group=False)
    try:
        _group_of_one.cache_clear()
        upg = closed_folder / "upg"
        upg.mkdir()
        os.chown(upg, 0, 0)
        upg.chmod(0o775)
        (upg / "link.rcb").symlink_to(closed_folder / "real.rcb")
        assert "others can write" in replace_file(str(upg / "link.rcb"), b"data")
        assert not (closed_folder / "real.rcb").exists()  # replaced, not followed
    finally:
        system_users.remove([name], [])
        _group_of_one.cache_clear()


def test_a_path_thousands_of_folders_deep_is_walked(closed_folder: Path) -> None:
    """The review of the walk: one descriptor held per folder ran out at `ulimit -n`
    (1,024) on a path the kernel opens (here the limit is 256, the path 500 deep)."""
    import resource

    deep = closed_folder
    for _ in range(500):
        deep = deep / "a"
        deep.mkdir()
    (closed_folder / "real.rcb").write_bytes(b"")
    (deep / "link.rcb").symlink_to(closed_folder / "real.rcb")
    back = str(deep) + "/.." * 500 + "/up.rcb"  # 2,500 names: walked one by one
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, soft), hard))  # fewer than levels
    try:
        replace_file(str(deep / "link.rcb"), b"data")
        assert replace_file(back, b"up") == ""
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (closed_folder / "real.rcb").read_bytes() == b"data"  # the chain stayed closed
    assert (closed_folder / "up.rcb").read_bytes() == b"up"


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


def test_a_file_of_ones_own_in_a_folder_one_may_not_write_is_written_into(
    tmp_path: Path,
) -> None:
    """Session 42's closing note: ``show --raw FILE`` (and ``export FILE``) over a file of
    this user's in a folder this user may not write failed (no temporary file beside
    it), where a shell's ``>`` writes into it. It is written into, as ``>`` does; a hard
    link of it elsewhere is never written through."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, needs setpriv to run without its write-any-folder capability")
        as_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    shut = tmp_path / "shut"
    shut.mkdir()
    (shut / "out.bin").write_bytes(b"old contents, longer than the new")
    os.link(shut / "out.bin", tmp_path / "elsewhere")
    (shut / "mine.bin").write_bytes(b"old contents, longer than the new")
    shut.chmod(0o555)
    code = (
        "import sys; from runtime_cache.cli.output import replace_file; "
        "replace_file(sys.argv[1], b'new')"
    )
    try:
        done = subprocess.run(
            [*as_user, sys.executable, "-c", code, str(shut / "mine.bin")], capture_output=True
        )
        assert done.returncode == 0, done.stderr
        assert (shut / "mine.bin").read_bytes() == b"new"
        (shut / "mine.bin").chmod(0o200)  # its owner may write it, not read it (re-attack)
        again = subprocess.run(
            [*as_user, sys.executable, "-c", code, str(shut / "mine.bin")], capture_output=True
        )
        assert again.returncode == 0, again.stderr
        (shut / "mine.bin").chmod(0o600)
        linked = subprocess.run(
            [*as_user, sys.executable, "-c", code, str(shut / "out.bin")], capture_output=True
        )
        assert linked.returncode != 0 and b"PermissionError" in linked.stderr
        assert (tmp_path / "elsewhere").read_bytes() == b"old contents, longer than the new"
    finally:
        shut.chmod(0o755)


def test_a_full_disk_leaves_a_file_written_into_as_it_was(tmp_path: Path) -> None:
    """Re-attack of session 43: the in-place write cut the file first, so a full disk
    left it short (a user's bundle, 229,376 bytes of another). The room is taken first."""
    from conftest import fill, tmpfs

    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("as root, needs setpriv to run without its write-any-folder capability")
        as_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]
    with tmpfs(tmp_path / "disk", "1m") as disk:
        shut = disk / "shut"
        shut.mkdir()
        original = b"ORIGINAL " * 1000
        (shut / "out.bin").write_bytes(original)
        shut.chmod(0o555)
        filler = fill(disk, leave=64 << 10)
        code = (
            "import sys; from runtime_cache.cli.output import replace_file; "
            "replace_file(sys.argv[1], b'new' * 200_000)"
        )
        try:
            done = subprocess.run(
                [*as_user, sys.executable, "-c", code, str(shut / "out.bin")],
                capture_output=True,
            )
            assert done.returncode != 0 and b"No space left" in done.stderr, done.stderr
            assert (shut / "out.bin").read_bytes() == original
            filler.unlink()
            again = subprocess.run(
                [*as_user, sys.executable, "-c", code, str(shut / "out.bin")],
                capture_output=True,
            )
            assert again.returncode == 0, again.stderr
            assert (shut / "out.bin").read_bytes() == b"new" * 200_000
        finally:
            shut.chmod(0o755)
