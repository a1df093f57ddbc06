"""The crash guard's known list: a short log and a sorted table searched in place."""

from __future__ import annotations

import errno
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from runtime_cache.opencl import known_list
from runtime_cache.opencl.guard import LoadGuard, binding
from runtime_cache.opencl.known_list import LOG, TABLE, KnownList


def _marks(count: int, salt: str = "") -> list[str]:
    return [binding(f"key-{salt}{i}", f"digest-{i}") for i in range(count)]


def _limits(monkeypatch: pytest.MonkeyPatch, log: int, cap: int | None = None) -> None:
    """Merge the log past ``log`` lines, and keep at most ``cap`` marks (small, for tests)."""
    monkeypatch.setattr(known_list, "LOG_LIMIT", log)
    if cap is not None:
        monkeypatch.setattr(known_list, "MAX_KNOWN", cap)


def _table_is_whole_and_sorted(folder: Path) -> list[str]:
    data = (folder / TABLE).read_bytes()
    assert len(data) % 33 == 0
    lines = data.decode("ascii").split("\n")[:-1]
    assert all(len(line) == 32 for line in lines)
    assert lines == sorted(set(lines))
    return lines


def test_marks_written_by_one_list_are_known_to_the_next(tmp_path: Path) -> None:
    first = KnownList(str(tmp_path))
    marks = _marks(10)
    assert first.add(marks) == marks
    assert first.add(marks) == []  # already known
    first.write(marks)
    again = KnownList(str(tmp_path))
    assert all(m in again for m in marks)
    assert _marks(1, salt="other")[0] not in again
    assert not (tmp_path / TABLE).exists()  # a short log stays a log


def test_a_long_log_is_merged_into_the_table_and_nothing_is_read_up_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _limits(monkeypatch, log=50)
    writer = KnownList(str(tmp_path))
    marks = _marks(120)
    for start in range(0, 120, 10):
        writer.write(writer.add(marks[start : start + 10]))
    table = _table_is_whole_and_sorted(tmp_path)
    assert (tmp_path / TABLE).stat().st_mode & 0o077 == 0  # private, as the guard's files
    log = (tmp_path / LOG).read_bytes().split() if (tmp_path / LOG).exists() else []
    assert len(log) <= 50 and set(table) | {m.decode() for m in log} == set(marks)
    reader = KnownList(str(tmp_path))
    assert len(reader._recent) == len(log)  # the table is searched, not read
    assert all(m in reader for m in marks)
    assert all(m not in reader for m in _marks(50, salt="other"))


def test_an_old_long_log_is_merged_by_the_first_process_that_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _limits(monkeypatch, log=50)
    marks = _marks(200)
    (tmp_path / LOG).write_text("".join(f"{m}\n" for m in marks))
    first = KnownList(str(tmp_path))
    assert not (tmp_path / LOG).exists() and len(first._recent) == 0
    assert _table_is_whole_and_sorted(tmp_path) == sorted(marks)
    assert all(m in KnownList(str(tmp_path)) for m in marks)


def test_the_table_keeps_at_most_max_known_marks_and_all_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _limits(monkeypatch, log=20, cap=100)
    writer = KnownList(str(tmp_path))
    marks = _marks(400)
    for start in range(0, 400, 25):
        writer.write(writer.add(marks[start : start + 25]))
    assert len(_table_is_whole_and_sorted(tmp_path)) <= 100
    reader = KnownList(str(tmp_path))
    assert all(m in reader for m in marks[-25:])  # the last batch merged is all there


@pytest.mark.parametrize(
    "damage",
    [b"not a table", os.urandom(33 * 40), b"z" * 32 + b"\n" + b"a" * 32 + b"\n"],
    ids=["short", "random-bytes", "unsorted"],
)
def test_a_damaged_table_only_makes_lookups_miss_and_the_next_merge_rewrites_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: bytes
) -> None:
    _limits(monkeypatch, log=5)
    (tmp_path / TABLE).write_bytes(damage)
    lists = KnownList(str(tmp_path))
    assert _marks(1, salt="x")[0] not in lists
    marks = _marks(12)
    lists.write(lists.add(marks))
    _table_is_whole_and_sorted(tmp_path)
    assert all(m in KnownList(str(tmp_path)) for m in marks)


