"""Vetting: a binary of unknown origin is loaded by a child process before this one loads it.

Some drivers crash on a corrupt program binary instead of refusing it (PoCL aborts
inside LLVM on some forged ones), and no fallback inside the process can catch that. The
crash guard (:mod:`runtime_cache.opencl.guard`) stops such a crash from repeating after a
restart; vetting stops the first one. Before this process loads a binary that is not
*known*, a worker process (``python -m runtime_cache.opencl.worker``) on the same devices
creates the program from it, builds it, and launches each kernel (on a zeroed buffer and
scalars of 1), because some drivers (PoCL, Mali) compile a kernel only at its first launch
and crash there on a bad binary. If the worker crashes, hangs or the driver refuses while
loading, the binary is blocklisted: the caller evicts it and builds from source (after a
hang, the rest of that child's batch is built from source this time). Trouble in the
launches, after the child said the binary loaded, condemns nothing (a good kernel on
made-up arguments can fault or loop): the program is built from source, nothing is
evicted, and the crash guard sets the binary aside under its key, so that this machine
neither loads nor vets it again. If the worker succeeds, the binary becomes known.

A child that fails for reasons of its own (no scratch space, no file descriptors, a
missing scratch folder: it checks by writing a file and building a tiny program from
source), that never says it opened the devices (:data:`~.parallel.START_TIMEOUT`), or that
a signal from outside ends (``SIGTERM``, ``SIGINT``, ``SIGHUP``, ``SIGQUIT``) "could not
vet": a local miss, built from source this time, with nothing blocklisted or evicted, so
local trouble never deletes shared entries. After :data:`FAILED_STARTS` failed starts in
a row, a process starts no more. A child ends with its parent (:func:`.child.follow_parent`).

Known binaries load directly, with no child: those the driver made in a process of this
user (a source build stored them), those vetted or loaded before on this machine (the
guard folder's list), and those from a signed cache or a signed bundle. Signing is what
keeps a hostile writer out: vetting is about robustness, since a binary that loads cleanly
can still do harm.

So a child is started only for binaries that came unsigned from elsewhere (another
machine through a shared cache, an unsigned bundle) and, signed or not, for *suspects*
(a process died loading them: a crash, or a kill from outside); one child per batch
(``build_all``, ``set_precompiled_programs``) or per lazily loaded program.
``RUNTIME_CACHE_OPENCL_VET=off`` loads unknown binaries directly (the crash guard still
stops repeats) and builds suspects from source, for apps that cannot start a Python child
process; so does a process where no child can start at all (a frozen app).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

from .counters import counters
from .fingerprint import device_fingerprint
from .guard import KNOWN, SET_ASIDE, SUSPECT, UNKNOWN, Binary, binary_digest, bindings, guard
from .vet_flights import Flights, Pending
from .wire import read_message, write_message

__all__ = [
    "BATCH",
    "ENV_VET",
    "FAILED_STARTS",
    "LAUNCH",
    "LAUNCH_TIMEOUT",
    "LOAD_TIMEOUT",
    "LOCAL",
    "Vetter",
    "screen_binaries",
    "vet_unknown",
    "vetter",
]

log = logging.getLogger(__name__)

ENV_VET = "RUNTIME_CACHE_OPENCL_VET"
#: Seconds one trial load may take before the child is killed and the binary refused.
LOAD_TIMEOUT = 120.0
#: Seconds the trial launches of a loaded binary may take; past them, or on a crash there,
#: the child could not vet: the caller builds from source, and nothing is condemned (a
#: good kernel on made-up arguments may fault or loop as a bad binary would).
LAUNCH_TIMEOUT = 20.0
#: Programs per child below which a batch is not spread over more children.
BATCH = 8
#: Children in a row that fail to start, after which a process starts no more.
FAILED_STARTS = 3

#: ``(binaries, options, options text, source)`` of one program (the source tells the
#: child each kernel argument's kind: see :mod:`.kernel_args`).
Item = tuple[Sequence[Binary], list[str], str, str | bytes]
#: Outcomes: a child that could not vet for reasons of its own (a full disk...); a binary
#: that loaded in the child, whose trial launches failed or hung. Of a binary: ``True``
#: loaded, ``False`` refused or crashed, ``LOCAL``, ``LAUNCH``, ``None`` no child.
LOCAL: Literal["local"] = "local"
LAUNCH: Literal["launch"] = "launch"
Outcome = bool | Literal["local", "launch"] | None
#: What one child showed: ``(replies, index it died on, clean exit, died launching)``.
Run = tuple[list[Outcome], int | None, bool, bool]
#: Setup errors of this machine, not of the binary: the batch is "could not vet".
_LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM, errno.EAGAIN})


class Vetter:
    """Tries binaries in worker processes; each batch runs in a child that then exits.

    A driver may crash loading a binary, at a kernel's first launch, or only at
    exit (PoCL can abort releasing its LLVM context after loading a damaged
    binary that otherwise ran). So the child keeps every program it loaded until
    it exits, and only a clean exit confirms them. A child that dies on an item
    condemns that item; a child that dies at exit has its batch split in halves
    and tried again, down to single programs.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unavailable = False
        self._failed_starts = 0  # children in a row that never said they opened the devices
        self._counts = threading.Lock()
        self.started = 0
        self.crashed = 0

    def vet(self, devices: Sequence[Any], items: Sequence[Item]) -> list[Outcome]:
        """Try each program's binaries in a child: ``True`` loaded, ``False`` refused or
        crashed, ``LOCAL`` when the child could not vet (its own setup failed),
        ``LAUNCH`` when they loaded and a trial launch failed, crashed or hung, ``None``
        when no child can run here.

        Batches of :data:`BATCH` or more programs are spread over one child per core.
        """
        fingerprints = [device_fingerprint(d) for d in devices]
        results: list[Outcome] = [None] * len(items)
        indices = list(range(len(items)))
        count = max(1, min(os.cpu_count() or 1, len(items) // BATCH))
        groups: deque[list[int]] = deque(indices[i::count] for i in range(count))

        def work() -> None:
            while True:
                try:
                    group = groups.popleft()
                except IndexError:
                    return
                outcome = self._run(fingerprints, [items[i] for i in group])
                if outcome is None:  # no child can start here: leave the rest undecided
                    groups.clear()
                    return
                self._settle(group, *outcome, results, groups)

        with self._lock:
            threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return results

    def _count(self, started: int = 0, crashed: int = 0) -> None:
        with self._counts:
            self.started += started
            self.crashed += crashed

    def _settle(
        self,
        group: list[int],
        replies: list[Outcome],
        died_on: int | None,
        clean: bool,
        launching: bool,
        results: list[Outcome],
        groups: deque[list[int]],
    ) -> None:
        """Record what one child showed; queue what it left unconfirmed."""
        for index, ok in zip(group, replies, strict=False):
            if ok is not True:
                results[index] = ok if ok in (LOCAL, LAUNCH) else False
        passed = [group[j] for j, ok in enumerate(replies) if ok is True]
        if died_on is not None:
            self._count(crashed=1)
            # Died loading: the binary's doing. Died launching: maybe the kernel's.
            results[group[died_on]] = LAUNCH if launching else False
            rest = [i for i in group[died_on + 1 :] if results[i] is None]  # (not LOCAL)
            groups.extend(g for g in (passed, rest) if g)  # passed: not confirmed yet
        elif clean:
            for index in passed:
                results[index] = True
        elif len(passed) == 1:
            self._count(crashed=1)
            results[passed[0]] = False
        elif passed:
            half = len(passed) // 2
            groups.extend([passed[:half], passed[half:]])

    def _run(self, fingerprints: list[dict[str, Any]], items: list[Item]) -> Run | None:
        """One child over ``items`` (see :data:`Run`)."""
        if self._unavailable:
            return None
        if self._failed_starts >= FAILED_STARTS:  # children fail to start here: none vets
            return [LOCAL] * len(items), None, True, False
        # The child's machinery loads here: most processes never vet anything.
        from .scratch import Scratch
        from .worker import scratch_usable

        try:
            scratch = Scratch()  # a folder of its own for each child (see .scratch)
        except OSError as exc:  # no scratch space here: not the binaries' fault
            log.warning("runtime-cache: could not vet OpenCL binaries here (%s)", exc)
            return [LOCAL] * len(items), None, True, False
        try:
            outcome = self._run_in(fingerprints, items, {"POCL_CACHE_DIR": scratch.path})
            failed = outcome is not None and not (all(r is True for r in outcome[0]) and outcome[2])
            if failed and not scratch_usable(scratch.path):
                # The child failed (or died) for want of scratch space, not for the binaries.
                log.warning(
                    "runtime-cache: could not vet OpenCL binaries: %s is full", scratch.path
                )
                return [LOCAL] * len(items), None, True, False
            return outcome
        finally:
            scratch.remove()

    def _run_in(
        self, fingerprints: list[dict[str, Any]], items: list[Item], env: dict[str, str]
    ) -> Run | None:
        from .parallel import start_worker, stop_worker, stopped_from_outside

        try:
            process = start_worker(fingerprints, env)
        except OSError as exc:
            if exc.errno in _LOCAL_ERRNOS:  # out of file descriptors, memory...: for now
                log.warning("runtime-cache: could not vet OpenCL binaries here (%s)", exc)
                return [LOCAL] * len(items), None, True, False
            # No process can start here at all (a frozen app: no Python to run).
            self._unavailable = True
            log.warning(
                "runtime-cache: cannot start a process to vet OpenCL binaries of unknown "
                "origin (%s); loading them here, under the crash guard only",
                exc,
            )
            return None
        if process is None:
            return self._not_started(len(items))
        self._failed_starts = 0
        self._count(started=1)
        assert process.stdin is not None and process.stdout is not None
        from .watchdog import Watchdog
        from .worker import LOADED

        replies: list[Outcome] = []
        for binaries, options, options_text, source in items:
            watchdog = Watchdog(process, LOAD_TIMEOUT).start()  # (this process's time only)
            launching = False
            try:
                text = source if isinstance(source, str) else source.decode("utf-8", "replace")
                job = ["load", "", list(binaries), options, options_text, text]
                write_message(process.stdin, job)
                reply = read_message(process.stdout)
                if reply == [LOADED]:  # loaded: its kernels' trial launches now
                    watchdog.cancel()
                    launching = True
                    watchdog = Watchdog(process, LAUNCH_TIMEOUT).start()
                    reply = read_message(process.stdout)
                replies.append(reply[1] if reply[1] in (LOCAL, LAUNCH) else reply[1] is True)
            except (OSError, EOFError, ValueError, TypeError, IndexError):
                # The child died on this item (a driver crash), or hung and was killed.
                watchdog.cancel()  # (a child stopped from outside: never the binary's doing)
                if stopped_from_outside(stop_worker(process)) or watchdog.child_stopped:
                    return [LOCAL] * len(items), None, True, False
                if watchdog.fired and not launching:
                    # A load hung for LOAD_TIMEOUT: the rest is built from source this
                    # time, not vetted a hang at a time (N such binaries cost N x 120 s).
                    rest = len(items) - len(replies) - 1
                    return [*replies, False, *[LOCAL] * rest], len(replies), False, False
                return replies, len(replies), False, launching
            except BaseException:  # (Ctrl-C: the child ends first, then its folder goes)
                process.kill()
                process.wait()
                raise
            finally:
                watchdog.cancel()
        status = stop_worker(process)
        if stopped_from_outside(status):  # at exit: nothing is confirmed, nothing condemned
            return [LOCAL] * len(items), None, True, False
        return replies, None, status == 0, False

    def _not_started(self, count: int) -> Run:
        """A child that started and never said it opened the devices (it died, was
        signalled, or hung past the start's timeout): these binaries could not be vetted
        this time (built from source, nothing condemned). After
        :data:`FAILED_STARTS` such children in a row, no more are started here."""
        with self._counts:
            self._failed_starts += 1
            failed = self._failed_starts
        if failed == FAILED_STARTS:
            log.warning(
                "runtime-cache: %d processes to vet OpenCL binaries of unknown origin failed "
                "to start; such binaries are built from source in this process (%s=off "
                "loads them unvetted, under the crash guard only)",
                failed,
                ENV_VET,
            )
        else:
            log.warning("runtime-cache: a process to vet OpenCL binaries failed to start")
        return [LOCAL] * count, None, True, False


vetter = Vetter()


def _enabled() -> bool:
    return os.environ.get(ENV_VET, "").strip().lower() not in ("off", "0", "no", "false")


def screen_binaries(
    digests: Sequence[str],
    *,
    trusted: bool,
    keys: Sequence[object] | None = None,
    standing: str | None = None,
) -> tuple[bool, str]:
    """``(vet first, standing)``: whether binaries with these digests (stored under
    ``keys``) must be tried in a child before this process loads them (from an unsigned
    source, neither known under these keys nor blocklisted; or, signed or not, ones a
    process that died was loading: :data:`~.guard.SUSPECT`), and their standing with the
    crash guard (:meth:`~runtime_cache.opencl.guard.LoadGuard.standing`), from one look-up.
    A loader given a known standing records nothing after the load. Binaries set aside
    need vetting too: :func:`vet_unknown` then answers "build from source" without a
    child. ``standing``: one already looked up (a read-ahead thread's); only ``KNOWN`` is
    taken as it is (a known binary stays known), any other is looked up again."""
    if standing == KNOWN:
        return False, KNOWN
    standing = guard.standing(bindings(keys, digests), digests)
    if standing == SUSPECT or (standing in (UNKNOWN, SET_ASIDE) and not trusted):
        return _enabled(), standing  # (and set aside, a suspect too: signed or not)
    return standing == SET_ASIDE and _enabled() and guard.suspected(digests), standing


#: Vettings in progress, by their binaries' marks.
_flights: Flights[Outcome] = Flights()


def vet_unknown(
    devices: Sequence[Any],
    items: Sequence[Item],
    *,
    trusted: bool,
    keys: Sequence[Sequence[object] | None] | None = None,
) -> list[bool]:
    """Vet the programs whose binaries are neither known nor blocklisted; record the outcome.

    ``keys`` holds each program's cache keys (binaries are known per key). ``trusted``
    (a signed source) skips vetting but of suspects. Afterwards each program's binaries are known
    (load them), blocklisted (the loader refuses them), or, where no child could run,
    neither (they load under the crash guard), or set aside (their trial launches
    failed). Returns, per program, whether to load it now: ``False`` where the child
    could not vet, or they are set aside (a local miss: build from source, evict
    nothing; no child for those set aside before).
    """
    load = [True] * len(items)
    if not items or not _enabled():
        return load
    per_item = list(keys) if keys is not None else [None] * len(items)
    pending: Pending = []
    for index, (item, item_keys) in enumerate(zip(items, per_item, strict=True)):
        digests = [binary_digest(b) for b in item[0]]
        vet, standing = screen_binaries(digests, trusted=trusted, keys=item_keys)
        if vet and standing == SET_ASIDE:  # their launches failed here before: no child
            load[index] = False
            counters.add(vet_local=1)
        elif vet:
            pending.append((index, digests, bindings(item_keys, digests)))
    if not pending:
        return load
    pending, waits = _flights.claim(pending)  # another thread vetting them: wait for it
    results: list[Outcome] | None = None
    try:
        results = vetter.vet(devices, [items[i] for i, _, _ in pending]) if pending else []
        for (index, digests, marks), ok in zip(pending, results, strict=True):
            if ok is True:
                guard.unblock(digests)  # (off the suspect list: a child loaded them)
                guard.vouch(marks)
                counters.add(vetted=1)
            elif ok is False:
                guard.block(digests)
                counters.add(vet_failures=1)
            elif ok in (LOCAL, LAUNCH):
                if ok == LAUNCH:
                    guard.set_aside(marks)
                load[index] = False
                counters.add(vet_local=1)
    finally:
        _flights.release(pending, results, LOCAL)  # after the guard knows: waiters go by it
    for (index, _, _), flight in waits:
        flight.done.wait(2 * LOAD_TIMEOUT)
        if flight.outcome in (LOCAL, LAUNCH) or not flight.done.is_set():
            load[index] = False  # not vetted here either: a local miss
    failed = sum(1 for ok in results if ok is False)
    if failed:
        log.warning(
            "runtime-cache: %d of %d OpenCL programs of unknown origin failed to load in a "
            "vetting process (refused or crashed the driver); they will be built from source",
            failed,
            len(results),
        )
    return load
