"""Driver caches travel: the driver's own JIT output is captured into the cache and restored.

A program binary is not the end of every driver's work. NVIDIA's binaries are
PTX, which the driver compiles to machine code at load and keeps in its
ComputeCache folder (``CUDA_CACHE_PATH``). PoCL compiles a kernel again for
each work-group size at its first launch and keeps that code in its kernel
cache folder (``POCL_CACHE_DIR``). A fresh container has both folders empty.

With the driver cache switched on (``install(driver_cache=True)``,
``OpenCLModule(..., driver_cache=True)``, or ``RUNTIME_CACHE_DRIVER_CACHE=1``):

* :func:`prepare` (:mod:`.driver_folders`) points each driver at a folder it manages,
  ``<RUNTIME_CACHE_DRIVER_DIR or user cache dir>/<driver>``, before the driver
  starts (the first ``pyopencl.get_platforms()``); a variable the user set, and
  the folder it names, are left alone.
* :class:`DriverCacheSession` restores the files an earlier process captured
  before a module's first program loads, and captures what the driver added
  (after ``build_all`` and at exit, a ``multiprocessing`` child's end included; a forked
  child captures only the sessions it made). PoCL's files are kept per module and device
  (a file present is never replaced); NVIDIA's folder has one index for all, so
  it is kept per device (data files added, the index replaced last, in one
  rename). A later process stores what an earlier one left after its capture.

Trust: these files reach the driver unvetted, so they are read only from a cache
that signs its entries or whose backend is this user's alone. A restored set in
use when a process died (the crash guard's record) is blocklisted and deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

from ..cache import Cache
from ..errors import CorruptEntryError
from ..keys import CacheKey, make_key
from ..process_exit import at_exit
from .driver_files import (
    DriverFile,
    add_missing,
    pack_files,
    private_folder,
    remove_files,
    restore_indexed,
    snapshot,
    sweep_temporaries,
    unpack_files,
)
from .driver_folders import (
    ENV_DIR,
    ENV_SWITCH,
    driver_cache_enabled,
    driver_kind,
    driver_variables,
    known_drivers,
    managed_folder,
    prepare,
    tell_unmanaged,
    trusted_source,
)
from .driver_folders import per_module as carried_per_module
from .fingerprint import device_fingerprint
from .guard import binary_digest, guard

__all__ = [
    "ENV_DIR",
    "ENV_SWITCH",
    "PURPOSE",
    "DriverCacheSession",
    "DriverCaches",
    "driver_cache_enabled",
    "driver_kind",
    "driver_variables",
    "managed_folder",
    "prepare",
    "trusted_source",
]

log = logging.getLogger(__name__)

PURPOSE = "driver-cache"
#: Seconds after a restore at which its files stop taking the blame for a crash, if the
#: process has not settled them sooner (a driver that trips over its cache files does it
#: while loading the programs or at their first launch, within seconds).
SETTLE_AFTER = 60.0


class DriverCacheSession:
    """Restore and capture one driver's cache files for one module on one device.

    ``restore()`` once, before the module's first program loads; ``capture()``
    after builds and first launches (it stores only when the driver added files).
    Both are no-ops for a driver whose cache is not carried or not in a
    managed folder, and both are advisory: trouble is logged, never raised.
    """

    def __init__(
        self,
        cache: Cache,
        device: Any,
        module_id: str,
        *,
        driver: str | None = None,
        own_folder: bool = False,
    ) -> None:
        self.cache = cache
        fingerprint = device_fingerprint(device)
        if driver is not None and driver not in known_drivers():
            raise ValueError(f"unknown driver {driver!r}; known: {known_drivers()}")
        # ``driver`` overrides what the platform name says (tests play one driver on another).
        self.kind = driver or driver_kind(fingerprint)
        self.folder = managed_folder(self.kind) if self.kind else None
        if self.kind is not None and self.folder is None:
            tell_unmanaged(self.kind)
        self.key: CacheKey | None = None
        if self.kind is not None and self.folder is not None:
            # A folder made for this module alone (``own_folder``) holds only its files,
            # even for a driver that keeps one set per device: they are the module's.
            per_module = carried_per_module(self.kind) or own_folder
            self.key = make_key(
                module_id=module_id if per_module else "*device*",
                runtime="opencl",
                purpose=PURPOSE,
                device=fingerprint,
                driver=self.kind,
            )
        self.restored = 0
        self.restore_seconds = 0.0
        self._baseline: dict[str, tuple[int, int]] = {}
        self._mine: set[str] = set()
        self._harvest = False  # the folder holds files the stored set lacks
        self._restore_done = False
        self._lock = threading.Lock()
        self._watch = contextlib.ExitStack()
        self._settling = threading.Lock()  # settle() runs from a timer too
        self._pid = os.getpid()  # a forked child leaves this session to its parent
        _live.add(self)
        at_exit(_capture_at_exit, priority=EXIT_PRIORITY)  # (a multiprocessing child's end)

    @property
    def active(self) -> bool:
        """Whether this driver's files are carried here."""
        return self.key is not None

    def restore(self) -> int:
        """Put back the files an earlier process captured; return how many were added."""
        with self._lock:
            if self._restore_done:
                return self.restored
            self._restore_done = True
            if self.key is None or self.folder is None:
                return 0
            started = time.perf_counter()
            try:
                self.restored = self._restore(self.key, self.folder)
            except OSError as exc:
                log.warning("runtime-cache: driver cache not restored (%s)", exc)
            self._baseline = snapshot(self.folder)
            self.restore_seconds = time.perf_counter() - started
            return self.restored

    def _restore(self, key: CacheKey, folder: str) -> int:
        assert self.kind is not None
        per_module = carried_per_module(self.kind)
        sweep_temporaries({folder: True})
        if not trusted_source(self.cache):
            return 0
        value = self.cache.get(key)
        if value is None:
            # Files a driver wrote after an earlier process's last capture (at its exit,
            # say) are stored by this one's capture.
            self._harvest = not per_module and bool(snapshot(folder))
            return 0
        digest = binary_digest(value)
        try:
            files = unpack_files(value)
        except CorruptEntryError as exc:
            log.warning("runtime-cache: a driver-cache entry is malformed (%s); dropping it", exc)
            self.cache.delete(key)
            return 0
        if not private_folder(folder):
            log.warning("runtime-cache: %s is not private; driver cache not restored", folder)
            return 0
        blocked = guard.blocked([digest])
        if blocked or guard.held_back([digest]):  # (no child vets files)
            # A process died while they were in use: never restored here again, and removed
            # from the folder (restored earlier, the driver would load them). The entry is
            # left to other machines (a kill from outside dies the same way), unless blocked.
            log.warning("runtime-cache: a process died using a restored driver cache; not used")
            if blocked:
                self.cache.delete(key)
            remove_files(folder, files)
            return 0
        self._mine = {name for name, _, _ in files}
        added = add_missing(folder, files) if per_module else restore_indexed(folder, files)
        if not per_module:
            self._harvest = bool(set(snapshot(folder)) - self._mine)
        # Until the module's programs loaded and ran, a crash is blamed on these files
        # (not while they are written: a kill then is no fault of theirs).
        self._watch.enter_context(guard.loading([digest]))
        # A process that lives on past the loads and first launches did not crash on these
        # files: one killed later (a container stopped, the OOM killer) must not drop them.
        timer = threading.Timer(SETTLE_AFTER, self.settle)
        timer.daemon = True
        timer.start()
        self._watch.callback(timer.cancel)
        return added

    def settle(self) -> None:
        """The module's programs loaded and ran: restored files no longer take the blame."""
        with self._settling:
            self._watch.close()

    def capture(self) -> bool:
        """Store the files the driver added since the restore; return whether it stored."""
        with self._lock:
            if self.key is None or self.folder is None or not self._restore_done:
                return False
            if not trusted_source(self.cache) or not private_folder(self.folder):
                return False  # nobody could restore them from here, or others wrote them
            now = snapshot(self.folder)
            # Sizes, not times: PoCL rewrites a program's files on each load.
            changed = {n for n, s in now.items() if self._baseline.get(n, (-1,))[0] != s[0]}
            if not changed and not self._harvest:
                return False
            self._harvest = False
            assert self.kind is not None
            names = self._mine | changed if carried_per_module(self.kind) else set(now)
            value = pack_files(self.folder, [n for n in names if n in now])
            self._baseline = now
            if value is None:
                return False
            self._mine = names
            return self.cache.put(self.key, value, extra={"files": len(names)})

    def files(self) -> list[DriverFile]:
        """The files stored for this session's key (for inspection and tests)."""
        if self.key is None:
            return []
        value = self.cache.get(self.key)
        return unpack_files(value) if value is not None else []