def test_a_huge_table_is_not_read_and_a_failed_merge_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _limits(monkeypatch, log=5, cap=10)
    (tmp_path / TABLE).write_bytes((b"f" * 32 + b"\n") * 40)  # past twice the cap
    lists = KnownList(str(tmp_path))
    marks = _marks(8)
    lists.write(lists.add(marks))
    assert _table_is_whole_and_sorted(tmp_path) == sorted(marks)  # rewritten without it

    real_fdopen = os.fdopen

    def no_space(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode:
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fdopen(fd, mode, *args, **kwargs)

    monkeypatch.setattr(known_list.os, "fdopen", no_space)
    more = _marks(8, salt="more")
    lists.write(lists.add(more))  # the log is written; its merge fails
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".tmp", ".merging"))]
    assert _table_is_whole_and_sorted(tmp_path) == sorted(marks)  # the good table is kept
    assert all(m in lists for m in more)  # still known in this process


def test_a_planted_fifo_or_symlink_never_blocks_or_is_followed(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / TABLE)
    os.mkfifo(tmp_path / LOG)
    lists = KnownList(str(tmp_path))  # would block forever if either were opened plainly
    marks = _marks(3)
    lists.write(lists.add(marks))  # the FIFO log takes nothing, and nothing hangs
    assert all(m in lists for m in marks)  # known in this process all the same
    other = tmp_path / "elsewhere"
    other.write_text("".join(f"{m}\n" for m in _marks(3, salt="s")))
    os.unlink(tmp_path / LOG)
    os.symlink(other, tmp_path / LOG)
    assert all(m not in KnownList(str(tmp_path)) for m in _marks(3, salt="s"))


def _add_many(folder: str, salt: str) -> None:
    known_list.LOG_LIMIT = 40
    lists = KnownList(folder)
    marks = _marks(300, salt=salt)
    for start in range(0, 300, 5):
        lists.write(lists.add(marks[start : start + 5]))


def test_processes_merging_at_once_leave_a_whole_sorted_table(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_add_many, args=(str(tmp_path), s)) for s in "abcd"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    _table_is_whole_and_sorted(tmp_path)
    reader = KnownList(str(tmp_path))
    every = [m for s in "abcd" for m in _marks(300, salt=s)]
    found = sum(m in reader for m in every)
    assert found == len(every)  # a write that raced a merge was written again
    assert all(m not in reader for m in _marks(100, salt="never"))


