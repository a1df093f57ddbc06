"""Read ahead: compute the next items' inputs on a background thread while others use them.

``build_all`` hands cached binaries to the driver on the caller's thread (and,
where the driver gains from it, on one more); meanwhile a background thread
fetches and checks the next chunk of entries. pyopencl calls
``clBuildProgram`` without holding the GIL, so reading and loading overlap.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

__all__ = ["drain", "read_ahead"]

T = TypeVar("T")
R = TypeVar("R")


def read_ahead(
    items: Sequence[T], work: Callable[[T], R], *, depth: int = 2, background: bool = True
) -> Iterator[R]:
    """Yield ``work(item)`` for each item in order, computing up to ``depth`` ahead on a thread.

    An exception raised by ``work`` is raised to the caller at that item. If the
    caller stops early, the thread stops after the item it is on.
    ``background=False`` computes each result on the caller's thread, in turn.
    """
    if not background or len(items) < 2:
        for item in items:
            yield work(item)
        return
    # ("ok", result), ("error", exception) or ("done", None)
    results: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(value: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                results.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if stop.is_set() or not put(("ok", work(item))):
                    return
        except BaseException as exc:  # handed to the caller, raised there
            put(("error", exc))
            return
        put(("done", None))

    thread = threading.Thread(target=produce, name="runtime-cache-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = results.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield cast(R, value)
    finally:
        stop.set()
        thread.join()


def drain(results: Iterator[R], handle: Callable[[R], None], threads: int = 1) -> None:
    """Call ``handle`` on each of ``results``, on ``threads`` threads (the caller's among them).

    The first exception, from ``handle`` or from ``results``, stops every thread
    and is raised here.
    """
    if threads <= 1:
        for result in results:
            handle(result)
        return
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run() -> None:
        while not errors:
            with lock:
                try:
                    result = next(results)
                except StopIteration:
                    return
                except BaseException as exc:  # raised in the caller's thread below
                    errors.append(exc)
                    return
            try:
                handle(result)
            except BaseException as exc:  # raised in the caller's thread below
                errors.append(exc)
                return

    helpers = [threading.Thread(target=run, daemon=True) for _ in range(threads - 1)]
    for helper in helpers:
        helper.start()
    run()
    for helper in helpers:
        helper.join()
    if errors:
        close = getattr(results, "close", None)
        if close is not None:
            close()
        raise errors[0]