class DriverCaches:
    """The sessions of one module on every device of a context (what ``OpenCLModule`` holds).

    ``own_folder``: the drivers' folders were made for this module alone (as the demo's
    runs do), so a per-device driver's files are stored under the module's key. Example::

        caches = DriverCaches(ctx, "resnet18@3f2a")
        caches.restore(cache)      # before the first program loads; build, load and launch
        caches.capture()           # store what the driver added
    """

    def __init__(self, context: Any, module_id: str, *, own_folder: bool = False) -> None:
        self.devices = list(context.devices)
        self.module_id, self.own_folder = module_id, own_folder
        self.sessions: list[DriverCacheSession] | None = None
        self._lock = threading.Lock()

    def restore(self, cache: Cache) -> int:
        """Restore once per device (later calls do nothing); return how many files were added."""
        with self._lock:
            if self.sessions is None:
                self.sessions = [
                    DriverCacheSession(cache, d, self.module_id, own_folder=self.own_folder)
                    for d in self.devices
                ]
            sessions = self.sessions
        return sum(s.restore() for s in sessions)

    def start_restore(self, cache: Cache) -> threading.Thread:
        """Run :meth:`restore` on a thread (join it before the first program loads)."""

        def run() -> None:
            try:
                self.restore(cache)
            except Exception as exc:  # advisory: the programs load without it
                log.warning("runtime-cache: driver cache not restored (%s)", exc)

        thread = threading.Thread(target=run, name="runtime-cache-driver-restore", daemon=True)
        thread.start()
        return thread

    def capture(self, *, settle: bool = False) -> int:
        """Capture on every device; return how many stored (``settle``: see the session's)."""
        with self._lock:
            sessions = list(self.sessions or ())
        stored = 0
        for session in sessions:
            try:
                stored += session.capture()
            except (OSError, CorruptEntryError) as exc:
                log.warning("runtime-cache: driver cache not captured (%s)", exc)
            if settle:
                session.settle()
        return stored


#: Every session of this process, captured at exit (after the first launches, for PoCL).
_live: set[DriverCacheSession] = set()
#: Among a ``multiprocessing`` child's finalizers: after the programs' own stores.
EXIT_PRIORITY = 40


def _capture_at_exit() -> None:
    for session in sorted(_live, key=id):
        if session._pid != os.getpid():
            continue  # made before a fork: its process captures it
        try:
            session.capture()
            session.settle()
        except Exception as exc:  # exit must go on
            log.debug("runtime-cache: driver cache capture at exit failed (%s)", exc)


at_exit(_capture_at_exit, priority=EXIT_PRIORITY)
