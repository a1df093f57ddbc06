"""The fork's wait and hold that the OpenCL read-ahead's gate and the remote backends'
writers share (:mod:`runtime_cache.fork_holds`)."""

from __future__ import annotations

import threading
import time

from runtime_cache.fork_holds import ForkHold


class _Worker(ForkHold):
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._forking = False
        self.busy = True

    def in_flight_at_fork(self) -> bool:
        return self.busy


def _held_elsewhere(worker: _Worker) -> bool:
    """Whether another thread finds ``worker``'s condition taken."""
    found: list[bool] = []

    def look() -> None:
        taken = worker._cond.acquire(timeout=0.05)
        if taken:
            worker._cond.release()
        found.append(not taken)

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    return found[0]


def test_the_hold_waits_until_the_deadline_then_keeps_the_condition() -> None:
    worker = _Worker()  # work that never ends: the fork goes on at the deadline
    started = time.monotonic()
    worker.hold_for_fork(started + 0.3)
    assert 0.25 < time.monotonic() - started < 2.0
    assert worker._forking and _held_elsewhere(worker)
    worker.release_after_fork()
    assert not worker._forking and not _held_elsewhere(worker)


def test_the_hold_ends_when_the_work_in_flight_ends() -> None:
    worker = _Worker()

    def finish() -> None:
        time.sleep(0.1)
        with worker._cond:  # taken while the hold waits: the wait lets it go
            assert worker._forking  # (no new work starts meanwhile)
            worker.busy = False
            worker._cond.notify_all()

    thread = threading.Thread(target=finish)
    thread.start()
    started = time.monotonic()
    worker.hold_for_fork(started + 10.0)
    assert time.monotonic() - started < 5.0
    thread.join()
    worker.release_after_fork()


def test_nothing_in_flight_holds_at_once() -> None:
    worker = _Worker()
    worker.busy = False
    worker.hold_for_fork(time.monotonic() - 1.0)  # (a deadline passed: still held)
    assert worker._forking and _held_elsewhere(worker)
    worker.release_after_fork()
