"""Hand the stores left at exit to one detached process, so the app exits at once.

Storing a program built under :func:`~runtime_cache.opencl.install` means
reading its binaries back from the driver, and PoCL compiles every kernel of
the program for that read (a second or more for one of pyopencl's scans). At
exit, rather than make the app wait for those reads, :func:`hand_off` starts
one detached process (``python -m runtime_cache.opencl.detached_worker``, in
a session of its own, at a low priority) and gives it what it needs to make
the same binaries: each program's source, options, devices (by fingerprint)
and keys. It builds each program again from that source on the same devices
with the same driver, reads the binaries back, and stores them under the
same keys, in the same store (:mod:`.reopen`), signed with the same secret
(handed over its stdin, never on its command line); see
:mod:`.detached_worker`.

When (on POSIX systems): ``RUNTIME_CACHE_OPENCL_DETACH`` is ``auto`` (the default: for a driver
known to compile on read-back, PoCL, at once; for another, once the first
read-back at exit took over :data:`SLOW_READ_SECONDS`), ``1`` (always) or ``0``
(never: the flush at exit stores them in this process, as
:func:`~runtime_cache.opencl.flush` always does). A store that cannot be
opened from another process (``memory://``, a callback backend) is flushed
in this process.

Each detached process leaves a record in :func:`runs_folder` (``<pid>.running``
while it works, ``<pid>.json`` with what it did once it is done) and its
output in ``detached.log`` there. :func:`wait_for_detached_stores` waits for
them (the CLI-free way for a script or a benchmark), and :func:`detached_runs`
reads the records.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any, BinaryIO

import msgpack

from .. import environment
from ..cache import Cache
from .child import python_command
from .fingerprint import device_fingerprint
from .guard import ENV_GUARD_DIR, process_alive
from .plan import ProgramPlan
from .wire import write_message

__all__ = [
    "ENV_DETACH",
    "ENV_DETACHED_DIR",
    "ENV_DETACHED_SECONDS",
    "SLOW_READ_SECONDS",
    "compiles_on_read",
    "detach_mode",
    "detached_runs",
    "detached_seconds",
    "hand_off",
    "runs_folder",
    "wait_for_detached_stores",
    "write_record",
]

log = logging.getLogger(__name__)

ENV_DETACH = "RUNTIME_CACHE_OPENCL_DETACH"
ENV_DETACHED_DIR = "RUNTIME_CACHE_OPENCL_DETACHED_DIR"
ENV_DETACHED_SECONDS = "RUNTIME_CACHE_OPENCL_DETACHED_SECONDS"
#: In ``auto`` mode, a first read-back at exit slower than this hands the rest off.
SLOW_READ_SECONDS = 0.25
_DEFAULT_DETACHED_SECONDS = 900.0
#: The longest a detached process may be given (a day): a larger or infinite setting is cut
#: to it (``inf`` overflowed the child's alarm, which died before storing anything).
MAX_DETACHED_SECONDS = 86400.0
#: Records of finished runs older than this are removed when a new run starts.
_KEEP_RECORDS_SECONDS = 7 * 86400.0
_LOG_LIMIT = 1 << 20
#: The detached stores' shared log (their output), in the records folder.
_LOG = "detached.log"
_started: list[subprocess.Popen[bytes]] = []
_MODES = {"auto": "auto", "": "auto", "1": "always", "always": "always", "on": "always"}
_MODES.update({"0": "off", "off": "off", "never": "off"})


def detach_mode() -> str:
    """``"auto"``, ``"always"`` or ``"off"``, from ``RUNTIME_CACHE_OPENCL_DETACH``
    (always ``"off"`` where processes cannot be detached the POSIX way)."""
    if os.name != "posix":
        return "off"
    text = os.environ.get(ENV_DETACH, "").strip().lower()
    mode = _MODES.get(text)
    if mode is None:
        log.warning("runtime-cache: %s=%r is not auto, 1 or 0; using auto", ENV_DETACH, text)
        return "auto"
    return mode


def detached_seconds() -> float:
    """The bound on a detached process's life, from ``RUNTIME_CACHE_OPENCL_DETACHED_SECONDS``."""
    text = os.environ.get(ENV_DETACHED_SECONDS, "").strip()
    try:
        seconds = float(text) if text else _DEFAULT_DETACHED_SECONDS
    except ValueError:
        return _DEFAULT_DETACHED_SECONDS
    if seconds != seconds:  # nan
        return _DEFAULT_DETACHED_SECONDS
    return min(max(1.0, seconds), MAX_DETACHED_SECONDS)


