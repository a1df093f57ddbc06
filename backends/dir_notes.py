"""``dir://`` lease notes: written whole, read, and removed by a vacuum without losing one.

A note (:meth:`runtime_cache.lease.Lease.note_unstored`) is an empty file,
``.locks/<digest>.unstored``, whose modification time says when it runs out. Only a
regular file with one link whose time is in ``(now, now + MAX_NOTE_SECONDS]`` counts.

Holders and vacuums work on the same name at once, so:

* a holder makes its note under a name of its own (:data:`NEW_SUFFIX`), sets its time
  and renames it over the note's name: the name never shows a file whose time is not set
  yet, and whatever was there (an old note, a link, a FIFO) is replaced, never followed;
* a vacuum renames a note it takes for spent aside (:data:`ASIDE_SUFFIX`) and looks again.
  A note a holder renewed meanwhile goes back to its name, atomically and without replacing
  a later one. A good note a killed vacuum left aside goes back at the next vacuum; a
  holder's half-made note goes once it was last made or timed :data:`NEW_MAX_AGE` ago.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time

from .dir_fs import NOFOLLOW
from .dir_root import Modes
from .exclusive_rename import rename_noreplace

__all__ = [
    "ASIDE_SUFFIX",
    "MAX_NOTE_SECONDS",
    "NEW_SUFFIX",
    "NOTE_NAMES",
    "NOTE_SUFFIX",
    "read_note",
    "remove_stale_note",
    "write_note",
]

#: The ending of a note's name (the lock file's digest before it).
NOTE_SUFFIX = ".unstored"
#: The furthest ahead a note may run out; one said to run out later is not a holder's.
MAX_NOTE_SECONDS = 3600.0
#: The ending of a name a vacuum gives a note it is about to remove.
ASIDE_SUFFIX = ".aside"
#: The ending of a note's name while its holder makes it.
NEW_SUFFIX = ".new"
#: The endings of the names a vacuum looks at (:func:`remove_stale_note`).
NOTE_NAMES = (NOTE_SUFFIX, ASIDE_SUFFIX, NEW_SUFFIX)
#: Seconds after its making or timing that a half-made note (its holder killed) is removed.
NEW_MAX_AGE = 300.0
#: Seconds past :data:`MAX_NOTE_SECONDS` a vacuum still keeps a note for (clocks differ).
_AHEAD_SLACK = 60.0
_FLAGS = os.O_WRONLY | os.O_CREAT | NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def read_note(folder: int, name: str) -> bool:
    """Whether the note ``name`` in the lock folder open as ``folder`` is there and good."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    now = time.time()
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return False
    return now < st.st_mtime <= now + MAX_NOTE_SECONDS


def write_note(folder: int, name: str, until: float, modes: Modes) -> None:
    """Leave the note ``name``, good until ``until`` (a time), in the folder ``folder``.

    Where no file can be made (no inode left, a folder closed to us), the time of our
    own note is set where it is, as a vacuum may still remove it meanwhile. May raise."""
    temp = f"{name}.{secrets.token_hex(4)}{NEW_SUFFIX}"
    try:
        fd = os.open(temp, _FLAGS | os.O_EXCL, modes.file, dir_fd=folder)
    except OSError as exc:
        try:
            _time_in_place(folder, name, until)
        except OSError:
            raise exc from None
        return
    try:
        if modes.file_chmod is not None:
            with contextlib.suppress(OSError):
                os.fchmod(fd, modes.file_chmod)  # a shared cache's members replace it
        os.utime(fd, (until, until))
    finally:
        os.close(fd)
    try:
        os.rename(temp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=folder)
        raise


def _time_in_place(folder: int, name: str, until: float) -> None:
    fd = os.open(name, _FLAGS & ~os.O_CREAT, dir_fd=folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(errno.EINVAL, f"{name} is not a note")
        os.utime(fd, (until, until))
    finally:
        os.close(fd)


def _good(st: os.stat_result) -> bool:
    """Whether a vacuum keeps this note: good now, or set at most a little too far ahead."""
    now = time.time()  # at each look: a vacuum's walk may have taken a while
    return stat.S_ISREG(st.st_mode) and now < st.st_mtime <= now + MAX_NOTE_SECONDS + _AHEAD_SLACK


def remove_stale_note(folder: int, name: str) -> bool:
    """Remove the note ``name`` in the lock folder open as ``folder`` if it is spent, set
    too far ahead or no regular file, or a killed holder's or vacuum's leftover; return
    whether something was removed. May raise."""
    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    if name.endswith(NEW_SUFFIX):  # a holder's, half made (ctime: when made or timed)
        if st.st_ctime >= time.time() - NEW_MAX_AGE:
            return False
        os.unlink(name, dir_fd=folder)
        return True
    if name.endswith(ASIDE_SUFFIX):
        note = name[: -len(ASIDE_SUFFIX)].rpartition(".")[0]  # <note>.<hex>.aside
        if note.endswith(NOTE_SUFFIX) and _good(st):
            _put_back(folder, name, note, st)  # a killed vacuum's
            return False
        os.unlink(name, dir_fd=folder)
        return True
    if _good(st):
        return False
    # A holder may rename its new note over this one between that look and a removal: so
    # the file is set aside first and looked at again.
    aside = f"{name}.{secrets.token_hex(4)}{ASIDE_SUFFIX}"
    os.rename(name, aside, src_dir_fd=folder, dst_dir_fd=folder)
    again = os.stat(aside, dir_fd=folder, follow_symlinks=False)
    if _good(again):
        _put_back(folder, aside, name, again)  # renewed meanwhile
        return False
    os.unlink(aside, dir_fd=folder)
    return True


def _put_back(folder: int, aside: str, name: str, st: os.stat_result) -> None:
    """Give the good note set aside as ``aside`` (``st``) its name again. A note at the
    name already stays if it runs out no sooner; else this one replaces it."""
    if rename_noreplace(folder, aside, name):  # (False: taken; None: no such call here)
        return
    try:
        there: os.stat_result | None = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        there = None
    if there is not None and _good(there) and there.st_mtime >= st.st_mtime:
        os.unlink(aside, dir_fd=folder)
    else:
        os.rename(aside, name, src_dir_fd=folder, dst_dir_fd=folder)
