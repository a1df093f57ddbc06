"""Real users and groups for the multi-user tests (root only), and the sweep of those that a
killed run left behind.

Each user a test makes carries the comment ``runtime-cache test pid=N`` (N: the pytest
process). A run killed by SIGKILL skips its teardown and leaves them in /etc/passwd; the
next run, at its start, removes every such user whose process is gone, and the groups
named alongside it (``runtime-cache test pid=N group=NAME``). A name a test is about to
make that a dead run left (the tags are the pid, and pids come round) is removed first.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess

MARK = "runtime-cache test pid="


def _run(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, timeout=60, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(comment: str) -> tuple[int, str] | None:
    """The pid and group named by a test user's comment, or None for anyone else's user."""
    if not comment.startswith(MARK):
        return None
    pid, _, group = comment[len(MARK) :].partition(" group=")
    return (int(pid), group) if pid.isdigit() else None


def sweep() -> list[str]:
    """Remove the test users (and their groups) of runs that are gone; return their names."""
    if os.geteuid() != 0:
        return []
    gone = []
    for user in pwd.getpwall():
        owner = _owner(user.pw_gecos)
        if owner is None or _alive(owner[0]):
            continue
        _run("userdel", user.pw_name)
        gone.append(user.pw_name)
        if owner[1]:
            _remove_group(owner[1])
    return gone


def _remove_group(name: str) -> None:
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return
    if not any(user.pw_gid == gid for user in pwd.getpwall()):
        _run("groupdel", name)


def _left_by_a_dead_run(name: str) -> bool:
    try:
        owner = _owner(pwd.getpwnam(name).pw_gecos)
    except KeyError:
        return False
    return owner is not None and not _alive(owner[0])


def add_group(name: str) -> None:
    """``groupadd name``, first removing a group of that name that a dead run left."""
    if name in {g.gr_name for g in grp.getgrall()}:
        _remove_group(name)
    subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=60)


def add_user(name: str, group: str, *options: str, own_group: bool = True) -> None:
    """``useradd`` with no home, primary ``group`` and ``options``, marked as this run's
    (and ``group`` as made by it, unless ``own_group`` is false); a user of that name that a
    dead run left is removed first."""
    if _left_by_a_dead_run(name):
        _run("userdel", name)
    comment = f"{MARK}{os.getpid()}" + (f" group={group}" if own_group else "")
    argv = ["useradd", "-M", "-N", "-c", comment, "-g", group, *options, name]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def remove(users: list[str], groups: list[str]) -> None:
    """Remove ``users``, then ``groups`` (what a test made), ignoring those already gone."""
    for name in users:
        _run("userdel", name)
    for name in groups:
        _run("groupdel", name)
