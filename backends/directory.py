"""``dir://``: entries as files in a directory tree, safe for many processes and users.

Layout: :mod:`.dir_tree`. The root is held as a directory descriptor and every file under it
is opened relative to it, never through a link (:mod:`.dir_fs`). Writes go to a random temp
file beside the entry, then ``os.replace`` into place. Reads (:mod:`.dir_reads`) take only a
regular file of at most ``max_entry_size`` bytes; anything else at an entry's name is junk: a
miss, counted in :attr:`DirectoryBackend.junk`, logged, and removed where this process may. A
file it may not read raises a :class:`~runtime_cache.errors.BackendError` naming it; only a
failed write makes the backend read-only (tried again after :data:`READ_ONLY_RECHECK` s). The
caps count disk blocks and files (:mod:`.dir_upkeep`). docs/backends/directory.md states every
guarantee, and the ``shared=1`` group mode (:mod:`.dir_root`). A root removed is made again by
a write.

URL: ``dir:///abs/path?max_size=2GB&max_files=N&fsync=0&track_access=1&shared=0``;
plain ``dir://`` is the embedded default, ``platformdirs.user_cache_dir("runtime-cache")``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from runtime_cache.api import READING_ONLY, Backend, Lease, StoredItem, parse_size
from runtime_cache.environment import cache_folder
from runtime_cache.errors import BackendError, ReadOnlyBackendError

from . import dir_root as roots
from . import dir_write as writes
from .dir_fs import clear_way, remove_link
from .dir_maintenance import TEMP_HITS, DirMaintenance
from .dir_open import flush_at_exit, track
from .dir_reads import LINKED, DirReads
from .dir_tree import Found, rel_path, walk
from .dir_upkeep import Upkeep
from .dir_url import DEFAULT_MAX_SIZE, url_settings
from .hits_journal import HitsJournal
from .lease_tokens import LeaseSigning

__all__ = ["READ_ONLY_RECHECK", "DirectoryBackend"]

log = logging.getLogger(__name__)

_RETRY = {errno.ENOENT, errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, *LINKED}
_TEMP_PREFIX = ".tmp-"
#: Seconds a backend found read-only skips writes before it tries one again (a remount).
READ_ONLY_RECHECK = 5.0
#: The largest file read as an entry: the codec's default limits (1 GiB value,
#: 64 KiB metadata) plus room for the header and signature.
MAX_ENTRY_SIZE = (1 << 30) + (1 << 17)


class DirectoryBackend(DirMaintenance, DirReads, Backend):
    """Files in a directory tree; see the module docstring for the guarantees.

    Args:
        path: the root folder (created ``0700``); ``None`` for the default.
        max_size: cap on the disk the entries take (int or ``"500MB"``); ``None`` or 0: no cap.
        max_files: cap on entry files (0: none); by default ``max_size / 4 KiB``, at least 1024.
        fsync: fsync each file before its rename into place (durable on power loss, slower).
        track_access: bump mtime and count hits on every get (for LRU and listings).
        shared: accept a root that another user owns or that its group or anyone may write
            (a team's folder), and keep what this makes group-writable; with ``Cache(secret=)``.
        max_entry_size: the largest file read as an entry; larger ones are junk.
    """

    scheme = "dir"
    exact_sizes = True  # (its listed sizes are its blobs' own: no framing)
    #: Seconds an eviction lock may go untouched before it is taken for a stopped evictor's.
    lock_stale_after = 30.0
    #: Seconds a writer far over the cap waits for another process's eviction.
    lock_wait = 0.5

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        max_size: int | str | None = DEFAULT_MAX_SIZE,
        max_files: int | None = None,
        fsync: bool = False,
        track_access: bool = True,
        hits_batch: int = 64,
        shared: bool = False,
        max_entry_size: int = MAX_ENTRY_SIZE,
    ) -> None:
        self._root_text = cache_folder(path)  # text: a Path is made when asked for (root)
        self.max_size = (None if max_size is None else parse_size(max_size)) or None
        if max_files is None and self.max_size is not None:
            max_files = max(1024, self.max_size // 4096)
        self.max_files = max_files or None  # 0, as for max_size: no cap (a 0 cap keeps nothing)
        self.fsync = fsync
        self.track_access = track_access
        self.max_entry_size = max_entry_size
        #: Junk found at entry names (links, FIFOs, folders, oversized files), and at lock
        #: names where it means no lease (:meth:`lease`).
        self.junk = 0
        self._junk_locks: set[str] = set()  # lock names said to hold junk (1,024 at most)
        #: Keys at whose paths the last listing found no entry file (links, FIFOs, folders,
        #: files over ``max_entry_size``): left out of it, and not removed (a read removes them).
        self.listed_junk: list[str] = []
        #: Links at fan-out folder names the last listing found (never followed: the
        #: entries behind them are left out); :meth:`remove_linked_folder` removes one.
        self.linked_folders: list[str] = []
        #: Folders the last listing could not read, and why: its result is partial.
        self.unlisted_folders: list[tuple[str, str]] = []
        self._read_only = self._closed = False
        self._writable_again = 0.0  # (read-only: when a write is tried again, monotonic)
        self._rels: dict[str, str] = {}
        self._signing = LeaseSigning()  # a shared folder's caches' secret, for its leases
        self.modes = roots.Modes.for_cache(shared)
        #: The descriptor of the root folder that everything is opened under.
        self.root_fd = roots.open_root(self._root_text, self.modes)
        try:
            members = roots.owner_check(self.root_fd, self._root_text, shared)
        except BaseException:
            os.close(self.root_fd)
            raise
        modes = self.modes
        self._journal = HitsJournal(
            self.root_fd,
            ".hits",
            batch=hits_batch,
            mode=modes.file,
            chmod=modes.file_chmod,
            temp_prefix=TEMP_HITS,
            cap=self.max_size,
            on_batch=flush_at_exit,  # (in a multiprocessing child: its finalizers too)
        )
        self.shared = shared  # others may write it: a Cache over it needs a secret
        self.private = not shared and roots.only_mine(self.root_fd)
        self._upkeep = Upkeep(self, members)
        if not READING_ONLY.get():  # (the hourly vacuum writes: see api.READING_ONLY)
            self._upkeep.maybe_vacuum()
        track(self)  # hits flushed at exit, the root reopened after a fork

    @classmethod
    def from_url(cls, url: str) -> DirectoryBackend:
        """Open from ``dir:///abs/path?max_size=..&fsync=0|1&track_access=0|1&shared=0|1``
        (``%XX`` escapes in the path decoded: :meth:`BackendURL.folder`)."""
        folder, settings = cls.url_settings(url)
        return cls(folder, **settings)

    @classmethod
    def url_is_shared(cls, url: str) -> bool:
        """Whether ``url`` holds ``shared=1`` (read with nothing opened)."""
        return bool(cls.url_settings(url)[1]["shared"])

    #: The folder and keyword arguments a URL gives, checked (:func:`.dir_url.url_settings`).
    url_settings = staticmethod(url_settings)

    def reopen_after_fork(self) -> None:
        """In a forked child: fresh locks (another thread may have held ours at the fork)
        and a root descriptor of its own; the parent's unflushed hits stay the parent's.
        Called for every open backend by :mod:`.dir_open`."""
        self._journal.forget_pending()
        self._upkeep.after_fork()
        try:
            fd = os.open(".", roots.ROOT_FLAGS, dir_fd=self.root_fd)
        except OSError:
            return
        old, self.root_fd = self.root_fd, fd
        self._journal.dir_fd = fd
        os.close(old)

    @property
    def root(self) -> Path:
        """The root folder, absolute (as given, or the default)."""
        return Path(self._root_text)

    @property
    def read_only(self) -> bool:
        """Whether a failed write found the storage read-only (reads are still served)."""
        return self._read_only

    def _rel(self, key: str) -> str:
        rel = self._rels.get(key)
        if rel is None:
            rel = rel_path(key)
            if len(self._rels) >= 4096:
                self._rels.clear()
            self._rels[key] = rel
        return rel

    def _error(self, op: str, exc: OSError, name: str = "") -> BackendError:
        return roots.backend_error(self.root, op, exc, name)

    def found_junk(self, rel: str, what: str, st: os.stat_result | None = None) -> None:
        """Count and log junk at the entry name ``rel``, and remove it where we may (a file
        only while it is the one ``st`` describes: an entry written there since stays)."""
        self.junk += 1
        where, removed = rel, False
        try:  # (a member's sticky folder, an immutable file: not ours to remove, no error)
            if st is not None and stat.S_ISREG(st.st_mode):
                removed = writes.delete_if_same(self.root_fd, rel, st)
            else:  # (what was in the way may be a folder's name above the entry's)
                where, found, removed = clear_way(self.root_fd, rel)
                what = found if where != rel or not what else what  # (set(): "" for "look")
        except OSError:
            pass
        log.warning(
            "runtime-cache: %s is %s, not a cache %s; %s",
            self.root / where,
            what or "something else",
            "entry" if where == rel else "folder",
            "removed it" if removed else "left it (not ours to remove)",
        )

    def flush_hits(self) -> None:
        """Append the hits counted in memory to the shared journal."""
        self._journal.flush()

    def set(self, key: str, value: bytes) -> None:
        self._write(key, value, replace=True)

    def add(self, key: str, value: bytes) -> bool:
        return self._write(key, value, replace=False)

    def _write(self, key: str, value: bytes, replace: bool) -> bool:
        rel = self._rel(key)
        if self._read_only and time.monotonic() < self._writable_again:
            raise ReadOnlyBackendError(f"{self.root} is read-only; write skipped")
        self._upkeep.refuse_if_too_large(key, len(value))
        try:
            try:
                stored = writes.write_entry(
                    self.root_fd, rel, value, self.modes, self.fsync, replace
                )
            except OSError as exc:
                if exc.errno not in _RETRY:
                    raise
                # The folder was removed under us (a clear, an rm -rf), a cleaner took
                # our temp file, or junk holds the name (a folder, a link): once more.
                if exc.errno != errno.ENOENT:
                    self.found_junk(rel, "")  # (what is in the way: found_junk looks)
                else:  # the root removed under us (rm -rf, a tmp cleaner): made again
                    members = self._upkeep.members
                    roots.remake_root(self.root_fd, self._root_text, self.modes, members)
                stored = writes.write_entry(
                    self.root_fd, rel, value, self.modes, self.fsync, replace
                )
        except OSError as exc:
            error = self._error("write", exc, rel)
            if isinstance(error, ReadOnlyBackendError) and self._root_read_only(exc):
                self._read_only, self._writable_again = True, time.monotonic() + READ_ONLY_RECHECK
                self._journal.writable = False
                log.debug("runtime-cache: %s is read-only; skipping writes", self.root)
            elif isinstance(error, ReadOnlyBackendError):
                # One entry's name or folder (an immutable file, a folder of another
                # user's): the store takes other writes, so it is not "read-only".
                error = BackendError(
                    f"write of {self.root / rel}: no permission for this entry "
                    f"({exc.strerror}); the folder's other entries are written"
                )
            raise error from exc
        if self._read_only:  # writable again (remounted)
            self._read_only, self._journal.writable = False, True
        if stored:
            self._upkeep.account(len(value), rel)
        return stored

    def _root_read_only(self, exc: OSError) -> bool:
        # Only a root we cannot write into is read-only (a member's folder fails its keys).
        return exc.errno == errno.EROFS or not os.access(".", os.W_OK, dir_fd=self.root_fd)

    def delete(self, key: str) -> bool:
        return self._remove(key, lambda rel: writes.delete_entry(self.root_fd, rel))

    def delete_if(self, key: str, expected: bytes) -> bool:
        """Delete ``key`` only if its file holds exactly ``expected`` (renamed aside, checked
        again, removed; a newer file that took its place is put back); return whether it did."""
        cap, blob = self.max_entry_size, bytes(expected)
        return self._remove(key, lambda rel: writes.delete_if(self.root_fd, rel, blob, cap))

    def delete_if_unchanged(self, key: str, listed: StoredItem, head: bytes) -> bool:
        """Delete ``key`` only while its file is the one listed: same size, beginning with
        ``head``, its mtime (write or last use) not past ``listed.last_access``."""
        size, last, first = listed.size, listed.last_access, bytes(head)
        return self._remove(
            key, lambda rel: writes.delete_if_unchanged(self.root_fd, rel, size, last, first)
        )

    def removable(self, key: str) -> bool:
        return writes.removable(self.root_fd, self._rel(key))

    def _remove(self, key: str, remove: Callable[[str], bool]) -> bool:
        rel = self._rel(key)
        try:
            removed = remove(rel)
        except OSError as exc:
            raise self._error("delete", exc, rel) from exc
        if removed and self.track_access:  # a later entry under the key has no hits yet
            self._journal.forget(key)
        return removed

    def _listing(self, prefix: str) -> list[Found]:
        # Junk at entry names (non-files, and files over max_entry_size that a read would
        # remove) is left out and named in listed_junk for the operator: a listing reads
        # no head of it, so a reading command (ls) removes nothing. Links at fan-out folder
        # names go to linked_folders, for the same reports (and verify --repair).
        unreadable: list[tuple[str, str]] = []
        linked: list[str] = []
        inner = not self.shared  # (see walk: never in a store others write)
        found = list(
            walk(self.root_fd, prefix, unreadable=unreadable, inner_roots=inner, linked=linked)
        )
        cap = self.max_entry_size
        entries = [f for f in found if f.regular and f.stat.st_size <= cap]
        self.listed_junk = [f.key for f in found if not f.regular or f.stat.st_size > cap]
        self.unlisted_folders, self.linked_folders = unreadable, linked
        for note in unreadable:  # (folder, reason)
            log.warning("runtime-cache: %s: %s left out of the listing (%s)", self.root, *note)
        for folder in linked:
            log.warning("runtime-cache: %s is a symbolic link, never followed", self.root / folder)
        return entries

    def remove_linked_folder(self, folder: str) -> bool:
        """Remove the symbolic link at the folder name ``folder`` (one of
        :attr:`linked_folders`), never following it: what it points to is untouched.
        Returns whether no link is there now; :class:`BackendError` when it could not go."""
        try:
            return remove_link(self.root_fd, folder)
        except OSError as exc:
            raise self._error("delete", exc, folder) from exc

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter([found.key for found in self._listing(prefix)])

    def scan(self, prefix: str = "") -> Iterator[StoredItem]:
        listed = self._listing(prefix)
        hits = self._journal.read(keep={f.key for f in listed}) if self.track_access else {}
        for found in listed:
            count = hits.get(found.key, (0, 0.0))[0] if self.track_access else None
            st = found.stat
            yield StoredItem(found.key, st.st_size, st.st_mtime, count)

    def sign_leases(self, keys: tuple[bytes, ...]) -> None:
        if self.shared:  # (one's own folder holds one's own processes' locks only)
            self._signing.add(keys)

    def lease(self, key: str, ttl: float) -> Lease | None:
        """An ``flock`` on ``.locks/<digest>.lock``, signed when shared (:mod:`.dir_lease`).
        ``None`` (no lease for this key: the caller builds without one) where that name
        holds a socket, a folder, a symbolic link or a device: junk that is not ours to
        remove, counted in :attr:`junk`, logged once a name, and left as it is."""
        from .dir_lease import DirLease  # (fcntl: imported where leases are taken)

        self._rel(key)  # the same key rules as entries
        lease = DirLease(self.root_fd, key, ttl, self.modes, self._signing)
        what = lease.planted()
        if what is None:
            return lease
        self.junk += 1
        if lease.name not in self._junk_locks and len(self._junk_locks) < 1024:
            # (a WARNING for the first name a process meets; the others at DEBUG: junk
            # planted at many names would otherwise fill the log, each process anew)
            level = logging.DEBUG if self._junk_locks else logging.WARNING
            self._junk_locks.add(lease.name)
            log.log(
                level,
                "runtime-cache: %s is %s, not a lock file; left it, and %s is built without "
                "a lease",
                self.root / lease.path,
                what,
                key,
            )
        return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush_hits()

    def __repr__(self) -> str:
        return f"<DirectoryBackend {self._root_text!r}>"

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.close(self.root_fd)