def test_a_write_that_a_merge_read_past_is_written_again_though_the_inode_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full-suite run lost 5 of 1,200 marks in the test above. A merge renamed the log away
    after a writer opened it, read it before the write, and removed it after the writer
    closed it; the next log took the freed inode number (ext4 gives it back at once), so the
    writer, asking after the close, took the new log for the one it wrote. It asks while the
    file is open now."""
    log, taken = tmp_path / LOG, tmp_path / "merging"
    lists = KnownList(str(tmp_path))
    lists.write(lists.add(_marks(2, salt="first")))
    real_write, real_close = os.write, os.close
    merged: list[str] = []
    state = {"fd": -1}

    def write(fd: int, data: bytes) -> int:
        if state["fd"] == -1 and os.path.samestat(os.fstat(fd), os.stat(log)):
            state["fd"] = fd
            os.rename(log, taken)  # a merge takes the log, and reads it before this write
            merged.extend(known_list.read_lines(str(taken)))
        return real_write(fd, data)

    def close(fd: int) -> None:
        real_close(fd)
        if fd == state["fd"]:
            state["fd"] = -2
            os.unlink(taken)  # the merge is done with it
            log.touch()  # the next writer's log, most likely on the freed inode

    monkeypatch.setattr(known_list.os, "write", write)
    monkeypatch.setattr(known_list.os, "close", close)
    marks = _marks(3, salt="raced")
    lists.write(lists.add(marks))
    monkeypatch.undo()
    assert not any(m in merged for m in marks)  # the merge never saw them
    assert all(m in KnownList(str(tmp_path)) for m in marks)  # written again, to the new log


def test_a_merge_never_waits_long_for_a_lock_held_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import time

    _limits(monkeypatch, log=5)
    monkeypatch.setattr(known_list, "LOCK_WAIT", 0.2)
    holder = os.open(tmp_path / "vetted.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a stopped process that holds the lock
    try:
        lists = KnownList(str(tmp_path))
        marks = _marks(12)
        started = time.monotonic()
        lists.write(lists.add(marks))
        assert time.monotonic() - started < 5
        assert not (tmp_path / TABLE).exists()  # no merge: the log keeps the marks
        assert all(m in KnownList(str(tmp_path)) for m in marks)
    finally:
        os.close(holder)
    lists.write(lists.add(_marks(3, salt="later")))  # the next write merges
    assert len(_table_is_whole_and_sorted(tmp_path)) == 15


def test_the_guard_knows_marks_from_the_table_and_a_blocked_one_never(tmp_path: Path) -> None:
    marks = _marks(600)
    (tmp_path / TABLE).write_bytes("".join(f"{m}\n" for m in sorted(marks)).encode())
    guard = LoadGuard(str(tmp_path))
    assert guard.known(marks[:3]) and guard.known(marks[-1:])
    assert not guard.known([*marks[:2], _marks(1, salt="new")[0]])
    guard.block([marks[0]])
    assert not guard.known(marks[:1])
    guard.vouch([marks[0]])  # the driver made it after all: off the blocklist, known
    assert guard.known(marks[:1])
    guard.close()


def test_standing_answers_blocked_known_and_unknown_in_one_look_up(tmp_path: Path) -> None:
    from runtime_cache.opencl.guard import BLOCKED, KNOWN, UNKNOWN

    marks = _marks(3)
    guard = LoadGuard(str(tmp_path))
    guard.vouch(marks[:2])
    assert guard.standing(marks[:2], ["d0", "d1"]) == KNOWN
    assert guard.standing(marks, ["d0", "d1", "d2"]) == UNKNOWN  # one of three not known
    guard.block(["d1"])  # a known binary whose bytes later killed a process: blocked wins
    assert guard.standing(marks[:2], ["d0", "d1"]) == BLOCKED
    assert guard.standing(marks[:1], ["d0"]) == KNOWN
    guard.close()


def test_what_another_process_adds_since_is_read_before_a_binary_is_vetted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third review: the lists were read once, at a guard's start, so processes of
    one machine vetted each other's binaries. Another guard stands for another process."""
    from runtime_cache.opencl.guard import BLOCKED, KNOWN, SET_ASIDE, UNKNOWN

    _limits(monkeypatch, log=8)
    marks = _marks(20)
    here, there = LoadGuard(str(tmp_path)), LoadGuard(str(tmp_path))
    try:
        assert here.standing(marks[:1], ["d0"]) == UNKNOWN  # started: the lists are read
        there.vouch(marks[:1])
        assert here.standing(marks[:1], ["d0"]) == KNOWN  # a line of the log since
        for mark in marks[1:]:  # past the log's limit: merged into a new table
            there.vouch([mark])
        assert (tmp_path / TABLE).exists()
        assert here.standing(marks, [f"d{i}" for i in range(20)]) == KNOWN
        there.block(["d3"])  # (a binary known here is not looked up again: no stat)
        assert here.standing(_marks(1, salt="blocked"), ["d3"]) == BLOCKED
        other = _marks(1, salt="aside")
        there.set_aside(other)
        assert here.standing(other, ["e0"]) == SET_ASIDE
        # A line still being written (no newline yet) is read once it is whole.
        late = _marks(1, salt="late")[0]
        with open(tmp_path / LOG, "a") as log:
            log.write(late[:20])
        assert here.standing([late], ["f0"]) == UNKNOWN
        with open(tmp_path / LOG, "a") as log:
            log.write(late[20:] + "\n")
        assert here.standing([late], ["f0"]) == KNOWN
    finally:
        here.close()
        there.close()


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="needs POSIX owners")
def test_lists_are_read_again_only_from_the_folder_checked_at_the_start(tmp_path: Path) -> None:
    """The fourth review: a user who could write the folder above the guard's swapped in
    a folder of lists of their own after a process started, and its next look loaded an
    unknown binary unvetted (or evicted a good entry by a planted blocklist)."""
    from runtime_cache.opencl.guard import KNOWN, UNKNOWN

    marks = _marks(2)
    parent = tmp_path / "team"
    parent.mkdir(mode=0o700)
    folder = parent / "guard"
    here = LoadGuard(str(folder))
    try:
        assert here.standing(marks[:1], ["d0"]) == UNKNOWN  # started: the lists are read
        folder.rename(parent / "moved")  # the swap
        folder.mkdir(mode=0o700)
        (folder / LOG).write_text(f"{marks[0]}\n")
        assert here.standing(marks[:1], ["d0"]) == UNKNOWN  # not the folder it checked
        (parent / "moved").rename(parent / "moved-again")
        folder.rename(parent / "planted")
        (parent / "moved-again").rename(folder)  # the checked folder, back in place
        with open(folder / LOG, "a") as log:
            log.write(f"{marks[0]}\n")
        assert here.standing(marks[:1], ["d0"]) == KNOWN  # read again: the same folder
    finally:
        here.close()
    # A folder above that others can write (no sticky bit): the lists are read once.
    os.chmod(parent, 0o777)
    try:
        here = LoadGuard(str(folder))
        assert here.standing(marks[1:], ["d1"]) == UNKNOWN
        with open(folder / LOG, "a") as log:
            log.write(f"{marks[1]}\n")
        assert here.standing(marks[1:], ["d1"]) == UNKNOWN
        here.close()
    finally:
        os.chmod(parent, 0o700)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="needs POSIX owners")
