"""This process's marks of the binaries it is loading, for the crash guard (:mod:`.guard`).

While binaries load, their digests stand in this process's own file in the guard folder,
mapped into memory (``MAP_SHARED``): a mark costs a memory write, not a system call, and
survives the process's death in the kernel's page cache. :class:`LoadingMarks` is the part
of :class:`~runtime_cache.opencl.guard.LoadGuard` that writes them.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Sequence

from .guard_files import reserve

__all__ = ["PAGE", "LoadingMarks"]

PAGE = 4096


class _Loading:
    """:meth:`LoadingMarks.loading`'s block (a plain class: a generator costs µs a load)."""

    __slots__ = ("_digests", "_guard")

    def __init__(self, guard: LoadingMarks, digests: Sequence[str]) -> None:
        self._guard, self._digests = guard, digests

    def __enter__(self) -> None:
        self._guard._count_loading(self._digests, 1)

    def __exit__(self, *exc: object) -> None:
        self._guard._count_loading(self._digests, -1)


class LoadingMarks:
    """Marks the binaries being loaded in this process's file (under the guard's lock)."""

    _lock: threading.Lock
    _fd: int | None
    _map: mmap.mmap | None
    _used: int
    _loading: dict[str, int]

    def _start(self) -> None:
        """Open the guard's folder and this process's file (the guard's, once a process)."""
        raise NotImplementedError

    def _map_file(self, size: int) -> None:
        """Map (or re-map, larger) this process's file; without a map, writes use pwrite."""
        assert self._fd is not None
        if self._map is not None:
            self._map.close()
            self._map = None
        if not reserve(self._fd, size):  # a full disk: a write to the map would fault
            return
        try:
            os.ftruncate(self._fd, size)
            self._map = mmap.mmap(self._fd, size)  # shared, read-write
        except (OSError, ValueError, AttributeError):
            self._map = None

    def _write(self) -> None:
        if self._fd is None:
            return
        data = "".join(f"{d}\n" for d in self._loading).encode("ascii")
        if self._map is not None and len(data) > len(self._map):
            self._map_file(max(len(data), 2 * len(self._map)))
        if self._map is None:
            try:
                os.pwrite(self._fd, data, 0)
                os.ftruncate(self._fd, len(data))
            except OSError:
                pass
            return
        size = len(data)
        self._map[:size] = data
        if self._used > size:  # clear what the last write left beyond this one
            self._map[size : self._used] = bytes(self._used - size)
        self._used = size

    def loading(self, digests: Sequence[str]) -> _Loading:
        """``with guard.loading(digests):`` marks them as loading for the duration of the
        block (the marks survive a crash)."""
        return _Loading(self, digests)

    def _count_loading(self, digests: Sequence[str], step: int) -> None:
        with self._lock:
            if step > 0:
                self._start()
            for d in digests:
                if (left := self._loading.get(d, 0) + step) > 0:
                    self._loading[d] = left
                else:
                    self._loading.pop(d, None)
            self._write()
