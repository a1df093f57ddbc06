"""Build leases for ``dir://``: an ``flock`` on one lock file per key.

The lock files live in ``<root>/.locks/`` (a name starting with ``.``, so never
a key), one per key, named by a digest of the key. A holder's lock dies with
its process, so a killed holder frees the lease at once. A holder that hangs
keeps its lock: it touches the file every ``ttl / 3`` seconds while it lives,
and a lock file not touched for ``ttl`` seconds is stale; the next taker
unlinks it and locks a fresh one (the hung holder keeps a lock on a file no one
else opens). Every taker checks after locking that the path still names the
file it locked, so a stale break or a release racing with a take never leaves
two holders of one path. Every unlink of a lock file (a stale break, a release, a
vacuum) looks at the name and unlinks under the folder's ``.unlinking`` lock
(:func:`unlink_if_same`): a break between another's look and its unlink had that
unlink remove the fresh file a new holder had just locked.

"Not touched for ``ttl`` seconds" is judged by the file system's clock (on NFS, the file
server's), not the taker's: a taker whose clock ran 20 s ahead broke a live holder's lock,
and two processes built one key. So a lock that looks stale by the local clock is looked
at again against the time a fresh probe file of this process's own in ``.locks/`` gets
from a touch (:meth:`DirLease._fs_now`), removed at once; where no probe can be made the
local clock decides. A taker whose clock runs behind breaks a hung holder's lock that much
later, and its wait ends at its deadline anyway (:mod:`runtime_cache.fleet`).

A holder whose entry the store refused for its size leaves a note beside its lock file,
``<digest>.unstored`` (:meth:`runtime_cache.lease.Lease.note_unstored`): an empty
file whose modification time is when the note runs out. Only a regular file with one
link counts, and never one said to run out further ahead than :data:`MAX_NOTE_SECONDS`,
so a planted link (symbolic or hard: an entry's time is never changed through it) or a
note set for next year is no note. How notes are written and removed: :mod:`.dir_notes`.

The folder and the files are opened under the cache root's descriptor with no
link followed (a planted ``.locks`` symlink is refused, never written through),
and made with the cache's modes, so a ``shared=1`` group shares its leases. A lock
file is written (its token, its time, its mode) only when it is a regular file with no
other name (:mod:`.fixed_files`): a hard link planted at a key's lock name (to a file of
the taker's outside the cache) or a FIFO is junk, removed as a stale lock is
(:func:`unlink_if_same`), and a fresh lock made; where it cannot be removed the build goes
on without a lease. A socket, a folder, a symbolic link or a device there (another's,
maybe: never followed, written or removed) means no lease for that key:
:meth:`DirLease.planted` names it, and the backend's ``lease()`` answers ``None``.

In a ``shared=1`` folder whose caches have a secret
(:meth:`~runtime_cache.api.Backend.sign_leases`), a holder writes a signed token
(:mod:`.lease_tokens`) into its lock file when it takes the lease and at each renewal,
stamped with the lock file's own time (the file system's clock). A member without the
secret could otherwise hold a key's lock, touching it, and keep every process waiting out
its deadline (92 s per key by default). A taker that finds the lock held with no token any
key of the secret signed, or one that ran out, in looks over :data:`FOREIGN_GRACE` (a
holder writes its token just after it locks), breaks the lock as a stale one is broken;
where it cannot (the folder's unlinking lock held, or a fresh lock with no token there
again at once), it raises :class:`~runtime_cache.errors.BackendError`, and the caller
builds without a lease. Holders without the secret (a member on a library version before
signed leases, or with only an older key of a rotated secret) are taken for planted locks:
their keys may be built twice.
A token copied from a live holder and planted again (a replay) counts until it runs out,
``ttl`` plus :data:`~.lease_tokens.SLACK_MS` after it was made.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import time

from runtime_cache.api import Lease
from runtime_cache.errors import BackendError, ReadOnlyBackendError
from runtime_cache.file_locks import flock_within

from .dir_fs import NOFOLLOW, make_folders, open_folder
from .dir_notes import MAX_NOTE_SECONDS, NEW_SUFFIX, NOTE_SUFFIX, read_note, write_note
from .dir_root import Modes
from .fixed_files import NotInPlace, held, open_fixed, open_in_place, planted
from .lease_tokens import MAX_TOKEN, LeaseSigning, genuine, make_token

__all__ = [
    "FOREIGN_GRACE",
    "LOCKS",
    "MAX_NOTE_SECONDS",
    "NOTE_SUFFIX",
    "UNLINKING",
    "DirLease",
    "unlink_if_same",
]

LOCKS = ".locks"
_FLAGS = os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The locks folder's lock for unlinking lock files (no ``.lock`` ending: no key's lease).
UNLINKING = ".unlinking"
#: Seconds an unlink waits for :data:`UNLINKING` before it leaves the file in place.
UNLINK_WAIT = 1.0
#: Seconds a lock must be seen held with no genuine token (looks this far apart) before a
#: taker with the secret breaks it: a holder writes its token just after it locks, but its
#: few calls in between wait for the GIL (up to 0.25 s seen with 8 busy threads) and, on
#: NFS, for the server.
FOREIGN_GRACE = 1.0
#: A probe is always a new file of our own: never one that is there, never through a link.
_PROBE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def unlink_if_same(folder: int, name: str, fd: int, modes: Modes | None = None) -> bool:
    """Unlink ``name`` in the locks folder ``folder`` if it still names the file open as
    ``fd``; whether it did. The look and the unlink hold the folder's :data:`UNLINKING`
    lock (made with the cache's ``modes``, so a ``shared=1`` group shares it), as every
    unlink of a lock file does (a stale break, a release, a vacuum): else another
    process could break the file and lock a fresh one at the name between this look and
    this unlink, and this unlink would remove that live holder's file (two holders).
    A hard link or a FIFO at that lock's name is removed and a fresh lock made (never
    written through: :mod:`.fixed_files`). Where that lock cannot be opened (a symbolic
    link or a folder planted at its name, a file of another's that this process may not
    write), the look and the unlink go unlocked, as before it.
    Held past :data:`UNLINK_WAIT` seconds (a process stopped holding it, or a member of a
    ``shared=1`` group holding it on purpose), nothing is unlinked: unlocked, a process
    stopped between its look and its unlink could remove a new holder's file when it goes
    on. A stale lease is then not broken until it is let go, and waiters build at their
    deadline (:mod:`runtime_cache.fleet`)."""
    modes = modes if modes is not None else Modes.for_cache(False)
    lock: int | None = None
    try:
        lock = _unlinking_lock(folder, modes)
        if not flock_within(lock, UNLINK_WAIT):
            os.close(lock)
            return False  # held (a stopped process): the file stays
    except OSError:
        pass  # no lock to be had here: unlocked, as before
    try:
        named = os.stat(name, dir_fd=folder, follow_symlinks=False)
        mine = os.fstat(fd)
        if (named.st_dev, named.st_ino) != (mine.st_dev, mine.st_ino):
            return False
        os.unlink(name, dir_fd=folder)
        return True
    except OSError:
        return False
    finally:
        if lock is not None:
            os.close(lock)


def _unlinking_lock(folder: int, modes: Modes) -> int:
    """The locks folder's :data:`UNLINKING` lock, opened (made if missing). A hard link or a
    FIFO planted at its name is removed (never written: :mod:`.fixed_files`) and a fresh one
    made. ``OSError`` when none can be had."""
    fd, ours = open_fixed(folder, UNLINKING, _FLAGS, modes.file, modes.file_chmod)
    if ours:
        return fd
    try:
        if held(fd):  # a live lock given a second name: not removed (see fixed_files.held)
            raise NotInPlace(errno.EBUSY, "held, and not the cache's own to write", UNLINKING)
    finally:
        os.close(fd)
    os.unlink(UNLINKING, dir_fd=folder)
    return open_in_place(folder, UNLINKING, _FLAGS, modes.file, modes.file_chmod)


class DirLease(Lease):
    """A lease on ``key`` among all processes that use the cache root open as ``root_fd``."""

    renews = True

    def __init__(
        self,
        root_fd: int,
        key: str,
        ttl: float,
        modes: Modes | None = None,
        signing: LeaseSigning | None = None,
    ) -> None:
        super().__init__(key, ttl)
        self._signing = signing if signing is not None else LeaseSigning()
        #: The secret's keys (the first signs, any verifies); empty: locks carry no token.
        self._keys = self._signing.keys
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        self.name = f"{digest}.lock"
        self.note_name = f"{digest}{NOTE_SUFFIX}"
        #: The lock file's path under the cache root.
        self.path = f"{LOCKS}/{self.name}"
        self._root_fd = root_fd
        self._modes = modes if modes is not None else Modes.for_cache(False)
        self._folder: int | None = None
        self._fd: int | None = None

    def planted(self) -> str | None:
        """What sits at the lock's name that is no lock file and not the lease's to remove
        (:func:`.fixed_files.planted`: a socket, a folder, a symbolic link, a device), or
        ``None``. The locks folder is opened with no link followed, and not made."""
        try:
            folder = open_folder(self._root_fd, LOCKS)
        except OSError:
            return None  # none yet, or junk at its name (a take removes it)
        try:
            return planted(folder, self.name)
        finally:
            os.close(folder)

    def _locks(self) -> int:
        if self._folder is None:
            modes = self._modes
            try:
                self._folder = make_folders(self._root_fd, LOCKS, modes.folder, modes.folder_chmod)
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                # Junk at the folder's name (a FIFO, a file, a link) kept every lease off for
                # good: removed (never followed), and the folder made.
                os.unlink(LOCKS, dir_fd=self._root_fd)
                self._folder = make_folders(self._root_fd, LOCKS, modes.folder, modes.folder_chmod)
        return self._folder

    def _open(self) -> int:
        try:
            folder = self._locks()
            for _ in range(2):  # the second opens a fresh file after junk was removed
                fd, ours = open_fixed(
                    folder, self.name, _FLAGS, self._modes.file, self._modes.file_chmod
                )
                if ours:
                    return fd
                # A hard link (a file with a name elsewhere: never written here) or a FIFO
                # at the lock's name: junk, removed as a stale lock is, and a fresh one made;
                # not one a holder holds (a live lock given a second name): left.
                try:
                    live = held(fd, self.ttl)
                    removed = not live and unlink_if_same(folder, self.name, fd, self._modes)
                finally:
                    os.close(fd)
                if not removed:
                    break
            raise NotInPlace(errno.EMLINK, "not a lock file of the cache's own", self.name)
        except OSError as exc:  # a read-only mount says so once, as its writes do
            kind = ReadOnlyBackendError if exc.errno == errno.EROFS else BackendError
            raise kind(f"lease {self.key!r} in {LOCKS}: {exc}") from exc

    def _same_file(self, fd: int) -> bool:
        if self._folder is None:
            return False
        try:
            st = os.stat(self.name, dir_fd=self._folder, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _unlink_if_same(self, fd: int) -> bool:
        """Unlink the lock file if its name still names the file open as ``fd``; whether
        it did (see :func:`unlink_if_same`)."""
        folder = self._folder
        return folder is not None and unlink_if_same(folder, self.name, fd, self._modes)

    def _take(self) -> bool:
        for again in (False, True):  # the second round locks a fresh file after a break
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise BackendError(f"lease {self.key!r}: {exc}") from exc
                try:  # (the lock's file is closed whatever its holder left in it)
                    foreign, broken = self._judge_holder(fd, again)
                finally:
                    os.close(fd)
                if broken:
                    continue
                if foreign:
                    raise BackendError(
                        f"lease {self.key!r}: held with no token the secret signed, and "
                        "the lock cannot be broken now"
                    ) from None
                return False
            if not self._same_file(fd):  # released or broken between our open and lock
                os.close(fd)
                return False
            try:
                os.utime(fd)
            except OSError:
                pass  # another member's file: staleness then counts from its last touch
            self._stamp(fd)
            self._signing.signed(self.name)
            self._fd = fd
            return True
        return False

    def _judge_holder(self, fd: int, again: bool) -> tuple[bool, bool]:
        """For a lock open as ``fd`` that someone holds: whether its holder is foreign (no
        genuine token), and whether the lock was broken (unlinked) here."""
        stale = time.time() - os.fstat(fd).st_mtime > self.ttl
        # Stale by our clock; by the file system's, which stamped the touch? The lock's
        # time is read again after the probe: a touch meanwhile is then counted.
        stale = stale and self._fs_now() - os.fstat(fd).st_mtime > self.ttl
        # Foreign at the second round too (a member making locks again at once): not
        # broken twice, built without a lease, as where it cannot be broken at all.
        foreign = not stale and self._foreign_holder(fd)
        broken = (stale or (foreign and not again)) and self._unlink_if_same(fd)
        return foreign, broken

    def _stamp(self, fd: int) -> None:
        """Write a fresh signed token into the held lock file (with the secret only),
        counting from the file's time, which the touch just before set."""
        if not self._keys:
            return
        try:
            now_ms = int(os.fstat(fd).st_mtime * 1000)
            token = make_token(self._keys[0], self.name, int(self.ttl * 1000), now_ms).encode()
            os.pwrite(fd, token, 0)
            os.ftruncate(fd, len(token))
        except OSError:
            pass  # (a full disk) takers with the secret then break the lock: built twice

    def _foreign_holder(self, fd: int) -> bool:
        """Whether the lock open as ``fd``, held by someone, has held no genuine token for
        :data:`FOREIGN_GRACE` seconds (with the secret only; see the module's notes)."""
        if not self._keys:
            return False
        try:
            token = os.pread(fd, MAX_TOKEN + 1, 0)
        except OSError:  # not a file that can be read: no holder's token is in it
            token = b""
        signed = genuine(self._keys, self.name, token, int(time.time() * 1000))
        # Run out by our clock; by the file system's, which stamped it? (a taker ahead)
        if not signed and token:
            signed = genuine(self._keys, self.name, token, int(self._fs_now() * 1000))
        if signed:
            self._signing.signed(self.name)
            return False
        # Whatever file is there now (a member who swapped in fresh locks faster than the
        # grace would never be found out), and whichever lease of the key looked first.
        return self._signing.unsigned_for(self.name) >= FOREIGN_GRACE

    def _fs_now(self) -> float:
        """Now by the clock that stamps the lock files: the time a touch gives a fresh probe
        file in ``.locks/``, made ``O_EXCL | O_NOFOLLOW`` under the folder's descriptor and
        removed at once; ``time.time()`` where none can be made (a folder closed to us).

        Touched as a holder touches its lock (``utime`` with no time: on NFS the server
        sets it), so the two times come from one clock. Its name ends with
        :data:`.dir_notes.NEW_SUFFIX`: one left by a process killed in between is removed
        by a vacuum, as a holder's half-made note is; no lock and no note has such a name.
        """
        name = f".clock-{secrets.token_hex(8)}{NEW_SUFFIX}"
        try:
            folder = self._locks()
            fd = os.open(name, _PROBE_FLAGS, 0o600, dir_fd=folder)
        except OSError:
            return time.time()
        try:
            try:
                os.utime(fd)
            except OSError:
                pass  # its time from its making is the file system's too
            return os.fstat(fd).st_mtime
        except OSError:
            return time.time()
        finally:
            os.close(fd)
            try:
                os.unlink(name, dir_fd=folder)
            except OSError:
                pass  # a vacuum's, or a folder gone: nothing of ours is left to count

    def _extend(self) -> bool:
        fd = self._fd
        if fd is None or not self._same_file(fd):
            return False
        try:
            os.utime(fd)
        except OSError:
            pass
        self._stamp(fd)
        return True

    def _drop(self) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                self._unlink_if_same(fd)  # while still locked: a waiter's inode check sees it
        finally:
            if fd is not None:
                os.close(fd)
            folder, self._folder = self._folder, None
            if folder is not None:
                os.close(folder)

    def _note(self, seconds: float) -> None:
        until = time.time() + min(seconds, MAX_NOTE_SECONDS)
        write_note(self._locks(), self.note_name, until, self._modes)

    def _noted(self) -> bool:
        return read_note(self._locks(), self.note_name)

    def __del__(self) -> None:
        # A lease refused in __init__ (a bad ttl) never set its descriptors.
        for fd in (getattr(self, "_fd", None), getattr(self, "_folder", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
