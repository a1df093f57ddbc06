"""Cold source builds in parallel: worker processes build, the parent loads the binaries.

PoCL's compiler holds Python's GIL for part of a build and serializes part of
it internally, so threads gave only 0.71-0.84 of the sequential time on a
2-core machine; separate processes scale (about 0.5). Each worker is a plain
``python -m runtime_cache.opencl.worker`` subprocess, started isolated from the
current folder (:mod:`runtime_cache.opencl.child`; no multiprocessing, so the
app's main module is never re-imported): it opens the same devices
(matched by fingerprint), builds from source and ships the binaries back;
the parent creates the programs from them. Anything a worker cannot do is
handed back to the parent, which builds it itself.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .child import PARENT_ENV, child_folder, python_command
from .fingerprint import device_fingerprint
from .watchdog import Watchdog
from .wire import read_message, write_message

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "START_TIMEOUT",
    "Job",
    "WorkerResult",
    "build_in_processes",
    "build_in_threads",
    "start_worker",
    "stop_worker",
    "stopped_from_outside",
]

#: Seconds a worker may take to open its devices and say so before it is killed.
START_TIMEOUT = 30.0

#: Signals that end a worker from outside (see :func:`stopped_from_outside`).
_OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})

#: ``(name, source, options, folder)``: ``folder``, where the worker builds (relative ``-I``
#: folders resolve there): the one the keys were made in.
Job = tuple[str, str | bytes, list[str], str]
#: ``(name, binaries or None, build seconds, options text seen by the worker,
#: CPU seconds of the build, packed driver files the build added or None)``
WorkerResult = tuple[str, list[bytes] | None, float, str, float, bytes | None]


def _serve(
    fingerprints: list[dict[str, Any]],
    take: Callable[[], Job | None],
    on_result: Callable[[WorkerResult], bool],
    hand_back: Callable[[str], None],
    env: Callable[[], dict[str, str]] | None = None,
) -> None:
    current: Job | None = take()
    if current is None:
        return  # nothing to build: no worker started
    process: subprocess.Popen[bytes] | None = None
    try:
        process = start_worker(fingerprints, env() if env is not None else None)
        if process is None:
            hand_back(current[0])
            return
        assert process.stdin is not None and process.stdout is not None
        while True:
            if current is None:
                current = take()
                if current is None:
                    return
            # In the job's folder, where relative -I folders and the working folder's headers
            # resolve as they did for the keys (the worker itself runs elsewhere).
            write_message(process.stdin, ["build", *current])
            reply = read_message(process.stdout)
            binaries, seconds, options_text = reply[1:4]
            cpu, files = reply[4:6]
            job, current = current, None
            if files is not None and not isinstance(files, bytes):
                files = None
            result = (job[0], binaries, float(seconds), str(options_text), float(cpu), files)
            # Loading here overlaps the parent's part (a JIT on some drivers) with the builds.
            if not on_result(result):
                hand_back(job[0])
    except (OSError, EOFError, ValueError, TypeError):
        # A worker that died mid-job hands that job back to the parent.
        if current is not None:
            hand_back(current[0])
        return
    finally:
        if process is not None:
            stop_worker(process)


def start_worker(
    fingerprints: list[dict[str, Any]], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes] | None:
    """Start a worker process on the devices with these fingerprints; ``None`` if it did
    not say within :data:`START_TIMEOUT` seconds that it opened them. ``OSError`` when no
    process can be started.

    ``env`` adds to (or overrides) the worker's environment. The worker ends with this
    process (:func:`~.child.follow_parent`).
    """
    process = subprocess.Popen(
        python_command("runtime_cache.opencl.worker"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, PARENT_ENV: str(os.getpid()), **(env or {})},
        cwd=child_folder(),
    )
    assert process.stdin is not None and process.stdout is not None
    # A child that never answers (stopped, or stuck opening the devices) is killed: the
    # caller then builds, or counts the binaries not vetted, instead of waiting for good.
    watchdog = Watchdog(process, START_TIMEOUT).start()
    try:
        write_message(process.stdin, fingerprints)
        opened = read_message(process.stdout)
    except (OSError, EOFError, ValueError):
        opened = False
    finally:
        watchdog.cancel()
    if opened is not True:
        stop_worker(process)
        return None
    return process


def stop_worker(process: subprocess.Popen[bytes]) -> int:
    """Close a worker's input and reap it (killed if it does not end within 10 s).

    Returns its exit status (negative: the signal that ended it).
    """
    try:
        if process.stdin is not None:
            process.stdin.close()
    except OSError:
        pass
    try:
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def stopped_from_outside(status: int) -> bool:
    """Whether a worker's exit ``status`` (:func:`stop_worker`) is a signal from outside:
    an operator's, or a process group's ``SIGTERM``, and not the work's doing. ``SIGKILL``
    is not: it is also how a hang is ended."""
    return status < 0 and -status in _OUTSIDE_SIGNALS


def build_in_processes(
    devices: Sequence[Any],
    jobs: Sequence[Job] | Callable[[], Job | None],
    workers: int,
    on_result: Callable[[WorkerResult], bool],
    env: Callable[[], dict[str, str]] | None = None,
    handed_back: Callable[[str], None] | None = None,
) -> list[str]:
    """Build jobs in ``workers`` subprocesses, passing each result to ``on_result``.

    ``jobs`` is a list, or a function that hands out the next job (``None``
    when there is none left): a worker starts only once it has a job.
    ``on_result`` runs on one of ``workers`` parent threads as results arrive,
    and returns whether it took the result. ``env()``, when given, adds to each
    worker's environment as it starts. ``handed_back(name)``, when given, is
    called as soon as a job comes back unbuilt (refused, or its worker failed).
    Returns the names the parent must build itself: those refused, and those
    no worker could build.
    """
    fingerprints = [device_fingerprint(d) for d in devices]
    pending: queue.Queue[Job] = queue.Queue()
    for job in jobs if not callable(jobs) else ():
        pending.put(job)
    take = jobs if callable(jobs) else lambda: _next(pending)
    rejected: list[str] = []
    lock = threading.Lock()

    def hand_back(name: str) -> None:
        with lock:
            rejected.append(name)
        if handed_back is not None:
            handed_back(name)

    count = max(1, workers if callable(jobs) else min(workers, len(jobs)))
    threads = [
        threading.Thread(
            target=_serve,
            args=(fingerprints, take, on_result, hand_back, env),
            daemon=True,
        )
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    while True:  # jobs left when every worker failed to start
        try:
            rejected.append(pending.get_nowait()[0])
        except queue.Empty:
            break
    if callable(jobs):
        return rejected
    order = {job[0]: i for i, job in enumerate(jobs)}
    return sorted(rejected, key=order.__getitem__)


def _next(jobs: queue.Queue[Job]) -> Job | None:
    try:
        return jobs.get_nowait()
    except queue.Empty:
        return None


def build_in_threads(build: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """Call ``build(item)`` for every item on ``workers`` threads; return the results in
    the items' order, or re-raise the first error."""
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        return [future.result() for future in [pool.submit(build, item) for item in items]]
