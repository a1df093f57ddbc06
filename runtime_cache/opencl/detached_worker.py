"""The detached store's process: ``python -m runtime_cache.opencl.detached_worker``.

See :mod:`.detached_store` for when it starts.

Its stdin carries one message (:mod:`.wire`): ``{"spec", "secret", "producer",
"jobs", "seconds", "cwd"}``: the store to open (:func:`.reopen.open_spec`),
its secret's keys or ``None``, the producer label, the path of a private file
of jobs (read, then removed), the bound on this process's life, and the
parent's working folder. Each job is ``[source, options, options text,
device fingerprints, module id, keys, build seconds, folder]`` (``folder``: where its
headers were found when the keys were made, or ``None``).

For each program, unless its entries are all stored already (by another
run, say), it opens the devices by fingerprint, plans the keys again and
goes on only if they are the parent's keys (the same source, options,
headers and devices), builds the program from source in the parent's
working folder (relative ``-I`` paths resolve as they did there), reads the
binaries back, and stores them through a :class:`~runtime_cache.Cache` with
the parent's secret: the same checks, the same refusal of an unsigned shared
store, the same atomic writes. It stops between programs once ``seconds``
have passed, and ``SIGALRM`` ends it shortly after that whatever it is
doing: an entry is written whole or not at all. It writes
``<pid>.running`` in :func:`.detached_store.runs_folder` while it works and
``<pid>.json`` (what it did) when done, and one line to its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from typing import Any

import msgpack

from .. import environment
from ..cache import Cache
from .detached_store import MAX_DETACHED_SECONDS, runs_folder, write_record
from .wire import read_message

__all__ = ["main"]

_GRACE_SECONDS = 30


def _store_one(cache: Cache, opened: tuple[Any, list[Any]], job: list[Any], home: str) -> str:
    """Build, read back and store one program (in its folder, else in ``home``, where
    the process started: not where the last job left it); return what became of it."""
    from ._driver import import_pyopencl, read_binaries
    from .build_inputs import settle
    from .program import plan_program, source_build, store_binaries

    source, options, _, _, module_id, keys, seconds, *rest = job
    context, devices = opened
    try:  # where its headers were found (relative -I folders)
        os.chdir(str(rest[0]) if rest and rest[0] else home)
    except OSError:
        if rest and rest[0]:
            return "changed"
    plan = plan_program(context, source, options, devices=devices, module_id=module_id)
    if plan.keys is None or [str(k) for k in plan.keys] != list(keys):
        return "changed"
    try:
        program, _ = source_build(context, plan)
        binaries = read_binaries(import_pyopencl(), program, plan.devices)
    except Exception:  # the parent built it: a failure here is this process's own
        return "failed"
    if (plan := settle(plan, program)).keys is None:
        return "changed"  # a header changed during the build
    return "stored" if store_binaries(cache, plan, program, binaries, float(seconds)) else "failed"


def _store_all(cache: Cache, jobs: list[Any], deadline: float, record: dict[str, Any]) -> None:
    contexts: dict[str, tuple[Any, list[Any]] | None] = {}
    home = environment.working_folder() or os.sep
    for done, job in enumerate(jobs):
        if time.monotonic() >= deadline:
            record["left"] = len(jobs) - done
            return
        keys = list(job[5])
        found = cache.get_many_views(keys)
        if all(k in found for k in keys):
            outcome = "present"
        else:
            which = json.dumps(job[3], sort_keys=True)
            if which not in contexts:
                from .fingerprint import open_devices

                contexts[which] = open_devices(job[3])
            opened = contexts[which]
            outcome = "failed" if opened is None else _store_one(cache, opened, job, home)
        record[outcome] += 1
        if outcome == "failed" and getattr(cache.backend, "read_only", False):
            # A store found read-only (a read-only mount) takes none of the rest: each
            # would be built again for nothing (every run's exit did so, for every program).
            record["left"] = len(jobs) - done - 1
            record["read_only"] = True
            return


def _run(message: dict[str, Any], record: dict[str, Any]) -> None:
    from .reopen import open_spec

    path = str(message["jobs"])
    try:
        with open(path, "rb") as handle:
            jobs = msgpack.unpackb(handle.read(), raw=False)
    finally:
        os.unlink(path)
    record["programs"] = len(jobs)
    try:
        os.chdir(str(message.get("cwd") or "."))
    except OSError:
        pass
    secret = message.get("secret")
    cache = Cache(open_spec(message["spec"]), secret=secret, producer=message.get("producer"))
    try:
        _store_all(cache, jobs, time.monotonic() + float(message["seconds"]), record)
    finally:
        cache.close()


def _write_quietly(path: str, record: dict[str, Any]) -> None:
    try:
        write_record(path, record)
    except OSError as exc:  # (a full or read-only records folder): the log says it
        _say(f"runtime-cache detached store: cannot write {path}: {exc}")


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # the log sits in the records folder: full too
        print(line, file=sys.stderr, flush=True)


def main() -> int:
    """Store the jobs the parent handed over on stdin; 0 when all went as planned."""
    try:
        os.nice(10)
    except OSError:
        pass
    sys.stdout = sys.stderr  # driver chatter goes to the log
    started, clock, cpu = time.time(), time.perf_counter(), time.process_time()
    pid = os.getpid()
    record: dict[str, Any] = {"pid": pid, "started": started, "programs": 0, "left": 0}
    record.update(stored=0, present=0, changed=0, failed=0)
    try:
        message = read_message(sys.stdin.buffer)
    except EOFError:
        return 1
    folder = runs_folder()
    running = os.path.join(folder, f"{pid}.running")
    try:
        seconds = min(float(message.get("seconds", 900)), MAX_DETACHED_SECONDS)
        signal.alarm(int(seconds) + _GRACE_SECONDS)
        _write_quietly(running, record)  # a full records folder stops no store
        _run(message, record)
    except Exception as exc:  # recorded, and the exit status says it
        record["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        record["seconds"] = time.perf_counter() - clock
        record["cpu_seconds"] = time.process_time() - cpu
        _write_quietly(os.path.join(folder, f"{pid}.json"), record)
        with contextlib.suppress(OSError):
            os.unlink(running)
    _say(
        f"runtime-cache detached store {pid}: {record['stored']} of {record['programs']} "
        f"programs stored, {record['present']} already there, {record['changed']} changed, "
        f"{record['failed']} failed, {record['left']} left, in {record['seconds']:.1f} s "
        f"({record['cpu_seconds']:.1f} s CPU){'; ' + record['error'] if 'error' in record else ''}"
    )
    return 1 if "error" in record else 0


if __name__ == "__main__":
    sys.exit(main())
