"""``dir://``: entries as files in a directory tree, safe for many processes.

Layout: a key ``"opencl/program-binary/3f2a..."`` lives at
``<root>/opencl/program-binary/3f/3f2a....rce``: one folder per key component,
then a two-character fan-out folder. Names that begin with ``.`` are ours
(temp files, the hits journal) and never keys.

Guarantees:

* Writes go to a temp file in the target folder, then ``os.replace``: a reader
  sees the old file or the new one, never a torn one. A writer killed midway
  leaves only a temp file, which readers never see and :meth:`vacuum` removes
  (at once: a writer holds a lock on its temp file, which dies with it).
* Folders are created ``0700`` and files ``0600``. Reads open with
  ``O_NOFOLLOW``, and ``os.replace`` replaces a planted symlink instead of
  writing through it.
* A vanished file is a miss. A read-only directory serves reads; writes raise
  :class:`~runtime_cache.errors.ReadOnlyBackendError` at once, without retrying
  the disk, and the front logs that once.
* ``max_size`` is kept by evicting least recently used files, one process at
  a time (see :mod:`runtime_cache.backends.eviction`). Last access is the
  file's mtime, bumped on every hit (one ``futimens`` call); hits are counted
  in memory and appended to ``<root>/.hits`` in batches.

* A root that another user (not root) owns, or that anyone may write, is
  refused unless ``shared=1``: whoever can write it could plant entries.

URL: ``dir:///abs/path?max_size=2GB&fsync=0&track_access=1&shared=0``; plain ``dir://``
is the embedded default, ``platformdirs.user_cache_dir("runtime-cache")``.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

from runtime_cache.api import Backend, BackendURL, StoredItem, parse_size
from runtime_cache.errors import BackendError, InvalidKeyError, ReadOnlyBackendError

from .eviction import Candidate, evict_lru, eviction_turn
from .hits_journal import HitsJournal
from .temp_files import create_locked, remove_if_orphaned

__all__ = ["DirectoryBackend"]

log = logging.getLogger("runtime_cache")

SUFFIX = ".rce"
_COMPONENT = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}$")
_MAX_KEY = 1024
_MAX_DEPTH = 16
_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL = {errno.ENOSPC, errno.EDQUOT}
_O_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_TEMP_PREFIX = ".tmp-"
_HITS = ".hits"
_TEMP_MAX_AGE = 300.0
_counter = itertools.count()
_OPEN: weakref.WeakSet[DirectoryBackend] = weakref.WeakSet()


@atexit.register
def _flush_all() -> None:
    for backend in list(_OPEN):
        backend.flush_hits()


def _default_root() -> str:
    import platformdirs

    return platformdirs.user_cache_dir("runtime-cache", appauthor=False)


class DirectoryBackend(Backend):
    """Files in a directory tree; see the module docstring for the guarantees.

    Args:
        path: the root folder (created ``0700``); ``None`` for the default.
        max_size: cap on stored bytes (int or ``"500MB"``), ``None`` for no cap.
        fsync: fsync each file before it is renamed into place (durable on
            power loss, slower).
        track_access: bump mtime and count hits on every get (for LRU and listings).
        shared: accept a root that another user owns or that anyone may write
            (a team's shared folder). Without it such a root is refused, since
            whoever can write it can plant entries; share with ``Cache(secret=...)``.
    """

    scheme = "dir"

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_size: int | str | None = "2GB",
        fsync: bool = False,
        track_access: bool = True,
        hits_batch: int = 64,
        shared: bool = False,
    ) -> None:
        self.root = Path(os.path.expanduser(os.fspath(path))) if path else Path(_default_root())
        self.max_size = None if max_size is None else parse_size(max_size)
        self.fsync = fsync
        self.track_access = track_access
        self._read_only = False
        self._lock = threading.Lock()
        self._known_dirs: set[str] = set()
        self._written_since_check = 0
        self._writes_since_check = 0
        self._estimated_total: int | None = None
        self._closed = False
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            if exc.errno not in _READ_ONLY:
                raise self._error("open", exc) from exc
            self._read_only = True
        try:
            is_dir = self.root.is_dir()
        except OSError as exc:
            raise self._error("open", exc) from exc
        if not is_dir:
            raise BackendError(f"cache root {self.root} is not a directory")
        self.shared = shared  # others may write it: a Cache over it needs a secret
        if not shared:
            self._check_owner()
        self._root = str(self.root)
        self._journal = HitsJournal(os.path.join(self._root, _HITS), batch=hits_batch)
        self._journal.writable = not self._read_only
        self._maybe_vacuum()
        _OPEN.add(self)

    @classmethod
    def from_url(cls, url: str) -> DirectoryBackend:
        """Open from ``dir:///abs/path?max_size=..&fsync=0|1&track_access=0|1``."""
        parsed = BackendURL.parse(url)
        path = parsed.netloc + parsed.path
        max_size = parsed.pop("max_size", "2GB")
        fsync = parsed.pop("fsync", "0") in ("1", "true", "yes")
        track = parsed.pop("track_access", "1") not in ("0", "false", "no")
        shared = parsed.pop("shared", "0") in ("1", "true", "yes")
        parsed.reject_unknown()
        cap = None if (max_size or "").lower() in ("", "none", "0") else max_size
        return cls(path or None, max_size=cap, fsync=fsync, track_access=track, shared=shared)

    def _check_owner(self) -> None:
        # A root someone else may write (say /tmp/cache, made first by another user)
        # would let them plant entries and symlinks: refuse it unless shared=1.
        try:
            st = os.stat(self.root)
        except OSError as exc:
            raise self._error("open", exc) from exc
        geteuid = getattr(os, "geteuid", None)
        foreign = geteuid is not None and st.st_uid not in (geteuid(), 0)
        if foreign or st.st_mode & 0o002:
            raise BackendError(
                f"cache root {self.root} is owned by another user or writable by anyone; "
                "refusing it (add ?shared=1, or shared=True, to use it on purpose)"
            )

    # ----------------------------------------------------------------- paths
    def _path(self, key: str) -> str:
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY:
            raise InvalidKeyError(f"a key must be a str of 1-{_MAX_KEY} characters")
        parts = key.split("/")
        if len(parts) > _MAX_DEPTH:
            raise InvalidKeyError(f"a key may have at most {_MAX_DEPTH} components: {key[:80]!r}")
        for part in parts:
            if not _COMPONENT.match(part) or part.endswith(SUFFIX):
                raise InvalidKeyError(
                    f"key component {part[:80]!r} must be 1-128 letters, digits, '.', '_', '+' "
                    f"or '-', not start with '.' and not end with {SUFFIX!r}"
                )
        last = parts[-1]
        return os.path.join(self._root, *parts[:-1], last[:2], last + SUFFIX)

    def _error(self, op: str, exc: OSError) -> BackendError:
        where = f"{op} in {self.root}"
        if exc.errno in _READ_ONLY:
            return ReadOnlyBackendError(f"{where}: read-only or no permission ({exc.strerror})")
        if exc.errno in _FULL:
            return BackendError(f"{where}: disk full ({exc.strerror})")
        return BackendError(f"{where}: {exc}")

    # ----------------------------------------------------------------- reads
    def _open(self, key: str) -> int | None:
        path = self._path(key)
        try:
            return os.open(path, _O_READ)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR):
                if exc.errno == errno.ELOOP:
                    log.warning("runtime-cache: refusing to follow a symlink at %s", path)
                return None
            raise self._error("read", exc) from exc

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
        fd = self._open(key)
        if fd is None:
            return None
        try:
            # One read of the size fstat gives, plus a byte to see the end. Entries are
            # replaced, never written in place, so anything else (a short read on a
            # network file system) is rare: then read on to the end.
            size = os.fstat(fd).st_size
            data = os.read(fd, size + 1)
            if len(data) != size:
                chunks = [data]
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                data = b"".join(chunks)
            if count_use:
                self._touch(fd, key)
        except OSError as exc:
            raise self._error("read", exc) from exc
        finally:
            os.close(fd)
        return data

    def head(self, key: str, size: int) -> bytes | None:
        fd = self._open(key)
        if fd is None:
            return None
        try:
            return os.read(fd, size)
        except OSError as exc:
            raise self._error("read", exc) from exc
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
        path = self._path(key)
        if self._read_only:
            raise ReadOnlyBackendError(f"{self.root} is read-only; write skipped")
        folder = os.path.dirname(path)
        try:
            try:
                self._write(folder, path, value)
            except FileNotFoundError:
                # The folder was removed under us (a clear, an rm -rf), or a cleaner
                # took our temp file in the instant before we locked it: once more.
                self._known_dirs.discard(folder)
                self._write(folder, path, value)
        except OSError as exc:
            self._known_dirs.discard(folder)
            error = self._error("write", exc)
            if isinstance(error, ReadOnlyBackendError):
                self._read_only = True
                self._journal.writable = False
                log.warning(
                    "runtime-cache: %s is read-only; serving reads, skipping writes", self.root
                )
            raise error from exc
        self._account(len(value))

    def _write(self, folder: str, path: str, value: bytes) -> None:
        temp = os.path.join(
            folder, f"{_TEMP_PREFIX}{os.getpid()}-{threading.get_ident()}-{next(_counter)}"
        )
        if folder not in self._known_dirs:
            self._makedirs(folder)
            self._known_dirs.add(folder)
        fd = create_locked(temp)
        try:
            view = memoryview(value)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
            # Replaced while still open, so the lock tells vacuum() we are alive.
            os.replace(temp, path)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)

    def _makedirs(self, folder: str) -> None:
        # os.makedirs applies ``mode`` to the leaf only; every level we create is 0700.
        missing = []
        while folder != self._root and not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if not os.path.isdir(path):
                    raise

    def delete(self, key: str) -> bool:
        path = self._path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.EISDIR):
                return False
            raise self._error("delete", exc) from exc
        return True

    # --------------------------------------------------------------- listing
    def _walk(self, prefix: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        parts = prefix.split("/")
        base = self.root.joinpath(*[p for p in parts[:-1] if p])
        if any(p.startswith(".") for p in parts[:-1]):
            return
        lead = "/".join(p for p in parts[:-1] if p)
        stack: list[tuple[Path, list[str]]] = [(base, [lead] if lead else [])]
        while stack:
            folder, names = stack.pop()
            try:
                with os.scandir(folder) as it:
                    listing = list(it)
            except OSError:
                continue
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append((Path(entry.path), [*names, entry.name]))
                elif entry.name.endswith(SUFFIX) and names:
                    name = entry.name[: -len(SUFFIX)]
                    if names[-1] != name[:2]:
                        continue
                    key = "/".join([*names[:-1], name])
                    if key.startswith(prefix):
                        yield key, entry

    def keys(self, prefix: str = "") -> Iterator[str]:
        return (key for key, _ in self._walk(prefix))

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        hits = self._journal.read() if self.track_access else {}
        for key, entry in self._walk(prefix):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            count, _ = hits.get(key, (0, 0.0))
            yield StoredItem(key, st.st_size, st.st_mtime, count if self.track_access else None)

    # -------------------------------------------------------------- eviction
    def _account(self, size: int) -> None:
        if self.max_size is None:
            return
        with self._lock:
            self._written_since_check += size
            self._writes_since_check += 1
            estimate = (self._estimated_total or 0) + self._written_since_check
            due = (
                self._estimated_total is None
                or estimate > self.max_size
                or self._writes_since_check >= 256
                # Other processes write too: look again after 1/32 of the cap, so
                # together they overshoot it by little.
                or self._written_since_check >= self.max_size // 32
            )
        if due:
            self._enforce(wait=estimate > self.max_size * 1.1)

    def total_size(self) -> int:
        """The bytes stored now (a full walk)."""
        return sum(item.size for item in self.scan())

    def enforce_size(self) -> int:
        """Evict least recently used files until under 90% of ``max_size``; return how many.

        One process at a time evicts (see :mod:`runtime_cache.backends.eviction`);
        when another one is at it, this returns 0 at once.
        """
        return self._enforce(wait=True)

    def _enforce(self, wait: bool) -> int:
        if self.max_size is None:
            return 0
        with self._lock:
            # Writes made while we walk stay counted for the next check.
            seen_bytes, seen_writes = self._written_since_check, self._writes_since_check
        with eviction_turn(os.path.join(self._root, ".evict.lock"), wait) as mine:
            if not mine:
                return 0  # another thread or process is evicting; we look again next write
            items: list[Candidate] = []
            for _key, entry in self._walk(""):
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # evicted or replaced by another process meanwhile
                items.append((st.st_mtime_ns, st.st_ino, entry.path, st.st_size))
            total = sum(item[3] for item in items)
            removed = 0
            if total > self.max_size:
                removed, total = evict_lru(items, total, int(self.max_size * 0.9))
        with self._lock:
            self._estimated_total = total
            self._written_since_check = max(0, self._written_since_check - seen_bytes)
            self._writes_since_check = max(0, self._writes_since_check - seen_writes)
        return removed

    def vacuum(self) -> int:
        """Remove temp files that dead writers left, and compact the hits journal.

        A temp file whose writer is gone (its lock is free) goes at once; where
        the file system has no locks, one not written for 5 minutes goes.
        """
        removed = 0
        now = time.time()
        for folder, _dirs, files in os.walk(self.root):
            for name in files:
                if name.startswith(_TEMP_PREFIX):
                    removed += remove_if_orphaned(os.path.join(folder, name), _TEMP_MAX_AGE, now)
        self._compact_hits()
        try:
            (self.root / ".vacuumed").touch(mode=0o600)
        except OSError:
            pass
        return removed

    def _compact_hits(self) -> None:
        temp = os.path.join(self._root, f"{_TEMP_PREFIX}hits-{os.getpid()}")
        self._journal.compact(set(self.keys()), temp)

    def _maybe_vacuum(self) -> None:
        if self._read_only:
            return
        try:
            age = time.time() - (self.root / ".vacuumed").stat().st_mtime
        except OSError:
            age = float("inf")
        if age > 3600:
            self.vacuum()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush_hits()

    def __repr__(self) -> str:
        return f"<DirectoryBackend {str(self.root)!r}>"
