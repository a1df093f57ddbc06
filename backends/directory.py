"""``dir://``: entries as files in a directory tree, safe for many processes and users.

Layout: see :mod:`runtime_cache.backends.dir_tree`. Guarantees:

* The root is opened once and held as a directory descriptor; every file and
  folder under it is opened relative to it, never through a link (see
  :mod:`runtime_cache.backends.dir_fs`). A link or a renamed folder cannot
  redirect a read or a write out of the cache, and a root given through a link
  keeps the folder it named at open.
* Writes go to a new temp file (random name, ``O_EXCL | O_NOFOLLOW``) in the
  root, then ``os.replace`` into place: a reader sees the old file or the new
  one, never a torn one. A killed writer leaves only a temp file, which
  :meth:`vacuum` removes at once (its lock died with it).
* Reads open ``O_NOFOLLOW | O_NONBLOCK`` and read only a regular file of at
  most ``max_entry_size`` bytes. Anything else at an entry's name (a link, a
  FIFO, a folder, a huge or sparse file) is junk: a miss, counted in
  :attr:`DirectoryBackend.junk`, logged with its name, and removed where this
  process may remove it, so the key can be stored again.
* A vanished file is a miss. A file this process may not read raises a
  :class:`~runtime_cache.errors.BackendError` that names it; only a failed write
  makes the backend read-only (serve reads, skip writes at once).
* ``max_size`` counts disk (allocated blocks) and ``max_files`` the file count;
  eviction is least recently used first, one process at a time, and never waits
  without a deadline (see :mod:`runtime_cache.backends.eviction`).
* A root that another user (not root) owns, or that its group or anyone may
  write, is refused unless ``shared=1``. With ``shared=1`` folders are made
  setgid and group-writable and files group-readable and writable (the umask
  still applies to others); files owned by users outside the root's group are
  left out of the cap.

URL: ``dir:///abs/path?max_size=2GB&max_files=N&fsync=0&track_access=1&shared=0``;
plain ``dir://`` is the embedded default, ``platformdirs.user_cache_dir("runtime-cache")``.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

from runtime_cache.api import Backend, BackendURL, StoredItem, parse_size
from runtime_cache.errors import BackendError, InvalidURLError, ReadOnlyBackendError

from .dir_fs import (
    NOFOLLOW,
    Junk,
    make_folders,
    open_beneath,
    open_folder,
    read_regular,
    read_umask,
    set_aside,
)
from .dir_tree import rel_path, walk
from .dir_upkeep import Upkeep, owner_check
from .hits_journal import HitsJournal
from .temp_files import create_locked_temp

__all__ = ["DirectoryBackend"]

log = logging.getLogger("runtime_cache")

_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, errno.EDQUOT}
_O_READ = os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW
_LINKED = {errno.ELOOP, errno.EXDEV}
_RETRY = {errno.ENOENT, errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, *_LINKED}
_TEMP_PREFIX = ".tmp-"
# O_PATH where there is one: a root we may not list still opens, and each call
# then fails (and is counted) on its own, as with any other unreadable folder.
_ROOT = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
#: The largest file read as an entry: the codec's default limits (1 GiB value,
#: 64 KiB metadata) plus room for the header and signature.
MAX_ENTRY_SIZE = (1 << 30) + (1 << 17)
_OPEN: weakref.WeakSet[DirectoryBackend] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for backend in list(_OPEN):
        backend.flush_hits()


def _after_fork() -> None:
    for backend in list(_OPEN):
        backend._reopen_after_fork()


os.register_at_fork(after_in_child=_after_fork)


def _default_root() -> str:
    import platformdirs

    return platformdirs.user_cache_dir("runtime-cache", appauthor=False)


class DirectoryBackend(Backend):
    """Files in a directory tree; see the module docstring for the guarantees.

    Args:
        path: the root folder (created ``0700``); ``None`` for the default.
        max_size: cap on the disk the entries take (int or ``"500MB"``), ``None`` for no cap.
        max_files: cap on the number of entry files; by default ``max_size / 4 KiB``
            (at least 1024).
        fsync: fsync each file before it is renamed into place (durable on
            power loss, slower).
        track_access: bump mtime and count hits on every get (for LRU and listings).
        shared: accept a root that another user owns or that its group or anyone
            may write (a team's shared folder), and keep what this process makes
            group-writable. Share with ``Cache(secret=...)``.
        max_entry_size: the largest file read as an entry; larger ones are junk.
    """

    scheme = "dir"
    #: Seconds an eviction lock may go untouched before it is taken for a stopped evictor's.
    lock_stale_after = 30.0
    #: Seconds a writer far over the cap waits for another process's eviction.
    lock_wait = 1.0

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_size: int | str | None = "2GB",
        max_files: int | None = None,
        fsync: bool = False,
        track_access: bool = True,
        hits_batch: int = 64,
        shared: bool = False,
        max_entry_size: int = MAX_ENTRY_SIZE,
    ) -> None:
        self.root = Path(os.path.expanduser(os.fspath(path))) if path else Path(_default_root())
        self.max_size = None if max_size is None else parse_size(max_size)
        if max_files is None and self.max_size is not None:
            max_files = max(1024, self.max_size // 4096)
        self.max_files = max_files
        self.fsync = fsync
        self.track_access = track_access
        self.shared = shared
        self.max_entry_size = max_entry_size
        #: Junk found at entry names (links, FIFOs, folders, oversized files).
        self.junk = 0
        self._read_only = False
        self._closed = False
        self._rels: dict[str, str] = {}
        if shared:
            mask = read_umask()
            self.file_mode, self.dir_mode = 0o666, 0o2777
            self.file_chmod: int | None = ((0o666 & ~mask) | 0o660) & ~0o002
            self.dir_chmod: int | None = ((0o777 & ~mask) | 0o2770) & ~0o002
        else:
            self.file_mode, self.dir_mode = 0o600, 0o700
            self.file_chmod = self.dir_chmod = None
        self._fd = self._open_root()
        try:
            members = owner_check(self._fd, self.root, shared)
        except BaseException:
            os.close(self._fd)
            raise
        self._journal = HitsJournal(
            self._fd, ".hits", batch=hits_batch, mode=self.file_mode, chmod=self.file_chmod
        )
        self._journal.writable = not self._read_only
        self._upkeep = Upkeep(self, members)
        self._upkeep.maybe_vacuum()
        _OPEN.add(self)

    @classmethod
    def from_url(cls, url: str) -> DirectoryBackend:
        """Open from ``dir:///abs/path?max_size=..&fsync=0|1&track_access=0|1&shared=0|1``."""
        parsed = BackendURL.parse(url)
        if parsed.netloc:
            raise InvalidURLError(
                f"dir:// takes a local folder, not a host ({parsed.netloc.rpartition('@')[2]!r}); "
                "write dir:///abs/path"
            )
        max_size = parsed.pop("max_size", "2GB")
        max_files = parsed.pop("max_files", "")
        fsync = parsed.pop("fsync", "0") in ("1", "true", "yes")
        track = parsed.pop("track_access", "1") not in ("0", "false", "no")
        shared = parsed.pop("shared", "0") in ("1", "true", "yes")
        parsed.reject_unknown()
        cap = None if (max_size or "").lower() in ("", "none", "0") else max_size
        files = parse_size(max_files) if max_files else None
        return cls(
            parsed.path or None,
            max_size=cap,
            max_files=files,
            fsync=fsync,
            track_access=track,
            shared=shared,
        )

    def _open_root(self) -> int:
        flags = _ROOT
        try:
            return os.open(self.root, flags)
        except FileNotFoundError:
            pass
        except NotADirectoryError:
            raise BackendError(f"cache root {self.root} is not a directory") from None
        except OSError as exc:
            raise self._error("open", exc) from exc
        try:
            os.makedirs(self.root, mode=self.dir_mode, exist_ok=True)
            if self.dir_chmod is not None:
                os.chmod(self.root, self.dir_chmod)
        except FileExistsError:
            raise BackendError(f"cache root {self.root} is not a directory") from None
        except OSError as exc:
            raise self._error("open", exc) from exc
        try:
            return os.open(self.root, flags)
        except NotADirectoryError:
            raise BackendError(f"cache root {self.root} is not a directory") from None
        except OSError as exc:
            raise self._error("open", exc) from exc

    def _reopen_after_fork(self) -> None:
        # A forked child gets fresh locks (another thread may have held ours at the
        # fork) and its own root descriptor; the parent's unflushed hits stay the parent's.
        self._journal.forget_pending()
        self._upkeep.after_fork()
        try:
            fd = os.open(".", _ROOT, dir_fd=self._fd)
        except OSError:
            return
        old, self._fd = self._fd, fd
        self._journal.dir_fd = fd
        os.close(old)

    @property
    def read_only(self) -> bool:
        """Whether a failed write found the storage read-only (reads are still served)."""
        return self._read_only

    @property
    def root_fd(self) -> int:
        """The descriptor of the root folder that everything is opened under."""
        return self._fd

    # ----------------------------------------------------------------- paths
    def _rel(self, key: str) -> str:
        rel = self._rels.get(key)
        if rel is None:
            rel = rel_path(key)
            if len(self._rels) >= 4096:
                self._rels.clear()
            self._rels[key] = rel
        return rel

    def _error(self, op: str, exc: OSError, name: str = "") -> BackendError:
        where = f"{op} of {self.root / name}" if name else f"{op} in {self.root}"
        if op in ("write", "open") and exc.errno in _READ_ONLY:
            return ReadOnlyBackendError(f"{where}: read-only or no permission ({exc.strerror})")
        if exc.errno in _FULL:
            return BackendError(f"{where}: disk full ({exc.strerror})")
        return BackendError(f"{where}: {exc.strerror or exc}")

    def found_junk(self, rel: str, what: str) -> None:
        """Count and log junk at the entry name ``rel``, and remove it where we may."""
        self.junk += 1
        removed = self._upkeep.clear(rel)
        log.warning(
            "runtime-cache: %s is %s, not a cache entry; %s",
            self.root / rel,
            what,
            "removed it" if removed else "left it (not ours to remove)",
        )

    # ----------------------------------------------------------------- reads
    def _open(self, rel: str) -> int | None:
        try:
            return open_beneath(self._fd, rel, _O_READ)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno in _LINKED:
                self.found_junk(rel, "a symbolic link (or under one)")
                return None
            raise self._error("read", exc, rel) from exc

    def get(self, key: str) -> bytes | None:
        return self._read(key, self.track_access)

    def peek(self, key: str) -> bytes | None:
        return self._read(key, False)

    def peek_many(self, keys: Iterable[str]) -> dict[str, bytes]:
        found = {}
        for key in keys:
            value = self._read(key, False)
            if value is not None:
                found[key] = value
        return found

    def _read(self, key: str, count_use: bool) -> bytes | None:
        rel = self._rel(key)
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            data = read_regular(fd, self.max_entry_size)
            if count_use:
                self._touch(fd, key)
        except Junk as exc:
            os.close(fd)
            fd = -1
            self.found_junk(rel, str(exc))
            return None
        except OSError as exc:
            raise self._error("read", exc, rel) from exc
        finally:
            if fd >= 0:
                os.close(fd)
        return data

    def head(self, key: str, size: int) -> bytes | None:
        rel = self._rel(key)
        fd = self._open(rel)
        if fd is None:
            return None
        try:
            read_regular(fd, -1)  # checks the kind first; every file is over -1 bytes
        except Junk as exc:
            if "limit" not in str(exc):
                os.close(fd)
                self.found_junk(rel, str(exc))
                return None
        try:
            return os.read(fd, size)
        except OSError as exc:
            raise self._error("read", exc, rel) from exc
        finally:
            os.close(fd)

    def _touch(self, fd: int, key: str) -> None:
        if not self._read_only:
            try:
                os.utime(fd)
            except OSError:
                pass  # not our file, or read-only: LRU falls back to write time
        self._journal.record(key)

    def flush_hits(self) -> None:
        """Append the hits counted in memory to the shared journal."""
        self._journal.flush()

    # ---------------------------------------------------------------- writes
    def set(self, key: str, value: bytes) -> None:
        rel = self._rel(key)
        if self._read_only:
            raise ReadOnlyBackendError(f"{self.root} is read-only; write skipped")
        folder, _, name = rel.rpartition("/")
        try:
            try:
                self._write(folder, name, value)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError, OSError) as exc:
                if exc.errno not in _RETRY:
                    raise
                # The folder was removed under us (a clear, an rm -rf), a cleaner took
                # our temp file, or junk holds the name (a folder, a link): once more.
                if exc.errno != errno.ENOENT:
                    self.found_junk(rel, "a folder or a link")
                self._write(folder, name, value)
        except OSError as exc:
            error = self._error("write", exc, rel)
            if isinstance(error, ReadOnlyBackendError) and self._root_read_only(exc):
                self._read_only = True
                self._journal.writable = False
                log.warning(
                    "runtime-cache: %s is read-only; serving reads, skipping writes", self.root
                )
            raise error from exc
        self._upkeep.account(len(value))

    def _root_read_only(self, exc: OSError) -> bool:
        # A folder another member made without group write fails this key alone;
        # only a root we cannot write into makes the whole backend read-only.
        return exc.errno == errno.EROFS or not os.access(".", os.W_OK, dir_fd=self._fd)

    def _write(self, folder: str, name: str, value: bytes) -> None:
        dfd = make_folders(self._fd, folder, self.dir_mode, self.dir_chmod)
        try:
            fd, temp = create_locked_temp(self._fd, _TEMP_PREFIX, self.file_mode, self.file_chmod)
            try:
                view = memoryview(value)
                while view:
                    view = view[os.write(fd, view) :]
                if self.fsync:
                    os.fsync(fd)
                # Replaced while still open, so the lock tells vacuum() we are alive.
                os.replace(temp, name, src_dir_fd=self._fd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(temp, dir_fd=self._fd)
                except OSError:
                    pass
                raise
            finally:
                os.close(fd)
        finally:
            os.close(dfd)

    def delete(self, key: str) -> bool:
        folder, _, name = self._rel(key).rpartition("/")
        try:
            dfd = open_folder(self._fd, folder)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, *_LINKED):
                return False
            raise self._error("delete", exc, folder) from exc
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.EPERM) and set_aside(dfd, name, ".junk-"):
                return True
            raise self._error("delete", exc, f"{folder}/{name}") from exc
        finally:
            os.close(dfd)
        return True

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Delete ``key`` only if its file holds exactly ``expected``; return whether it did.

        The file is renamed aside to a fresh name in its folder, looked at again
        (same inode, same bytes), then removed. Were it replaced in between, the
        newer file is put back, unless yet another write is already in place.
        """
        return self._upkeep.delete_if(self._rel(key), bytes(expected))

    # --------------------------------------------------------------- listing
    def keys(self, prefix: str = "") -> Iterator[str]:
        return (found.key for found in walk(self._fd, prefix) if found.regular)

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        hits = self._journal.read() if self.track_access else {}
        for found in walk(self._fd, prefix):
            if not found.regular:
                continue
            count, _ = hits.get(found.key, (0, 0.0))
            st = found.stat
            yield StoredItem(
                found.key, st.st_size, st.st_mtime, count if self.track_access else None
            )

    # ------------------------------------------------------------ upkeep
    def total_size(self) -> int:
        """The disk the entries take now (a full walk)."""
        return self._upkeep.usage()[0]

    def enforce_size(self) -> int:
        """Evict least recently used files until under 90% of the caps; return how many.

        One process at a time evicts; when another one is at it, this waits up to
        :attr:`lock_wait` seconds, then returns 0.
        """
        return self._upkeep.enforce(wait=self.lock_wait)

    @property
    def eviction_skipped(self) -> int:
        """How many times eviction was skipped because another process held the lock."""
        return self._upkeep.locks.skipped

    def vacuum(self) -> int:
        """Remove temp files that dead writers left, and compact the hits journal.

        A temp file whose writer is gone (its lock is free) goes at once; where
        the file system has no locks, one not written for 5 minutes goes.
        """
        return self._upkeep.vacuum()

    def compact_hits(self) -> None:
        """Rewrite the hits journal as one line per live key once it passes 1 MiB."""
        self._journal.compact(set(self.keys()), f"{_TEMP_PREFIX}hits-")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush_hits()

    def __repr__(self) -> str:
        return f"<DirectoryBackend {str(self.root)!r}>"

    def __del__(self) -> None:
        fd = getattr(self, "_fd", -1)
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
