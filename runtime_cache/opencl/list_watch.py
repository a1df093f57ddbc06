"""Whether the crash guard's lists changed since a process read them, and may be read again.

A process reads the guard folder's lists (:mod:`.guard`) at its first load. Other
processes of the machine add to them while it runs: binaries they vetted, blocked or
set aside. Before it starts a child to vet a binary, a process reads what was added
since (:meth:`ListWatch.changed`: a ``stat`` of each list), so processes started
together do not vet each other's binaries.

A list read again is trusted as the first reading was only while the folder is the
one the process checked at its start (:func:`.guard_files.open_folder`: its own, no
one else's to write), on a path where no other user can move it, or any folder above
it (:func:`runtime_cache.environment.check_private` with ``whole_path``). Otherwise a
user who can write a folder above could swap in a folder of lists of their own after
the start: a known list that has an unknown binary loaded unvetted, a blocklist that
evicts a good entry. There the lists are read once, at the start
(:meth:`ListWatch.trusted` says no), and a table the process merges itself is not
taken up either (:class:`.known_list.KnownList`'s ``trusted``).
"""

from __future__ import annotations

import os

from .. import environment
from .known_list import Signature, file_signature

__all__ = ["ListWatch"]


class ListWatch:
    """The state of one guard folder's lists when a process read them."""

    def __init__(self, folder: str, lists: tuple[str, ...]) -> None:
        """Take the signatures of ``lists`` (paths in ``folder``): call it before they
        are read, so a change while they are read is seen next time."""
        self.folder = folder
        info = os.lstat(folder)
        self._folder_id = info.st_dev, info.st_ino
        self._private_parent: bool | None = None
        self._seen: dict[str, Signature | None] = {p: file_signature(p) for p in lists}

    def trusted(self) -> bool:
        """Whether the folder is still the one checked at the start, in a folder only
        this user (or root) can move it out of."""
        if self._private_parent is None:
            try:
                environment.check_private(self.folder, whole_path=True)
                self._private_parent = True
            except OSError:
                self._private_parent = False
        try:
            info = os.lstat(self.folder)
        except OSError:
            return False
        return self._private_parent and (info.st_dev, info.st_ino) == self._folder_id

    def changed(self, path: str) -> bool:
        """Whether the list at ``path`` changed since it was last read (then it counts as
        read now)."""
        now = file_signature(path)
        if now == self._seen.get(path):
            return False
        self._seen[path] = now
        return True