def compiles_on_read(devices: Sequence[Any]) -> bool:
    """Whether the driver of ``devices`` is known to compile when its binaries are read
    (PoCL finishes every kernel of the program for ``CL_PROGRAM_BINARIES``)."""
    for device in devices:
        try:
            if "Portable Computing Language" in str(device.platform.name):
                return True
        except Exception:  # a device without a readable platform: not known to
            continue
    return False


def runs_folder() -> str:
    """The folder of the detached processes' records and log:
    ``RUNTIME_CACHE_OPENCL_DETACHED_DIR``, else ``opencl-detached`` in the state folder."""
    folder = environment.read(ENV_DETACHED_DIR)
    # Absolute: the detached process starts in another folder (a relative one was looked
    # up again from there, and the process died before storing anything).
    return (
        environment.from_start(folder)
        if folder
        else os.path.join(environment.state_directory(), "opencl-detached")
    )


def _running(folder: str) -> list[int]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    pids = [int(n.split(".")[0]) for n in names if n.endswith(".running") and n[:-8].isdigit()]
    return [pid for pid in pids if process_alive(pid) and _a_worker(pid)]


def _a_worker(pid: int) -> bool:
    """Whether ``pid`` runs a detached store (where ``/proc`` tells): one killed with
    ``kill -9`` leaves its record, and an unrelated process given its pid later kept
    :func:`wait_for_detached_stores` waiting for as long as that one lived."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read(1 << 16)
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # no /proc here: the pid alone tells
    except OSError:
        return True
    if command:
        return b"detached_worker" in command
    # An empty command line: a kernel thread (no program file), or, now and then, a live
    # worker busy in the driver (seen under load on Intel's CPU runtime), which is waited for.
    try:
        os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        return False
    except OSError:  # (another user's: it has one)
        pass
    return True


def wait_for_detached_stores(timeout: float | None = None, folder: str | None = None) -> bool:
    """Wait until no detached store (of :func:`runs_folder`, or ``folder``) is running;
    ``False`` if ``timeout`` (seconds) ran out first.

    A process that was killed counts as finished (what it had stored stays;
    each entry is written whole or not at all).

    Example::

        from runtime_cache.opencl import wait_for_detached_stores
        wait_for_detached_stores(timeout=300)  # then a warm run finds every binary
    """
    where = folder or runs_folder()
    deadline = None if timeout is None else time.monotonic() + timeout
    while _running(where):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def detached_runs(folder: str | None = None) -> list[dict[str, Any]]:
    """The records of finished detached stores, oldest first: ``pid``, ``programs``
    handed over, ``stored``, ``present`` (stored already), ``changed`` (a key that
    no longer matches, e.g. an edited header), ``failed``, ``left`` (over the time
    bound), ``seconds`` and ``cpu_seconds``, and ``error`` when it could not start."""
    where = folder or runs_folder()
    records: list[dict[str, Any]] = []
    try:
        names = sorted(n for n in os.listdir(where) if n.endswith(".json"))
    except OSError:
        return records
    for name in names:
        try:
            with open(os.path.join(where, name), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    records.sort(key=lambda r: float(r.get("started", 0.0)))
    return records


def _prepare(folder: str) -> None:
    """Make ``folder`` (private), refuse one that others could write, and tidy it."""
    os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)  # (as the guard does)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    try:
        # The jobs file there says what gets built and stored with our secret; and a link
        # (or a folder someone else can swap, at any level above) would point the tidying
        # below elsewhere.
        environment.check_private(folder, whole_path=True)
    except OSError as exc:
        raise PermissionError(str(exc)) from None
    now = time.time()
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            if name.endswith((".json", ".jobs")) and now - os.stat(path).st_mtime > (
                _KEEP_RECORDS_SECONDS
            ):
                os.unlink(path)
            elif name.endswith(".running") and name[:-8].isdigit():
                if not process_alive(int(name[:-8])):  # killed: its record never came
                    os.unlink(path)
            elif name == _LOG:
                info = os.lstat(path)  # (a link, a FIFO: left; _open_log writes nowhere)
                if stat.S_ISREG(info.st_mode) and info.st_size > _LOG_LIMIT:
                    os.truncate(path, 0)
        except OSError:
            continue


def _open_log(folder: str) -> BinaryIO:
    """``detached.log`` in ``folder``, to append to; ``os.devnull`` where something else
    than a regular file is at its name (a FIFO there kept the app from ever exiting: an
    open for writing waits for a reader; a link is not followed)."""
    path = os.path.join(folder, _LOG)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:  # (ENXIO: a FIFO with no reader; ELOOP: a link)
        log.warning("runtime-cache: detached store's log %s not written (%s)", path, exc)
        return open(os.devnull, "ab")
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # (a FIFO that has a reader, a device)
        os.close(fd)
        log.warning("runtime-cache: detached store's log %s is no regular file: not written", path)
        return open(os.devnull, "ab")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")


def _job(plan: ProgramPlan, seconds: float) -> list[Any]:
    assert plan.keys is not None
    fingerprints = [device_fingerprint(d) for d in plan.devices]
    module_id = plan.keys[0].module_id
    keys = [str(k) for k in plan.keys]
    options = list(plan.options)
    return [
        plan.source,
        options,
        plan.options_text,
        fingerprints,
        module_id,
        keys,
        seconds,
        plan.folder,
    ]


def write_record(path: str, record: dict[str, Any]) -> None:
    """Write a detached store's record (JSON) at ``path``, whole or not at all."""
    temp = f"{path}.tmp"
    try:
        with open(temp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(temp, path)
    except OSError:
        _remove(temp)  # (a full disk): no half record left behind
        raise


def _remove(path: str) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def _child_environment(folder: str) -> dict[str, str]:
    """The detached process's environment: folders as this process resolved them (it
    starts in ``folder``, where a relative ``RUNTIME_CACHE_GUARD_DIR`` named another)."""
    env = {**os.environ, "PYOPENCL_NO_CACHE": "1", ENV_DETACHED_DIR: folder}
    guard_folder = environment.read(ENV_GUARD_DIR)
    if guard_folder is not None:
        env[ENV_GUARD_DIR] = environment.from_start(guard_folder)
    return env


def hand_off(cache: Cache, jobs: Sequence[tuple[ProgramPlan, float]]) -> bool:
    """Start one detached process that stores ``jobs`` (``(plan, build seconds)``) in
    ``cache``'s store; ``False`` (nothing started) when the store cannot be opened
    from another process (:func:`.reopen.reopen_spec`) or the process cannot start.
    """
    from .reopen import reopen_spec

    spec = reopen_spec(cache)
    if spec is None or not jobs:
        return False
    folder = runs_folder()
    jobs_path = ""
    try:
        _prepare(folder)
        # The sources go in a private file: a pipe would block this process until the
        # other one has started up and read them.
        fd, jobs_path = tempfile.mkstemp(suffix=".jobs", dir=folder)
        with os.fdopen(fd, "wb") as handle:
            body = [_job(plan, seconds) for plan, seconds in jobs]
            handle.write(msgpack.packb(body, use_bin_type=True))
        with _open_log(folder) as out:
            child = subprocess.Popen(
                python_command("runtime_cache.opencl.detached_worker"),
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
                cwd=folder,
                start_new_session=True,
                env=_child_environment(folder),
            )
    except OSError as exc:
        log.warning("runtime-cache: could not start the detached store (%s)", exc)
        _remove(jobs_path)
        return False
    secret = cache.secret_keys()
    message = {
        "spec": spec,
        "secret": list(secret) if secret is not None else None,
        "producer": cache.producer,
        "jobs": jobs_path,
        "seconds": detached_seconds(),
        "cwd": _cwd(),
    }
    assert child.stdin is not None
    try:  # small (no sources): fits in the pipe's buffer, so it never waits on the child
        write_message(child.stdin, message)
        child.stdin.close()
    except OSError as exc:
        log.warning("runtime-cache: the detached store did not start (%s)", exc)
        child.kill()
        _remove(jobs_path)
        return False
    # Written here, not only by the child: whoever waits right after this process exits
    # must see it running before the child has even started up.
    try:
        record = {"pid": child.pid, "started": time.time(), "programs": len(jobs)}
        write_record(os.path.join(folder, f"{child.pid}.running"), record)
    except OSError as exc:
        log.debug("runtime-cache: no record for the detached store (%s)", exc)
    # Not waited for: kept so that no warning says it still runs. Those that ended are
    # reaped here (a service that hands off once builds are quiet, a burst at a time,
    # kept one zombie a burst).
    _started[:] = [started for started in _started if started.poll() is None]
    _started.append(child)
    log.debug("runtime-cache: %d programs handed to detached store %d", len(jobs), child.pid)
    return True