def test_a_swapped_folder_is_not_taken_up_through_a_merge_or_from_further_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fifth review: with a folder above that others can write, a swapped-in folder's
    long log was merged by the victim's own next vouch and its table mapped (an unknown
    binary known, no race needed); and only the folder's parent was checked, so a
    writable grandparent let the whole subtree be swapped."""
    from runtime_cache.opencl.guard import UNKNOWN

    _limits(monkeypatch, log=8)
    evil, mine = _marks(1, salt="evil")[0], _marks(12)
    top = tmp_path / "top"
    (top / "p").mkdir(parents=True, mode=0o700)
    folder = top / "p" / "guard"
    os.chmod(top, 0o777)  # the grandparent: others can move p, and the guard with it
    try:
        here = LoadGuard(str(folder))
        try:
            assert here.standing([evil], ["e"]) == UNKNOWN
            folder.rename(top / "p" / "moved")
            folder.mkdir(mode=0o700)  # the swapped-in folder, with a long log
            (folder / LOG).write_text("".join(f"{m}\n" for m in [*_marks(10, "x"), evil]))
            assert here.standing([evil], ["e"]) == UNKNOWN  # not read again
            here.vouch(mine)  # past the log's limit: this process merges it
            assert (folder / TABLE).exists()
            assert here.standing([evil], ["e"]) == UNKNOWN  # and does not take it up
            assert here.known(mine)  # its own marks stay known
        finally:
            here.close()
    finally:
        os.chmod(top, 0o700)
