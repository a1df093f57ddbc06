"""Temp files of the directory backend, held under a lock while they are written.

A writer creates its temp file, takes an exclusive ``flock`` on it at once, and
keeps the file open (so the lock held) until ``os.replace`` has put it in place.
The kernel drops the lock when the writer dies, however it dies (SIGKILL, OOM),
so :func:`remove_if_orphaned` can tell a dead writer's leftover from a live
write at once, with no age rule and no process ids (which other hosts and other
PID namespaces would not share).

Where the file system has no ``flock`` (some network file systems), or on a
platform without :mod:`fcntl`, a temp file counts as orphaned only when it has
not been written for ``max_age`` seconds.
"""

from __future__ import annotations

import errno
import os
import time

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

from .dir_fs import create_new

__all__ = ["create_locked", "create_locked_temp", "remove_if_orphaned"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_O_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
_NO_LOCKS = {errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS}


def create_locked(path: str, *, dir_fd: int | None = None) -> int:
    """Create ``path`` (``0600``, never through a symlink) and lock it; return the descriptor.

    Raises :class:`FileNotFoundError` when a cleaner took the lock in the instant
    between creation and locking (it is about to remove the file): the caller
    retries under a new name.
    """
    return _lock_new(os.open(path, _O_CREATE, 0o600, dir_fd=dir_fd), path)


def create_locked_temp(
    dir_fd: int, prefix: str, mode: int = 0o600, chmod: int | None = None
) -> tuple[int, str]:
    """Create a temp file with an unpredictable name in ``dir_fd`` and lock it: ``(fd, name)``."""
    fd, name = create_new(dir_fd, prefix, mode, chmod)
    try:
        return _lock_new(fd, name), name
    except FileNotFoundError:
        raise
    except BaseException:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def _lock_new(fd: int, path: str) -> int:
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "temp file taken by a cleaner", path) from None
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            os.close(fd)
            raise
    return fd


def remove_if_orphaned(
    path: str, max_age: float, now: float | None = None, *, dir_fd: int | None = None
) -> bool:
    """Remove the temp file ``path`` if its writer is gone; return whether it was removed.

    A file whose lock can be taken has no live writer and is removed at once. A
    file that cannot be locked (no ``flock`` here, or not ours to open) is removed
    only when older than ``max_age`` seconds. Symlinks are removed, never followed.
    """
    try:
        st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    old = st.st_mtime < (time.time() if now is None else now) - max_age
    fd = -1
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            fd = -1
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live writer holds it
            except OSError as exc:
                if exc.errno not in _NO_LOCKS or not old:
                    return False
        elif not old:
            return False
        # Unlinked while we hold the lock: a writer that created the file an
        # instant ago cannot lock it now, and retries under a new name.
        try:
            os.unlink(path, dir_fd=dir_fd)
        except OSError:
            return False
        return True
    finally:
        if fd >= 0:
            os.close(fd)
