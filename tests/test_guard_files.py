"""The crash guard's folder under attack and on a full disk: nothing planted there hangs,
crashes or writes through, and a full disk leaves the guard off, never a dead process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import fill, holding, tmpfs
from runtime_cache.opencl.guard import LoadGuard
from runtime_cache.opencl.guard_files import append_lines, dead_marks, reserve
from runtime_cache.opencl.known_list import MAX_LIST_BYTES, read_lines

D1, D2 = "a" * 32, "b" * 32


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "guard"
    folder.mkdir(mode=0o700)
    return folder


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], stdout=-1)
    return int(done.stdout)


def _in_child(folder: Path, code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh process whose guard folder is ``folder``."""
    env = {**os.environ, "RUNTIME_CACHE_GUARD_DIR": str(folder)}
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        env=env,
        cwd=folder.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_under_the_guards_names_never_block(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    os.mkfifo(folder / f"{_dead_pid()}.loading")
    os.mkfifo(folder / "blocklist")
    os.mkfifo(folder / "suspect")
    os.mkfifo(folder / "vetted")
    (folder / f"{_dead_pid()}.loading").write_text(f"{D1}\n")  # a dead process's marks
    done = _in_child(
        folder,
        "from runtime_cache.opencl.guard import guard\n"
        f"print(guard.standing([], [{D1!r}]), guard.recovered)\n"
        f"with guard.loading([{D2!r}]): pass\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["struck", "1"]  # unrecorded: held back, in memory
    assert (folder / "blocklist").is_fifo() and (folder / "suspect").is_fifo()  # not written


def test_links_planted_under_the_guards_names_are_never_followed(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    secret = tmp_path / "secret"
    secret.write_text("root:hash:1:2\n")
    dead = _dead_pid()
    (folder / "blocklist").symlink_to(victim)
    (folder / f"{dead}.loading").symlink_to(secret)
    (folder / f"{_dead_pid()}.loading").write_text(f"{D1}\n")
    done = _in_child(
        folder,
        "import os\n"
        "from runtime_cache.opencl.guard import guard\n"
        "mine = os.path.join(guard.folder, f'{os.getpid()}.loading')  # an old-style name\n"
        f"os.symlink({str(victim)!r}, mine)\n"
        f"with guard.loading([{D2!r}]): pass\n"
        f"guard.block([{D2!r}]); guard.unblock([{D2!r}])\n",
    )
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n" and secret.read_text() == "root:hash:1:2\n"
    files = [p for p in folder.iterdir() if p.is_file() and not p.is_symlink()]
    assert "root:hash" not in "".join(p.read_text() for p in files)


def test_odd_names_and_huge_files_are_skipped(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for name in ("2147483648", "99999999999999999999", "\u00b2", "-1", "12a"):
        (folder / f"{name}.loading").write_text(f"{D1}\n")
    with open(folder / "vetted", "wb") as handle:  # sparse: no disk, a huge size
        handle.truncate(MAX_LIST_BYTES * 256)
    guard = LoadGuard(str(folder))
    try:
        assert guard.standing([D2], [D1]) == "unknown"
        assert guard.recovered == 0
        with guard.loading([D2]):
            (mine,) = folder.glob(f"{os.getpid()}.*.loading")
            assert mine.read_bytes().startswith(D2.encode())
    finally:
        guard.close()
    assert read_lines(str(folder / "vetted")) == []


def test_a_list_past_its_limit_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "list"
    path.write_text(f"{D1}\n" * 40)
    assert read_lines(str(path)) == [D1] * 40
    assert read_lines(str(path), limit=33 * 40 - 1) == []


def test_dead_marks_takes_only_gone_processes_files(tmp_path: Path) -> None:
    dead = _dead_pid()
    (tmp_path / f"{dead}.loading").write_text(f"{D1}\n\0\0\0")  # old-style: by its pid
    (tmp_path / f"{os.getpid()}.loading").write_text(f"{D2}\n")  # this pid: can't tell
    (tmp_path / f"{os.getpid()}.0badf00d.loading").write_text("cccc\n")  # unlocked: gone
    (tmp_path / f".{dead}.12345678.new").write_text("")  # half-made, nobody holds it
    os.utime(tmp_path / f".{dead}.12345678.new", (1, 1))  # (long ago)
    (tmp_path / f".{dead}.87654321.new").write_text("")  # being made: its maker locks it next
    names = os.listdir(tmp_path)
    assert sorted(dead_marks(str(tmp_path), names, lambda pid: pid != dead)) == sorted([D1, "cccc"])
    assert sorted(os.listdir(tmp_path)) == [f".{dead}.87654321.new", f"{os.getpid()}.loading"]


def test_a_dead_process_marks_stay_until_the_blocklist_holds_them(tmp_path: Path) -> None:
    """The second review: the marks were removed before the blocklist was written, so a
    failed write (a full disk, a quota) lost the evidence of the crash for good."""
    dead = _dead_pid()
    (tmp_path / f"{dead}.loading").write_text(f"{D1}\n")
    names = os.listdir(tmp_path)
    alive = lambda pid: pid != dead  # noqa: E731
    assert dead_marks(str(tmp_path), names, alive, keep=lambda found: False) == [D1]
    assert (tmp_path / f"{dead}.loading").exists()  # kept for the next process
    seen: list[list[str]] = []
    assert dead_marks(str(tmp_path), names, alive, keep=lambda f: seen.append(f) or True) == [D1]
    assert seen == [[D1]] and not (tmp_path / f"{dead}.loading").exists()


def test_a_guard_that_cannot_write_the_suspect_list_leaves_the_marks(tmp_path: Path) -> None:
    dead = _dead_pid()
    (tmp_path / f"{dead}.loading").write_text(f"{D1}\n")
    os.mkdir(tmp_path / "suspect")  # no list can be written there
    first = LoadGuard(str(tmp_path))
    try:
        assert first.held_back([D1])  # in this process all the same (struck: unrecorded)
    finally:
        first.close()
    assert (tmp_path / f"{dead}.loading").exists()
    os.rmdir(tmp_path / "suspect")
    second = LoadGuard(str(tmp_path))
    try:
        assert second.suspected([D1]) and second.recovered == 1
    finally:
        second.close()
    assert not (tmp_path / f"{dead}.loading").exists()
    assert read_lines(str(tmp_path / "suspect")) == [D1]


def test_bytes_outside_ascii_in_the_guards_lists_are_left_out_never_raised(
    tmp_path: Path,
) -> None:
    """The attacker review: a dead process's mark file or the blocklist holding a byte
    outside ASCII (a damaged file, or one planted) made every later process's first load
    raise ``UnicodeEncodeError`` while the guard wrote the lists again."""
    dead = _dead_pid()
    (tmp_path / f"{dead}.loading").write_bytes(f"{D1}\n".encode() + b"ab\xe9cd\n")
    (tmp_path / "blocklist").write_bytes(f"{D2}\n".encode() + b"garbl\xe9d\n")
    guard = LoadGuard(str(tmp_path))
    try:
        assert guard.suspected([D1]) and guard.blocked([D2]) and guard.recovered == 1
        guard.block([D1])
        guard.unblock([D2])  # writes the blocklist anew from what it holds
        guard.block(["c" * 32])  # and appends to it
    finally:
        guard.close()
    assert not (tmp_path / f"{dead}.loading").exists()
    assert read_lines(str(tmp_path / "blocklist")) == [D1, "c" * 32]


def test_unblocking_keeps_what_other_processes_blocked_since(tmp_path: Path) -> None:
    """The second review: unblock wrote the blocklist anew from this process's own copy,
    taken at its start, and so wiped digests other processes had blocked since."""
    one, two = LoadGuard(str(tmp_path)), LoadGuard(str(tmp_path))
    try:
        one.block([D1])
        assert two.blocked([D1])  # two starts now: its copy holds D1
        one.block([D2])
        two.unblock([D1])
        fresh = LoadGuard(str(tmp_path))
        try:
            assert fresh.blocked([D2]) and not fresh.blocked([D1])
        finally:
            fresh.close()
    finally:
        one.close()
        two.close()


_APPEND_LATE = """
import sys
from runtime_cache.opencl.guard_files import append_lines
print(append_lines(sys.argv[1], [sys.argv[2]], 10_000), flush=True)
"""


def test_an_append_waits_for_a_rewrite_and_is_never_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second review: an append between a rewrite's read and its rename was lost."""
    from runtime_cache.opencl import guard_files

    path = tmp_path / "blocklist"
    append_lines(str(path), [D1], 10_000)
    real_read = guard_files.read_lines
    started: list[subprocess.Popen[str]] = []

    def read_then_let_another_append(where: str, *args: object) -> list[str]:
        lines = real_read(where)
        command = [sys.executable, "-c", _APPEND_LATE, str(path), D2]
        started.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        time.sleep(0.3)  # the other process tries to append meanwhile
        return lines

    monkeypatch.setattr(guard_files, "read_lines", read_then_let_another_append)
    assert guard_files.rewrite_lines(str(path), lambda old: [*old, "c" * 32])
    out, _ = started[0].communicate(timeout=30)
    assert out.strip() == "True"
    assert sorted(real_read(str(path))) == sorted([D1, "c" * 32, D2])


def test_append_lines_writes_only_to_a_regular_file(tmp_path: Path) -> None:
    path = tmp_path / "blocklist"
    append_lines(str(path), [D1], 10)
    append_lines(str(path), [D2], 10)
    assert read_lines(str(path)) == [D1, D2]
    append_lines(str(path), [f"{i:032x}" for i in range(20)], 10)  # past the limit: halved
    assert read_lines(str(path)) == [f"{i:032x}" for i in range(15, 20)]
    os.unlink(path)
    os.mkdir(path)  # not a file: nothing written, nothing raised
    append_lines(str(path), [D1], 10)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="needs POSIX owners")
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o2770])
def test_a_guard_folder_others_can_write_is_not_used(tmp_path: Path, mode: int) -> None:
    """Its group too (the attacker review): a member planted a mark file naming a good
    shared binary, which the next process blocklisted and evicted, or truncated a table
    the process had mapped (SIGBUS)."""
    folder = _folder(tmp_path)
    folder.chmod(mode)
    guard = LoadGuard(str(folder))
    try:
        assert guard.standing([D1], []) == "unknown"
        assert guard._fd is None and not list(folder.iterdir())
    finally:
        guard.close()
    folder.chmod(0o700)
    mine = LoadGuard(str(folder))
    try:
        mine.standing([D1], [])
        assert mine._fd is not None
    finally:
        mine.close()


def test_a_full_disk_leaves_the_guard_unmapped_not_the_process_dead(tmp_path: Path) -> None:
    """A write into a mapped page that has no disk block behind it kills the process
    with SIGBUS; the guard reserves the page first, and goes without a map if it can't."""
    with tmpfs(tmp_path / f"full-{uuid.uuid4().hex[:6]}", "64k") as where:
        (where / "guard").mkdir(mode=0o700)
        fill(where)
        done = _in_child(
            where / "guard",
            "from runtime_cache.opencl.guard import guard\n"
            f"with guard.loading([{D1!r}]): print('loading')\n"
            "print('mapped' if guard._map is not None else 'not mapped')\n",
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["loading", "not", "mapped"]


def test_a_read_only_guard_folder_falls_back_to_a_private_one(tmp_path: Path) -> None:
    """The default folder on a read-only mount: the guard went silently off (no mark file,
    nothing known, a load crash repeated at every start); now it uses the private temporary
    folder, as for a read-only home, and says so."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a read-only folder")
    state = tmp_path / "state"
    state.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(state)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:  # the folder is there (it lists), and the mount is then made read-only
        (state / "runtime-cache" / "opencl-guard").mkdir(parents=True, mode=0o700)
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        code = (
            "from runtime_cache.opencl.guard import guard\n"
            f"with guard.loading([{D1!r}]): print(guard._fd is not None, guard.folder)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "RUNTIME_CACHE_GUARD_DIR"}
        run = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "XDG_STATE_HOME": str(state), "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        held, folder = run.stdout.split()
        assert held == "True" and folder.startswith(str(tmp_path / "runtime-cache-"))
        assert "cannot be written" in run.stderr
    finally:
        subprocess.run(["umount", "-l", str(state)])


def test_a_relative_guard_folder_is_fixed_at_the_start(tmp_path: Path) -> None:
    """RUNTIME_CACHE_GUARD_DIR=guard turned the guard off (makedirs of ''), and ./guard
    moved with a chdir into an unchecked folder."""
    (tmp_path / "elsewhere").mkdir()
    code = (  # the chdir comes before the guard's first use (the review of the first fix)
        "import os\n"
        "from runtime_cache.opencl.guard import guard\n"
        "from runtime_cache.opencl.detached_store import runs_folder\n"
        "os.chdir('elsewhere')\n"
        "print(runs_folder())\n"
        f"with guard.loading([{D1!r}]): print(guard._fd is not None, guard.folder)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={
            **os.environ,
            "RUNTIME_CACHE_GUARD_DIR": "guard",
            "RUNTIME_CACHE_OPENCL_DETACHED_DIR": "runs",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    runs, held, used = run.stdout.split()
    assert used == str(tmp_path / "guard") and held == "True"
    assert runs == str(tmp_path / "runs")
    assert not (tmp_path / "elsewhere" / "guard").exists()


def test_reserve_says_whether_the_disk_gave_the_space(tmp_path: Path) -> None:
    with open(tmp_path / "file", "wb") as handle:
        assert reserve(handle.fileno(), 4096) or not hasattr(os, "posix_fallocate")
        assert os.fstat(handle.fileno()).st_size >= 4096 or not hasattr(os, "posix_fallocate")


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="needs flock")
def test_a_mark_file_whose_lock_is_held_is_a_live_process(tmp_path: Path) -> None:
    """Another pid namespace (a container) or host sharing the folder: its pid means nothing
    here, but its lock on its mark file does. Held: left alone; released (it died): taken."""
    folder = _folder(tmp_path)
    name = f"{_dead_pid()}.loading"  # no such process here
    script = (
        "import fcntl, os, time\n"
        f"fd = os.open({str(folder / name)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        f"os.write(fd, b'{D1}\\n'); fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(600)\n"
    )
    with holding([sys.executable, "-c", script]):
        live = LoadGuard(str(folder))
        assert not live.suspected([D1]) and (folder / name).exists()
        live.close()
    after = LoadGuard(str(folder))
    try:
        assert after.suspected([D1]) and not (folder / name).exists()
    finally:
        after.close()


def test_a_set_aside_binary_is_vetted_again_after_a_day(tmp_path: Path) -> None:
    """A binary whose trial launches failed is set aside under its key; a transient cause (a
    busy machine's watchdog, the out-of-memory killer) set a good binary aside for good, on a
    store this process cannot rewrite (the third review). Marks now last a day."""
    import time

    from runtime_cache.opencl.guard import SET_ASIDE, SET_ASIDE_SECONDS, UNKNOWN

    folder = _folder(tmp_path)
    guard = LoadGuard(str(folder))
    guard.set_aside([D1])
    assert guard.standing([D1], []) == SET_ASIDE and guard.standing([D2], []) == UNKNOWN
    assert LoadGuard(str(folder)).standing([D1], []) == SET_ASIDE  # another process
    (stamp,) = read_lines(str(folder / "set-aside"))
    assert stamp.startswith(f"{D1}@")
    old = int(time.time() - SET_ASIDE_SECONDS - 60)
    (folder / "set-aside").write_text(f"{D1}@{old}\n{D2}\n")  # and an unstamped line
    assert LoadGuard(str(folder)).standing([D1], []) == UNKNOWN
    assert LoadGuard(str(folder)).standing([D2], []) == UNKNOWN
    # Set aside by a clock a year ahead, it lasted for ever; 5,000 digits raised ValueError.
    ahead = int(time.time() + 365 * 86400)
    (folder / "set-aside").write_text(f"{D1}@{ahead}\n{D2}@{'9' * 5000}\n")
    assert LoadGuard(str(folder)).standing([D1, D2], []) == UNKNOWN
    guard.close()


@pytest.mark.parametrize("name", ["blocklist", "vetted"])
def test_a_line_cut_short_never_swallows_the_next_one(tmp_path: Path, name: str) -> None:
    """The third review: a list whose last line was cut short (a full disk, a killed
    writer, a truncation) had the next digest appended onto that part-line, so a binary
    blocked since read back as not blocked (and a vetted one as unknown)."""
    folder = _folder(tmp_path)
    (folder / name).write_text(f"{D1}\n{D2[:10]}")
    guard = LoadGuard(str(folder))
    try:
        if name == "blocklist":
            guard.block(["c" * 32])
        else:
            guard.vouch(["c" * 32])
    finally:
        guard.close()
    assert read_lines(str(folder / name)) == [D1, D2[:10], "c" * 32]
    fresh = LoadGuard(str(folder))
    try:
        assert fresh.blocked(["c" * 32]) == (name == "blocklist")
        assert fresh.known(["c" * 32]) == (name == "vetted")
    finally:
        fresh.close()


def test_a_load_sees_what_another_process_blocklisted_since(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-87: ``blocked()``, asked before each load, never read the blocklist again,
    so a binary another process blocklisted after this one looked still loaded here. It
    now looks again once ``BLOCKLIST_LOOK_SECONDS`` have passed."""
    from runtime_cache.opencl import guard as guard_code

    one, two = LoadGuard(str(tmp_path)), LoadGuard(str(tmp_path))
    try:
        assert not two.blocked([D1])  # two has read the lists
        one.block([D1])
        monkeypatch.setattr(guard_code, "BLOCKLIST_LOOK_SECONDS", 60.0)
        assert not two.blocked([D1])  # it looked a moment ago
        monkeypatch.setattr(guard_code, "BLOCKLIST_LOOK_SECONDS", 0.0)
        assert two.blocked([D1]) and two.standing([], [D1]) == guard_code.BLOCKED
    finally:
        one.close()
        two.close()
