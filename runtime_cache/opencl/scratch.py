"""Private temporary folders of this process's children, and none left behind by a killed app.

Three kinds live in the temporary folder: each child's working folder,
``runtime-cache-child-XXXXXXXX`` (one per process that starts children, see
:mod:`.child`), each vetting child's scratch folder, ``runtime-cache-vet-XXXXXXXX``,
and the demo's folder of driver caches, ``runtime-cache-demo-driver-XXXXXXXX``.
PoCL unpacks each program into its scratch folder under a hash stored in the binary,
which a damaged copy keeps: a vetting child that shared this process's folder would
leave damaged files where this process then loads the good binary (LLVM aborts). Each
is removed when done with.

An app killed meanwhile (``kill -9``, the out-of-memory killer) removes nothing,
and its folders would stay for good. So this process holds an ``flock`` on each
folder while it uses it (the kernel lets go when the process ends), and the first
:class:`Scratch` of a process removes the folders of these kinds that this user
made over :data:`LEFT_AFTER` seconds ago and that nobody holds (a folder made a
moment ago may not be locked yet). Only real folders of this user count: a link
planted under such a name is not followed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no locks, so nothing is taken for left behind
    fcntl = None  # type: ignore[assignment]

__all__ = ["CHILD", "DEMO", "LEFT_AFTER", "VET", "Scratch", "scratch_folder", "sweep_left_folders"]

#: The name prefixes of a child's working folder, of a vetting child's scratch folder, and
#: of the demo's folder of driver caches (a killed demo left 600 KB for good).
CHILD, VET, DEMO = "runtime-cache-child-", "runtime-cache-vet-", "runtime-cache-demo-driver-"
_PREFIXES = (CHILD, VET, DEMO)
#: Seconds after which an unlocked scratch folder counts as left behind.
LEFT_AFTER = 60.0

_swept = threading.Event()


class Scratch:
    """A fresh private folder in the temporary folder, named ``prefix`` and a random
    part, locked while it is in use.

    ``OSError`` when it cannot be made (no space, no temporary folder)."""

    def __init__(self, prefix: str = VET) -> None:
        sweep_left_folders()
        self.path = tempfile.mkdtemp(prefix=prefix)
        self._fd: int | None = None
        if fcntl is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return  # unlocked: removed by whoever finds it a minute from now, at worst
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        self._fd = fd

    def remove(self) -> None:
        """Remove the folder and what the child left in it, then let go of its lock."""
        shutil.rmtree(self.path, ignore_errors=True)
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def scratch_folder(prefix: str) -> Iterator[str]:
    """A :class:`Scratch` folder's path while the block runs; removed after it."""
    made = Scratch(prefix)
    try:
        yield made.path
    finally:
        made.remove()


def sweep_left_folders(folder: str | None = None) -> int:
    """Once per process (or whenever ``folder`` is given): remove the folders of these
    kinds in ``folder`` (the temporary folder) that this user made over
    :data:`LEFT_AFTER` seconds ago and that no process holds. Returns how many."""
    if folder is None:
        if _swept.is_set() or fcntl is None:
            return 0
        _swept.set()
    where = tempfile.gettempdir() if folder is None else folder
    try:
        names = [n for n in os.listdir(where) if n.startswith(_PREFIXES)]
    except OSError:
        return 0
    removed = 0
    for name in names:
        with contextlib.suppress(OSError):
            removed += _remove_if_left(os.path.join(where, name))
    return removed


def _remove_if_left(path: str) -> bool:
    """Remove the folder at ``path`` if it is this user's, old, and unheld."""
    info = os.lstat(path)
    if fcntl is None or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        return False
    if time.time() - info.st_mtime < LEFT_AFTER:
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: a live process's
        shutil.rmtree(path)  # (links inside are removed, never followed)
    finally:
        os.close(fd)
    return True
