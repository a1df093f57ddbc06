"""Writing and deleting entry files of the directory backend, relative to the root descriptor.

* :func:`write_entry` writes a new temp file (random name, ``O_EXCL``, never a
  link) in the entry's folder, then renames it over the entry with
  ``os.replace``: readers see the old file or the new one, never a torn one.
  The temp file sits beside the entry, not in the root: a rename across
  folders takes the file system's one rename lock (Linux), which serialised
  all writers and cut the stress campaign's throughput by more than half.
  The temp file stays locked until it is in place, so a cleaner can tell a
  dead writer's leftover (see :mod:`runtime_cache.backends.temp_files`).
* :func:`delete_entry` unlinks an entry; a folder at its name is set aside.
* :func:`delete_if` deletes an entry only while it holds the given bytes, and
  :func:`delete_if_unchanged` only while it is the file listed (size, mtime, head).
* :func:`removable` tells whether an entry could be deleted, without deleting it.

Each raises :class:`OSError`; the backend turns it into its typed errors.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Callable

from .bounded_reads import Junk, read_regular
from .dir_fs import NOFOLLOW, make_folders, open_folder, set_aside
from .dir_root import Modes
from .exclusive_rename import rename_noreplace
from .temp_files import create_locked_temp

__all__ = [
    "delete_entry",
    "delete_if",
    "delete_if_same",
    "delete_if_unchanged",
    "removable",
    "write_entry",
]

_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV}
_GET_FLAGS = 0x80086601  # FS_IOC_GETFLAGS
_NO_UNLINK = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL: no name in or of it can go


def write_entry(
    root_fd: int, rel: str, value: bytes, modes: Modes, fsync: bool, replace: bool = True
) -> bool:
    """Put ``value`` at the entry path ``rel`` atomically; with ``replace=False`` only where
    nothing is at ``rel`` (:func:`_take_if_free`). Whether it is there now."""
    folder, _, name = rel.rpartition("/")
    dfd = make_folders(root_fd, folder, modes.folder, modes.folder_chmod)
    try:
        fd, temp = create_locked_temp(dfd, ".tmp-", modes.file, modes.file_chmod)
        try:
            view = memoryview(value)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
            # Replaced while still open, so the lock tells vacuum() we are alive.
            if not replace:
                return _take_if_free(dfd, temp, name)
            os.replace(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return True
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dfd)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _take_if_free(dfd: int, temp: str, name: str) -> bool:
    """Rename ``temp`` to ``name`` unless something is at ``name`` (``renameat2``, else a
    hard link, which takes a free name only): whether it did. ``temp`` is gone after."""
    done = rename_noreplace(dfd, temp, name)
    if done:
        return True
    if done is None:
        try:
            os.link(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            done = True
        except FileExistsError:
            done = False
    os.unlink(temp, dir_fd=dfd)
    return done


def delete_entry(root_fd: int, rel: str) -> bool:
    """Remove the entry file ``rel`` (or junk at its name); return whether something was there."""
    folder, _, name = rel.rpartition("/")
    try:
        dfd = open_folder(root_fd, folder)
    except OSError as exc:
        if exc.errno in _GONE:
            return False
        raise
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EISDIR, errno.EPERM) and set_aside(dfd, name, ".junk-"):
            return True
        raise
    finally:
        os.close(dfd)
    return True


def delete_if(root_fd: int, rel: str, expected: bytes, limit: int) -> bool:
    """Delete the entry file ``rel`` if it holds exactly ``expected``; return whether it did.

    The file is renamed aside to a fresh name in its folder, looked at again
    (same inode, same bytes), then removed. Were it replaced in between, the
    newer file is put back, unless yet another write is already in place.
    """
    # Sizes first: a sparse gigabyte planted in a shared folder was read whole to compare.
    return _delete_checked(
        root_fd,
        rel,
        lambda fd, st: st.st_size == len(expected) and read_regular(fd, limit) == expected,
    )


def delete_if_same(root_fd: int, rel: str, st: os.stat_result) -> bool:
    """Delete the file ``rel`` only while it is the one ``st`` describes (device, inode,
    size): junk found at an entry's name, never an entry another process wrote there since.
    Renamed aside and looked at again, as :func:`delete_if` does."""
    found = (st.st_dev, st.st_ino, st.st_size)
    return _delete_checked(
        root_fd, rel, lambda _fd, now: (now.st_dev, now.st_ino, now.st_size) == found
    )


def delete_if_unchanged(
    root_fd: int, rel: str, size: int, last_use: float | None, head: bytes
) -> bool:
    """Delete the entry file ``rel`` if it is still the one listed: ``size`` bytes long,
    beginning with ``head``, and with an mtime (its write, or its last use where uses are
    tracked) no later than ``last_use`` (``None``: not compared). Renamed aside and looked
    at again, as :func:`delete_if` does; return whether it was deleted."""

    def same(fd: int, st: os.stat_result) -> bool:
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        if last_use is not None and st.st_mtime > last_use:
            return False
        return os.pread(fd, len(head), 0) == head

    return _delete_checked(root_fd, rel, same)


def _delete_checked(root_fd: int, rel: str, same: Callable[[int, os.stat_result], bool]) -> bool:
    # Delete ``rel`` if ``same(fd, stat)`` holds for it, before and after it is renamed
    # aside (the same inode); else put back what was taken, unless a newer write took the name.
    folder, _, name = rel.rpartition("/")
    try:
        dfd = open_folder(root_fd, folder)
    except OSError:
        return False
    try:
        first = _inode_if(dfd, name, same)
        if first is None:
            return False
        aside = f".del-{os.urandom(8).hex()}"
        try:
            os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            return False
        if _inode_if(dfd, aside, same) == first:
            os.unlink(aside, dir_fd=dfd)
            return True
        try:  # link() fails when a newer write already took the name: that one stays
            os.link(aside, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
        except OSError:
            pass
        os.unlink(aside, dir_fd=dfd)
        return False
    finally:
        os.close(dfd)


def _inode_if(dfd: int, name: str, same: Callable[[int, os.stat_result], bool]) -> int | None:
    # The inode of the regular file ``name`` where ``same(fd, stat)`` holds for it, else None.
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dfd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_ino if same(fd, st) else None
    except (Junk, OSError):
        return None
    finally:
        os.close(fd)


def removable(root_fd: int, rel: str) -> bool:
    """Whether this process could delete the entry file ``rel``, as far as can be told
    without deleting it: its folder can be written (permissions, a read-only mount), neither
    it nor its folder is immutable or append-only, and a sticky folder lets this user."""
    folder, _, name = rel.rpartition("/")
    try:
        dfd = open_folder(root_fd, folder)
    except OSError:
        return True  # gone, or not to be opened: delete says which
    try:
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=dfd, effective_ids=True):
            return False
        where = os.fstat(dfd)
        try:
            info = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except OSError:
            return True
        user = os.geteuid() if hasattr(os, "geteuid") else 0
        if where.st_mode & stat.S_ISVTX and user not in (0, info.st_uid, where.st_uid):
            return False
        return not (_flags(dfd) | _flags_of(dfd, name)) & _NO_UNLINK
    finally:
        os.close(dfd)


def _flags_of(dfd: int, name: str) -> int:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=dfd)
    except OSError:
        return 0
    try:
        return _flags(fd)
    finally:
        os.close(fd)


def _flags(fd: int) -> int:
    """The inode flags of ``fd`` (``chattr``'s); 0 where the file system keeps none."""
    try:  # here: the backend must open where fcntl cannot be imported
        import fcntl

        got = fcntl.ioctl(fd, _GET_FLAGS, b"\0" * 8)
    except (ImportError, OSError):
        return 0
    return int.from_bytes(got[:4], sys.byteorder)
