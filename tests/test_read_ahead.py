"""read_ahead and drain: order, overlap, errors and early stops, on real threads."""

from __future__ import annotations

import threading
import time

import pytest

from runtime_cache.opencl.read_ahead import drain, read_ahead


def test_results_come_in_order_and_are_computed_on_another_thread() -> None:
    where: list[int] = []

    def work(item: int) -> int:
        where.append(threading.get_ident())
        return item * item

    assert list(read_ahead(list(range(20)), work)) == [i * i for i in range(20)]
    assert set(where) == {where[0]} and where[0] != threading.get_ident()


def test_without_background_everything_runs_on_the_callers_thread() -> None:
    where: list[int] = []
    out = list(
        read_ahead([1, 2, 3], lambda i: where.append(threading.get_ident()) or i, background=False)
    )
    assert out == [1, 2, 3] and set(where) == {threading.get_ident()}


def test_the_next_items_are_computed_while_the_caller_works() -> None:
    started: list[int] = []

    def work(item: int) -> int:
        started.append(item)
        return item

    seen = []
    for value in read_ahead(list(range(10)), work, depth=2):
        if value == 0:
            deadline = time.monotonic() + 5
            while len(started) < 3 and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.05)
            seen.append(len(started))
    # While the caller held item 0, the thread computed ahead, but only so far:
    # two results queued (depth=2) and at most one more waiting for room.
    assert 3 <= seen[0] <= 4
    assert started == list(range(10))


def test_an_error_is_raised_at_its_item() -> None:
    def work(item: int) -> int:
        if item == 3:
            raise ValueError("bad item 3")
        return item

    got = []
    with pytest.raises(ValueError, match="bad item 3"):
        for value in read_ahead(list(range(6)), work):
            got.append(value)
    assert got == [0, 1, 2]


def test_stopping_early_stops_the_thread() -> None:
    done: list[int] = []
    results = read_ahead(list(range(100)), lambda i: done.append(i) or i, depth=1)
    for value in results:
        if value == 2:
            break
    assert any(t.name == "runtime-cache-read-ahead" for t in threading.enumerate())
    results.close()  # what dropping the generator does
    assert not any(t.name == "runtime-cache-read-ahead" for t in threading.enumerate())
    assert len(done) < 10


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_drain_handles_each_result_once(threads: int) -> None:
    handled: list[int] = []
    lock = threading.Lock()

    def handle(value: int) -> None:
        with lock:
            handled.append(value)

    drain(read_ahead(list(range(50)), lambda i: i), handle, threads)
    assert sorted(handled) == list(range(50))


def test_drain_raises_the_first_error_and_stops() -> None:
    handled: list[int] = []

    def handle(value: int) -> None:
        if value == 5:
            raise RuntimeError("handler failed on 5")
        handled.append(value)

    with pytest.raises(RuntimeError, match="handler failed on 5"):
        drain(read_ahead(list(range(1000)), lambda i: i), handle, 2)
    assert 5 not in handled and len(handled) < 1000


def test_drain_raises_an_error_from_the_results() -> None:
    def work(item: int) -> int:
        if item == 4:
            raise KeyError(item)
        return item

    with pytest.raises(KeyError):
        drain(read_ahead(list(range(10)), work), lambda value: None, 2)
