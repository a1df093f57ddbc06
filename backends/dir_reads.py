"""The read side of :class:`~runtime_cache.backends.directory.DirectoryBackend`.

Every entry file is opened beneath the root without following a link
(:func:`.dir_fs.open_beneath`) and read only when it is a regular file of at most
``max_entry_size`` bytes (:func:`.bounded_reads.regular_size`); anything else at an entry's
name is junk, reported and removed by the backend. A get with access tracking on bumps the file's
mtime (the LRU order) and counts a hit in the journal. :meth:`DirReads.get_range` reads an
entry whose size the caller knows, with no ``fstat``: at most that size and one byte, so
another size, a FIFO or a folder answers ``None`` (the whole read then judges it); a
device node (only root can make one) is read there too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from runtime_cache.api import Span
from runtime_cache.partial_reads import read_each

from . import bounded_reads as reads
from .bounded_reads import Junk
from .dir_fs import NOFOLLOW, open_beneath

if TYPE_CHECKING:
    from runtime_cache.errors import BackendError

    from .hits_journal import HitsJournal

__all__ = ["LINKED", "DirReads"]

_O_READ = os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW
#: What opening beneath the root answers for a link in the way.
LINKED = {errno.ELOOP, errno.EXDEV}
#: Opens a read of a value again answers ``None`` for: the whole read that follows reports
#: the junk among them (a link; ``ENXIO``, a socket).
_UNREAD = {errno.ENOENT, errno.ENOTDIR, errno.ENXIO, *LINKED}
T = TypeVar("T")
#: Reads an open entry file: ``reader(fd, size, max_entry_size[, span])``.
Reader = Callable[..., T]


class DirReads:
    """The reads of :class:`~runtime_cache.backends.directory.DirectoryBackend`."""

    root_fd: int
    max_entry_size: int
    track_access: bool
    _rels: dict[str, str]
    _read_only: bool
    _journal: HitsJournal

    if TYPE_CHECKING:

        def _rel(self, key: str) -> str: ...

        def _error(self, op: str, exc: OSError, name: str = "") -> BackendError: ...

        def found_junk(self, rel: str, what: str, st: os.stat_result | None = None) -> None: ...

    def _open(self, rel: str) -> tuple[int, int] | None:
        # (descriptor, size) of a regular entry file; None for a miss or junk (reported).
        try:
            fd = open_beneath(self.root_fd, rel, _O_READ)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno in LINKED:
                self.found_junk(rel, "a symbolic link (or under one)")
                return None
            if exc.errno == errno.ENXIO:  # (no open reads one)
                self.found_junk(rel, "a socket")
                return None
            raise self._error("read", exc, rel) from exc
        try:
            return fd, reads.regular_size(fd, self.max_entry_size)
        except Junk as exc:
            st = reads.fstat_or_none(fd)
            os.close(fd)
            self.found_junk(rel, str(exc), st)
        except OSError as exc:
            os.close(fd)
            raise self._error("read", exc, rel) from exc
        return None

    def get(self, key: str) -> bytes | None:
        return self._read(key, self.track_access, reads.read_to_end)

    def get_parts(self, key: str, span: Span) -> tuple[bytes, ...] | None:
        return self._read(key, self.track_access, reads.read_parts, span)

    def get_range(self, key: str, start: int, end: int, size: int) -> tuple[bytes, bytes] | None:
        # Quiet: a miss, junk or another size is read whole next, which counts and reports it.
        # No fstat: ``size`` bounds the read, and a byte more than is left shows another size.
        if size > self.max_entry_size:
            return None  # (no entry file is read past that, whole or in part)
        rel = self._rels.get(key) or self._rel(key)
        try:
            fd = open_beneath(self.root_fd, rel, _O_READ)
        except OSError as exc:
            if exc.errno in _UNREAD:
                return None
            raise self._error("read", exc, rel) from exc
        try:
            parts = reads.read_range(fd, start, end, size)
            if parts is not None and self.track_access:
                self._touch(fd, key)
        except OSError as exc:
            raise self._error("read", exc, rel) from exc
        finally:
            os.close(fd)
        return parts

    def get_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        return read_each(self.get, keys)  # a file we may not read costs its key alone

    def get_many_parts(self, keys: Iterable[str], span: Span) -> dict[str, tuple[bytes, ...]]:
        return read_each(lambda key: self.get_parts(key, span), keys)  # (its junk rule too)

    def peek(self, key: str) -> bytes | None:
        return self._read(key, False, reads.read_to_end)

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        read = ((key, self._read(key, False, reads.read_to_end)) for key in keys)
        return {key: value for key, value in read if value is not None}

    def _read(
        self,
        key: str,
        count_use: bool,
        reader: Reader[T],
        where: object = None,
    ) -> T | None:
        # ``reader(fd, size, cap)``, or ``reader(fd, size, cap, where)`` (a span).
        rel = self._rels.get(key) or self._rel(key)
        opened = self._open(rel)
        if opened is None:
            return None
        fd, size = opened
        cap = self.max_entry_size
        try:
            data = reader(fd, size, cap) if where is None else reader(fd, size, cap, where)
            if count_use and data is not None:
                self._touch(fd, key)
        except Junk as exc:
            self.found_junk(rel, str(exc), reads.fstat_or_none(fd))
            return None
        except OSError as exc:
            raise self._error("read", exc, rel) from exc
        finally:
            os.close(fd)
        return data

    def head(self, key: str, size: int) -> bytes | None:
        return self._read(key, False, lambda fd, _size, _cap: os.read(fd, size))

    def stored_size(self, key: str) -> int | None:
        """The size of ``key``'s file (none read), or ``None`` where there is no entry."""
        return self._read(key, False, lambda _fd, size, _cap: size)

    def _touch(self, fd: int, key: str) -> None:
        if not self._read_only:
            try:
                os.utime(fd)
            except OSError:
                pass  # not our file, or read-only: LRU falls back to write time
        self._journal.record(key)
