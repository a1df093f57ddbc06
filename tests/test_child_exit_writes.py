"""Writes made in a ``multiprocessing`` child reach every tier when the child ends normally.

A child started by ``fork`` or ``forkserver`` (a ``Pool`` worker too) ends with
``os._exit``, which skips ``atexit``: the Redis tier's background writer was flushed
only there, so a tiered store lost the children's writes to Redis (the ``dir://``
tier had them). The writer is now flushed by ``multiprocessing``'s finalizers too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from runtime_cache.backends.directory import DirectoryBackend

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

CHILDREN = 4

# The end of both apps below: COUNT children (processes, or a pool's tasks) run work(i).
RUN_CHILDREN = textwrap.indent(
    textwrap.dedent(
        """
        ctx = mp.get_context(METHOD)
        if HOW == "pool":
            pool = ctx.Pool(2)
            assert pool.map(work, range(COUNT)) == list(range(COUNT))
            pool.close()
            pool.join()
        else:
            children = [ctx.Process(target=work, args=(i,)) for i in range(COUNT)]
            for child in children:
                child.start()
            for child in children:
                child.join()
            assert [c.exitcode for c in children] == [0] * COUNT
        """
    ),
    "    ",
)

# argv: store URL, start method, "process" or "pool", how many children.
APP = (
    textwrap.dedent(
        """
    import multiprocessing as mp, sys
    import runtime_cache as rc

    URL, METHOD, HOW, COUNT = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    SECRET = "child-exit-test-secret-0123456789"

    def key(name):
        return rc.make_key(module_id=name, runtime="r", purpose="child-exit")

    def cache():
        return rc.Cache(rc.open_backend(URL), secret=SECRET)

    def work(i):
        cache().put(key(f"child{i}"), b"c" * 100)  # no close(), no flush()
        return i

    if __name__ == "__main__":
        cache().put(key("parent"), b"p")
    """
    )
    + RUN_CHILDREN
)


@pytest.mark.parametrize(
    ("method", "how"),
    [("fork", "process"), ("forkserver", "process"), ("spawn", "process"), ("fork", "pool")],
)
def test_a_childs_writes_reach_the_redis_tier(
    tmp_path: Path, redis_server: RedisProcess, unique_prefix: str, method: str, how: str
) -> None:
    folder = tmp_path / "dir"
    remote = f"{redis_server.url}?prefix={unique_prefix}"
    script = tmp_path / "app.py"
    script.write_text(APP)
    done = subprocess.run(
        [sys.executable, str(script), f"dir://{folder},{remote}", method, how, str(CHILDREN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import runtime_cache as rc

    in_redis = list(rc.open_backend(remote).keys())
    in_dir = list(DirectoryBackend(folder).keys())
    assert len(in_dir) == CHILDREN + 1
    assert sorted(in_redis) == sorted(in_dir), done.stderr[-3000:]


class _Quiet:
    """A backend the writers never reach in these tests (nothing is queued)."""

    def set(self, key: str, value: bytes) -> None:
        raise AssertionError("no write")


def test_the_fork_hooks_let_go_of_exactly_the_writers_they_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The review of session 41: the hook after a fork let go of every live writer, one
    made while the hook before it waited too, which it had never held: that raised, and
    the writers after it stayed held for good (their threads never wrote again). And the
    wait was 5 s a writer, for every batch; it is 5 s a fork, for first batches alone."""
    import threading
    import time

    from runtime_cache.backends import write_behind as wb

    monkeypatch.setattr(wb, "FORK_WAIT", 1.0)
    stuck = [wb.WriteBehind(_Quiet()) for _ in range(4)]  # type: ignore[arg-type]
    for writer in stuck:
        writer._inflight = {"k": b"v"}  # a first batch that never comes back
    later = wb.WriteBehind(_Quiet())  # type: ignore[arg-type]
    later._inflight, later._sent_one = {"k": b"v"}, True  # a later batch: not waited for
    started = time.monotonic()
    wb._hold_all_for_fork()
    waited = time.monotonic() - started
    made_meanwhile = wb.WriteBehind(_Quiet())  # type: ignore[arg-type]
    wb._release_all_after_fork()
    assert 0.9 < waited < 2.5, waited  # one deadline for the fork (4 s: one a writer)

    def free(writer: wb.WriteBehind) -> bool:  # (from another thread: the lock re-enters)
        got: list[bool] = []

        def look() -> None:
            got.append(writer._cond.acquire(blocking=False))
            if got[0]:
                writer._cond.release()

        other = threading.Thread(target=look)
        other.start()
        other.join()
        return got[0]

    for writer in [*stuck, later, made_meanwhile]:
        assert free(writer) and not writer._forking, "left held after the fork"


# argv: folder, start method, "process" or "pool", "parent" or "child" (who opens the
# cache the children read through), how many children.
HITS_APP = (
    textwrap.dedent(
        """
    import multiprocessing as mp, sys
    import runtime_cache as rc

    FOLDER, METHOD, HOW, OPENED, COUNT = sys.argv[1:5] + [int(sys.argv[5])]
    KEYS = [rc.make_key(module_id=f"m{i}", runtime="r", purpose="child-hits") for i in range(3)]
    CACHE = None

    def work(i):
        cache = CACHE if CACHE is not None else rc.Cache(rc.open_backend(f"dir://{FOLDER}"))
        assert all(cache.get(k) == b"v" for k in KEYS)  # 3 hits, fewer than a batch
        return i

    if __name__ == "__main__":
        parent = rc.Cache(rc.open_backend(f"dir://{FOLDER}"))
        for k in KEYS:
            parent.put(k, b"v")
        if OPENED == "parent":
            CACHE = parent  # inherited by forked children
    """
    )
    + RUN_CHILDREN
)


@pytest.mark.parametrize(
    ("method", "how", "opened"),
    [
        ("fork", "process", "child"),
        ("fork", "process", "parent"),
        ("fork", "pool", "parent"),
        ("forkserver", "process", "child"),
        ("spawn", "process", "child"),
    ],
)
def test_a_childs_hits_on_a_folder_are_counted(
    tmp_path: Path, method: str, how: str, opened: str
) -> None:
    """Session 42's closing note: a ``dir://`` store's hits were flushed at exit by
    ``atexit`` alone, which a ``fork`` or ``forkserver`` child of ``multiprocessing``
    never runs: its hits (fewer than a batch) were lost, and prune and ``ls`` saw none.
    They are flushed by ``multiprocessing``'s finalizers too."""
    folder = tmp_path / "dir"
    script = tmp_path / "app.py"
    script.write_text(HITS_APP)
    done = subprocess.run(
        [sys.executable, str(script), str(folder), method, how, opened, str(CHILDREN)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    hits = {item.key: item.hits for item in DirectoryBackend(folder).scan()}
    assert len(hits) == 3 and set(hits.values()) == {CHILDREN}, hits
