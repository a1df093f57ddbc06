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
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import time

from runtime_cache.api import Lease
from runtime_cache.errors import BackendError

__all__ = ["LOCKS", "DirLease"]

#: The folder under the cache root that holds the lock files.
LOCKS = ".locks"
_FLAGS = (
    os.O_RDWR
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class DirLease(Lease):
    """A lease on ``key`` among all processes that use the cache root ``root``."""

    renews = True

    def __init__(self, root: str, key: str, ttl: float) -> None:
        super().__init__(key, ttl)
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]
        self._folder = os.path.join(root, LOCKS)
        self.path = os.path.join(self._folder, digest + ".lock")
        self._fd: int | None = None

    def _open(self) -> int:
        try:
            os.makedirs(self._folder, mode=0o700, exist_ok=True)
            return os.open(self.path, _FLAGS, 0o600)
        except OSError as exc:
            raise BackendError(f"lease {self.key!r} in {self._folder}: {exc}") from exc

    def _same_file(self, fd: int) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        mine = os.fstat(fd)
        return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)

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
                    try:
                        os.unlink(self.path)
                    except OSError:
                        pass
                    os.close(fd)
                    continue
                os.close(fd)
                return False
            if not self._same_file(fd):  # released or broken between our open and lock
                os.close(fd)
                return False
            os.utime(fd)
            self._fd = fd
            return True
        return False

    def _extend(self) -> bool:
        fd = self._fd
        if fd is None or not self._same_file(fd):
            return False
        os.utime(fd)
        return True

    def _drop(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if self._same_file(fd):
                os.unlink(self.path)  # while still locked: a waiter's inode check sees it
        except OSError:
            pass
        finally:
            os.close(fd)
