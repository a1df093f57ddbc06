"""Vetting: a binary of unknown origin is loaded by a child process before this one loads it.

Some drivers crash on a corrupt program binary instead of refusing it (PoCL
aborts inside LLVM on some forged ones), and no fallback inside the process
can catch that. The crash guard (:mod:`runtime_cache.opencl.guard`) stops such
a crash from repeating after a restart; vetting stops the first one. Before
this process loads a binary that is not *known*, a worker process
(``python -m runtime_cache.opencl.worker``) on the same devices creates the
program from it, builds it, and launches each kernel once, on one work-item
with zeroed arguments, because some drivers (PoCL, Mali) compile a kernel only
at its first launch and crash there on a bad binary. If the worker crashes,
hangs or the driver refuses, the binary is blocklisted: the caller evicts it
and builds from source. If the worker succeeds, the binary becomes known.

Known binaries load directly, with no child:

* those the driver made in a process of this user (a source build stored them);
* those vetted or loaded before on this machine (the guard folder's list);
* those from a signed cache or a signed bundle. Signing is what keeps a
  hostile writer out: vetting is about robustness, since a binary that loads
  cleanly can still do harm.

So a child is started only for binaries that came unsigned from elsewhere:
another machine through a shared cache, or an unsigned bundle; one child per
batch (``build_all``, ``set_precompiled_programs``) or per lazily loaded
program. ``RUNTIME_CACHE_OPENCL_VET=off`` loads unknown binaries
directly (the crash guard still stops repeats), for apps that cannot start a
Python child process; so does a process where the child cannot start.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from .counters import counters
from .fingerprint import device_fingerprint
from .guard import Binary, binary_digest, guard
from .parallel import start_worker, stop_worker
from .worker import read_message, write_message

__all__ = [
    "BATCH",
    "ENV_VET",
    "LOAD_TIMEOUT",
    "Vetter",
    "needs_vetting",
    "vet_unknown",
    "vetter",
]

log = logging.getLogger(__name__)

ENV_VET = "RUNTIME_CACHE_OPENCL_VET"
#: Seconds one trial load may take before the child is killed and the binary refused.
LOAD_TIMEOUT = 120.0
#: Programs per child below which a batch is not spread over more children.
BATCH = 8

#: ``(binaries, options, options text)`` of one program.
Item = tuple[Sequence[Binary], list[str], str]


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
        self._counts = threading.Lock()
        self.started = 0
        self.crashed = 0

    def vet(self, devices: Sequence[Any], items: Sequence[Item]) -> list[bool | None]:
        """Try each program's binaries in a child: ``True`` loaded, ``False`` refused or
        crashed, ``None`` when no child can run here.

        Batches of :data:`BATCH` or more programs are spread over one child per core.
        """
        fingerprints = [device_fingerprint(d) for d in devices]
        results: list[bool | None] = [None] * len(items)
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
        replies: list[bool],
        died_on: int | None,
        clean: bool,
        results: list[bool | None],
        groups: deque[list[int]],
    ) -> None:
        """Record what one child showed; queue what it left unconfirmed."""
        for index, ok in zip(group, replies, strict=False):
            if not ok:
                results[index] = False
        passed = [group[j] for j, ok in enumerate(replies) if ok]
        if died_on is not None:
            self._count(crashed=1)
            results[group[died_on]] = False
            rest = group[died_on + 1 :]
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

    def _run(
        self, fingerprints: list[dict[str, Any]], items: list[Item]
    ) -> tuple[list[bool], int | None, bool] | None:
        """One child over ``items``: ``(replies, index it died on, clean exit)``."""
        if self._unavailable:
            return None
        # PoCL unpacks each program into its scratch folder under a hash stored in the
        # binary, which a damaged copy keeps: a child sharing that folder would leave
        # damaged files where this process then loads the good binary (LLVM aborts).
        scratch = tempfile.mkdtemp(prefix="runtime-cache-vet-")
        try:
            return self._run_in(fingerprints, items, {"POCL_CACHE_DIR": scratch})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _run_in(
        self, fingerprints: list[dict[str, Any]], items: list[Item], env: dict[str, str]
    ) -> tuple[list[bool], int | None, bool] | None:
        try:
            process = start_worker(fingerprints, env)
        except OSError as exc:
            log.debug("runtime-cache: no vetting process (%s)", exc)
            process = None
        if process is None:
            self._unavailable = True
            log.warning(
                "runtime-cache: cannot start a process to vet OpenCL binaries of unknown "
                "origin; loading them here, under the crash guard only"
            )
            return None
        self._count(started=1)
        assert process.stdin is not None and process.stdout is not None
        replies: list[bool] = []
        for binaries, options, options_text in items:
            watchdog = threading.Timer(LOAD_TIMEOUT, process.kill)
            watchdog.daemon = True
            watchdog.start()
            try:
                write_message(process.stdin, ["load", "", list(binaries), options, options_text])
                replies.append(bool(read_message(process.stdout)[1]))
            except (OSError, EOFError, ValueError, TypeError, IndexError):
                # The child died on this item (a driver crash), or hung and was killed.
                stop_worker(process)
                return replies, len(replies), False
            finally:
                watchdog.cancel()
        return replies, None, stop_worker(process) == 0


vetter = Vetter()


def _enabled() -> bool:
    return os.environ.get(ENV_VET, "").strip().lower() not in ("off", "0", "no", "false")


def needs_vetting(digests: Sequence[str], *, trusted: bool) -> bool:
    """Whether binaries with these digests must be tried in a child before this process
    loads them: they come from an unsigned source and are neither known nor blocklisted."""
    if trusted or not _enabled():
        return False
    return not guard.known(digests) and not guard.blocked(digests)


def vet_unknown(devices: Sequence[Any], items: Sequence[Item], *, trusted: bool) -> None:
    """Vet the programs whose binaries are neither known nor blocklisted; record the outcome.

    ``trusted`` (a signed source) skips vetting. Afterwards each program's
    binaries are known (load them), blocklisted (the loader refuses them), or,
    where no child could run, neither (they load under the crash guard).
    """
    if trusted or not items or not _enabled():
        return
    pending: list[tuple[list[str], Item]] = []
    for item in items:
        digests = [binary_digest(b) for b in item[0]]
        if needs_vetting(digests, trusted=False):
            pending.append((digests, item))
    if not pending:
        return
    results = vetter.vet(devices, [item for _, item in pending])
    for (digests, _), ok in zip(pending, results, strict=True):
        if ok is True:
            guard.vouch(digests)
            counters.add(vetted=1)
        elif ok is False:
            guard.block(digests)
            counters.add(vet_failures=1)
    failed = sum(1 for ok in results if ok is False)
    if failed:
        log.warning(
            "runtime-cache: %d of %d OpenCL programs of unknown origin failed to load in a "
            "vetting process (refused or crashed the driver); they will be built from source",
            failed,
            len(results),
        )
