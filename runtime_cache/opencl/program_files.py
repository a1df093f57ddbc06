"""Each program's driver files travel with its binaries while a fleet builds cold.

A program binary is not always the end of a driver's work: NVIDIA's binaries
are PTX, and loading one JIT-compiles it to machine code (tens of
milliseconds a program, a good part of a source build). When N processes
share a cold build (:mod:`runtime_cache.opencl.sharing`), each loads the
programs the others built, so each pays that JIT for most programs. NVIDIA's
driver finds a ComputeCache entry by its file's hashed path, not through the
folder's index, so the files a source build adds are enough for a later load
of the same binary, in any process, to skip the JIT.

With the driver cache on (see :mod:`runtime_cache.opencl.driver_cache`) and the
driver's folder managed, :class:`ProgramFiles`:

* gives each build worker a private driver folder (:meth:`ProgramFiles.worker_env`;
  on NVIDIA it starts with the few data files this process's folder held when
  the build began, such as what creating a context JIT-compiled);
  the worker builds one program at a time, so the files its folder gained
  during one build are that program's (:func:`capture_build`; NVIDIA's
  ``index`` is left out: it names every file of the folder);
* stores those files under the program's own ``driver-cache`` key before its
  binaries are stored, and adds them to this process's folder before loading
  them (:meth:`ProgramFiles.publish`);
* in the other processes, adds them to their folder before they load the
  binaries that another process stored (:meth:`ProgramFiles.loading`, one
  batched read for a batch of programs). Files present are never replaced,
  and the index is never touched.

Only programs built or loaded during a shared or worker build take part: a
warm start reads no more than before. The files reach the driver unvetted, so
the trust rules are the driver cache's: only from a cache that signs its
entries or whose backend is private, a malformed set is dropped, and a set
that was loading when a process died is blocklisted (the crash guard) and
deleted when next seen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..cache import Cache
from ..errors import CorruptEntryError
from ..keys import CacheKey, make_key
from .counters import counters
from .driver_cache import (
    PURPOSE,
    driver_kind,
    driver_variables,
    managed_folder,
    trusted_source,
)
from .driver_files import (
    INDEX,
    WORKER_ENV,
    DriverFile,
    add_missing,
    capture_build,
    snapshot,
    unpack_files,
)
from .fingerprint import device_fingerprint
from .guard import binary_digest, guard

__all__ = ["ProgramFiles", "with_driver_files"]

log = logging.getLogger(__name__)

#: Drivers whose data files are written once under a content hash, so a worker's folder
#: may start with links to this process's: NVIDIA's.
SEEDED = frozenset({"nvidia"})
#: A worker's folder is seeded only when this process's folder holds at most this many.
MAX_SEED = 16


def _program_files(files: Sequence[DriverFile]) -> list[DriverFile]:
    return [f for f in files if f[0] != INDEX]


class ProgramFiles:
    """Per-program driver files of one single-device context (see the module's doc).

    Example::

        files = ProgramFiles.open(cache, ctx, enabled=True)
        if files is not None:
            with files.loading([str(key)]):   # before loading binaries others stored
                ...
    """

    def __init__(self, cache: Cache, fingerprint: dict[str, Any], kind: str, folder: str) -> None:
        self.cache = cache
        self.kind = kind
        self.folder = folder
        self._fingerprint = fingerprint
        self._temps: list[str] = []
        self._lock = threading.Lock()
        self._seed: list[str] | None = None
        self._foreign: set[str] = set()  # names added here from stored sets

    @classmethod
    def open(
        cls, cache: Cache, context: Any, *, enabled: bool, driver: str | None = None
    ) -> ProgramFiles | None:
        """The carrier for ``context``, or ``None`` when files cannot travel here.

        ``None`` when ``enabled`` is false, the context has more than one device,
        the driver's cache is not carried or its folder is not managed, or the
        cache may not supply driver files (:func:`.driver_cache.trusted_source`).
        ``driver`` overrides what the platform name says (tests).
        """
        if not enabled:
            return None
        devices = list(context.devices)
        if len(devices) != 1:
            return None
        fingerprint = device_fingerprint(devices[0])
        kind = driver or driver_kind(fingerprint)
        if kind is None:
            return None
        folder = managed_folder(kind)
        if folder is None or not trusted_source(cache):
            return None
        return cls(cache, fingerprint, kind, folder)

    def key(self, binary_key: str) -> CacheKey:
        """The key of the driver files of the program whose binaries are under ``binary_key``."""
        return make_key(
            module_id=binary_key,
            runtime="opencl",
            purpose=PURPOSE,
            device=self._fingerprint,
            driver=self.kind,
            scope="program",
        )

    def worker_env(self) -> dict[str, str]:
        """The environment of one build worker: a private, empty driver folder of its own.

        The folder is removed by :meth:`close`.
        """
        folder = tempfile.mkdtemp(prefix="rc-driver-worker-")
        with self._lock:
            self._temps.append(folder)
        if self.kind in SEEDED:
            self._seed_folder(folder)
        return {**driver_variables(self.kind, folder), WORKER_ENV: folder}

    def _seed_folder(self, folder: str) -> None:
        """Give a worker the data files this process's folder had when the cold build
        began (NVIDIA: what creating a context JIT-compiled), so the worker's own
        context creation finds them; a few at most, linked where the disk allows."""
        with self._lock:
            if self._seed is None:
                found = [n for n in snapshot(self.folder) if n != INDEX]
                self._seed = found if len(found) <= MAX_SEED else []
            seed = list(self._seed)
        for name in seed:
            source, target = os.path.join(self.folder, name), os.path.join(folder, name)
            try:
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copyfile(source, target)
            except OSError:
                continue  # removed meanwhile, or no room: the worker JIT-compiles it

    def close(self) -> None:
        """Remove the workers' private folders (after the workers ended)."""
        with self._lock:
            temps, self._temps = self._temps, []
        for folder in temps:
            shutil.rmtree(folder, ignore_errors=True)

    def own_snapshot(self) -> dict[str, tuple[int, int]]:
        """This process's driver folder now (before a build here; see :meth:`own_capture`)."""
        return snapshot(self.folder)

    def own_capture(self, before: dict[str, tuple[int, int]]) -> bytes | None:
        """The files a build in this process added since ``before``, less those added from
        stored sets meanwhile; one build at a time here, so they are that program's
        (and, on PoCL, what loads meanwhile wrote: a few more files, harmless)."""
        with self._lock:
            foreign = frozenset(self._foreign)
        return capture_build(self.folder, before, exclude=foreign)

    def publish(self, binary_key: str, packed: bytes) -> int:
        """Store one program's files (before its binaries) and add them here; return files added.

        Advisory: a malformed set or a full disk is logged and skipped.
        """
        try:
            files = _program_files(unpack_files(packed))
        except CorruptEntryError as exc:
            log.debug("runtime-cache: a worker's driver files are malformed (%s)", exc)
            return 0
        if not files:
            return 0
        with self._lock:
            self._foreign.update(name for name, _, _ in files)
        if self.cache.put(self.key(binary_key), packed, extra={"files": len(files)}):
            counters.add(driver_files_published=1)
        try:
            return add_missing(self.folder, files)
        except OSError as exc:
            log.debug("runtime-cache: driver files not added (%s)", exc)
            return 0

    def restore(self, binary_keys: Sequence[str]) -> list[str]:
        """Add the files stored for these programs (one batched read); return the
        digests of the sets added, for the crash guard to watch while they load."""
        wanted = {str(self.key(k)) for k in binary_keys}
        if not wanted:
            return []
        digests: list[str] = []
        for skey, value in self.cache.get_many(sorted(wanted)).items():
            digest = binary_digest(value)
            blocked = guard.blocked([digest])
            if blocked or guard.held_back([digest]):  # (no child vets files)
                # Never used here again; the entry is left to other machines (see .driver_cache).
                log.warning("runtime-cache: a process died using a program's driver files")
                if blocked:
                    self.cache.delete(skey)
                continue
            try:
                files = _program_files(unpack_files(value))
            except CorruptEntryError as exc:
                log.warning("runtime-cache: a program's driver files are malformed (%s)", exc)
                counters.add(driver_files_dropped=1)
                self.cache.delete(skey)
                continue
            with self._lock:
                self._foreign.update(name for name, _, _ in files)
            try:
                add_missing(self.folder, files)
            except OSError as exc:
                log.debug("runtime-cache: driver files not added (%s)", exc)
                continue
            digests.append(digest)
        counters.add(driver_files_restored=len(digests))
        return digests

    @contextlib.contextmanager
    def loading(self, binary_keys: Sequence[str]) -> Iterator[None]:
        """Restore these programs' files, then watch them for the block (the loads).

        A process that dies inside the block leaves the sets on the crash
        guard's record: the next process blocklists them and never adds them again.
        """
        try:
            digests = self.restore(binary_keys)
        except Exception as exc:  # advisory: the programs load without them
            log.warning("runtime-cache: driver files not restored (%s)", exc)
            digests = []
        with guard.loading(digests):
            yield


def with_driver_files(
    files: ProgramFiles | None,
    keys: Mapping[str, Sequence[str]],
    load: Callable[[list[str]], list[str]],
) -> Callable[[list[str]], list[str]]:
    """``load(names)``, preceded by restoring those programs' driver files (``keys``:
    each program's binary keys), under the crash guard's watch; ``load`` itself
    when ``files`` is ``None``."""
    if files is None:
        return load

    def carried(names: list[str]) -> list[str]:
        if not names:
            return load(names)
        with files.loading([keys[n][0] for n in names if keys.get(n)]):
            return load(names)

    return carried
