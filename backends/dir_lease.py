"""Build leases for ``dir://``: an ``flock`` on one lock file per key.

The lock files live in ``<root>/.locks/`` (a name starting with ``.``, so never
a key), one per key, named by a digest of the key. A holder's lock dies with
its process, so a killed holder frees the lease at once. A holder that hangs
keeps its lock: it touches the file every ``ttl / 3`` seconds while it lives,
and a lock file not touched for ``ttl`` seconds is stale; the next taker
unlinks it and locks a fresh one (the hung holder keeps a lock on a file no one
else opens). Every taker checks after locking that the path still names the
file it locked, so a stale break or a release racing with a take never leaves
two holders of one path.

A holder whose entry the store refused for its size leaves a note beside its lock file,
``<digest>.unstored`` (:meth:`runtime_cache.lease.Lease.note_unstored`): an empty
file whose modification time is when the note runs out. Only a regular file with one
link counts, and never one said to run out further ahead than :data:`MAX_NOTE_SECONDS`,
so a planted link (symbolic or hard: an entry's time is never changed through it) or a
note set for next year is no note.

The folder and the files are opened under the cache root's descriptor with no
link followed (a planted ``.locks`` symlink is refused, never written through),
and made with the cache's modes, so a ``shared=1`` group shares its leases.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import secrets
import stat
import time

from runtime_cache.api import Lease
from runtime_cache.errors import BackendError, ReadOnlyBackendError

from .dir_fs import NOFOLLOW, make_folders
from .dir_root import Modes

__all__ = [
    "ASIDE_SUFFIX",
    "LOCKS",
    "MAX_NOTE_SECONDS",
    "NEW_SUFFIX",
    "NOTE_SUFFIX",
    "DirLease",
    "remove_stale_note",
]

LOCKS = ".locks"
#: The ending of a note's name (the lock file's digest before it).
NOTE_SUFFIX = ".unstored"
#: The furthest ahead a note may run out; one said to run out later is not a holder's.
MAX_NOTE_SECONDS = 3600.0
_FLAGS = os.O_RDWR | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NOTE_FLAGS = os.O_WRONLY | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: The ending of a name a vacuum gives a note it is about to remove (``remove_stale_note``).
ASIDE_SUFFIX = ".aside"
#: The ending of a note's name while its holder makes it (``DirLease._note``).
NEW_SUFFIX = ".new"
#: Seconds after which a note left half-made (its holder killed) is removed.
NEW_MAX_AGE = 300.0


class DirLease(Lease):
    """A lease on ``key`` among all processes that use the cache root open as ``root_fd``."""

    renews = True

    def __init__(self, root_fd: int, key: str, ttl: float, modes: Modes | None = None) -> None:
        super().__init__(key, ttl)
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        self.name = f"{digest}.lock"
        self.note_name = f"{digest}{NOTE_SUFFIX}"
        #: The lock file's path under the cache root.
        self.path = f"{LOCKS}/{self.name}"
        self._root_fd = root_fd
        self._modes = modes if modes is not None else Modes.for_cache(False)
        self._folder: int | None = None
        self._fd: int | None = None

    def _locks(self) -> int:
        if self._folder is None:
            modes = self._modes
            self._folder = make_folders(self._root_fd, LOCKS, modes.folder, modes.folder_chmod)
        return self._folder

    def _open(self) -> int:
        try:
            folder = self._locks()
            fd = os.open(self.name, _FLAGS, self._modes.file, dir_fd=folder)
        except OSError as exc:  # a read-only mount says so once, as its writes do
            kind = ReadOnlyBackendError if exc.errno == errno.EROFS else BackendError
            raise kind(f"lease {self.key!r} in {LOCKS}: {exc}") from exc
        if self._modes.file_chmod is not None:
            try:
                os.fchmod(fd, self._modes.file_chmod)
            except OSError:
                pass  # another member's file: it made it with the group's modes already
        return fd

    def _same_file(self, fd: int) -> bool:
        if self._folder is None:
            return False
        try:
            st = os.stat(self.name, dir_fd=self._folder, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

    def _unlink(self) -> None:
        if self._folder is not None:
            try:
                os.unlink(self.name, dir_fd=self._folder)
            except OSError:
                pass

    def _take(self) -> bool:
        for _ in range(2):  # the second round locks a fresh file after breaking a stale one
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise BackendError(f"lease {self.key!r}: {exc}") from exc
                stale = time.time() - os.fstat(fd).st_mtime > self.ttl
                if stale and self._same_file(fd):
                    self._unlink()
                    os.close(fd)
                    continue
                os.close(fd)
                return False
            if not self._same_file(fd):  # released or broken between our open and lock
                os.close(fd)
                return False
            try:
                os.utime(fd)
            except OSError:
                pass  # another member's file: staleness then counts from its last touch
            self._fd = fd
            return True
        return False

    def _extend(self) -> bool:
        fd = self._fd
        if fd is None or not self._same_file(fd):
            return False
        try:
            os.utime(fd)
        except OSError:
            pass
        return True

    def _drop(self) -> None:
        fd, self._fd = self._fd, None
        try:
            if fd is not None and self._same_file(fd):
                self._unlink()  # while still locked: a waiter's inode check sees it
        finally:
            if fd is not None:
                os.close(fd)
            folder, self._folder = self._folder, None
            if folder is not None:
                os.close(folder)

    def _note(self, seconds: float) -> None:
        until = time.time() + min(seconds, MAX_NOTE_SECONDS)
        folder = self._locks()
        # Made whole under a name of its own, then renamed over whatever is at the note's
        # name (an old note, another member's, a link, a FIFO: replaced, never followed).
        # The name never shows a file whose time is not yet set: a vacuum that took the
        # note for one past its time looks again after setting it aside, and sees this.
        temp = f"{self.note_name}.{secrets.token_hex(4)}{NEW_SUFFIX}"
        try:
            fd = os.open(temp, _NOTE_FLAGS | os.O_EXCL, self._modes.file, dir_fd=folder)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            self._renew_in_place(folder, until)  # no inode left for a new file
            return
        try:
            os.utime(fd, (until, until))
        finally:
            os.close(fd)
        try:
            os.rename(temp, self.note_name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=folder)
            raise

    def _renew_in_place(self, folder: int, until: float) -> None:
        """Set the time of our note where it is (a vacuum may still remove it meanwhile)."""
        fd = os.open(self.note_name, _NOTE_FLAGS & ~os.O_CREAT, dir_fd=folder)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise OSError(errno.EINVAL, f"{self.note_name} is not a note")
            os.utime(fd, (until, until))
        finally:
            os.close(fd)

    def _noted(self) -> bool:
        folder = self._locks()
        try:
            st = os.stat(self.note_name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return False
        now = time.time()
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return False
        return now < st.st_mtime <= now + MAX_NOTE_SECONDS

    def __del__(self) -> None:
        # A lease refused in __init__ (a bad ttl) never set its descriptors.
        for fd in (getattr(self, "_fd", None), getattr(self, "_folder", None)):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


#: Seconds past :data:`MAX_NOTE_SECONDS` a vacuum still keeps a note for (clocks differ).
_AHEAD_SLACK = 60.0


def _good_note(st: os.stat_result) -> bool:
    """Whether a vacuum keeps this note: good now, or set at most a little too far ahead."""
    now = time.time()  # at each look: a vacuum's walk may have taken a while
    return now < st.st_mtime <= now + MAX_NOTE_SECONDS + _AHEAD_SLACK


def remove_stale_note(folder: int, name: str) -> bool:
    """Remove the note ``name`` in the lock folder open as ``folder`` if it is past its time
    or set too far ahead, or a leftover of a holder or a vacuum that was killed; return
    whether removed.

    A holder may replace the note between this look and the removal. So the note is first
    renamed aside and looked at again: a holder's new note shows its time, and goes back to
    its name unless a newer one is there already. A holder's note never shows at the name
    before its time is set (``DirLease._note``). A good note left aside (its vacuum killed)
    goes back the same way; notes half made (:data:`NEW_SUFFIX`) go once they are old.
    May raise.
    """
    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if name.endswith(NEW_SUFFIX):  # a holder's, half made: gone only once it is old
        now = time.time()
        if now - NEW_MAX_AGE <= st.st_mtime <= now + MAX_NOTE_SECONDS + _AHEAD_SLACK:
            return False
        os.unlink(name, dir_fd=folder)
        return True
    if name.endswith(ASIDE_SUFFIX):
        note = name[: -len(ASIDE_SUFFIX)].rpartition(".")[0]  # <note>.<hex>.aside
        if note.endswith(NOTE_SUFFIX) and stat.S_ISREG(st.st_mode) and _good_note(st):
            _put_back(folder, name, note)  # a killed vacuum's
            return False
        os.unlink(name, dir_fd=folder)
        return True
    if _good_note(st):
        return False
    if not stat.S_ISREG(st.st_mode):
        os.unlink(name, dir_fd=folder)  # junk: nothing a holder writes to
        return True
    aside = f"{name}.{secrets.token_hex(4)}{ASIDE_SUFFIX}"
    os.rename(name, aside, src_dir_fd=folder, dst_dir_fd=folder)
    again = os.stat(aside, dir_fd=folder, follow_symlinks=False)
    if stat.S_ISREG(again.st_mode) and _good_note(again):
        _put_back(folder, aside, name)  # renewed meanwhile
        return False
    os.unlink(aside, dir_fd=folder)
    return True


def _put_back(folder: int, aside: str, name: str) -> None:
    """Give the good note set aside as ``aside`` its name again, unless a note (a newer
    one: it came after the set-aside) or anything else is there now; then drop ``aside``."""
    try:
        os.link(aside, name, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        pass  # the newer one stays
    except PermissionError:  # another member's file, where links to it are protected
        try:
            os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(aside, name, src_dir_fd=folder, dst_dir_fd=folder)
            return
    os.unlink(aside, dir_fd=folder)
