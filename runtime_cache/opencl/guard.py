"""A crash guard: a binary that killed the process while loading is never loaded again.

Some drivers do not reject a bad program binary: they crash inside
``clCreateProgramWithBinary`` or ``clBuildProgram`` (PoCL aborts in LLVM on
some re-checksummed forgeries). No fallback inside the process can catch
that, and without a guard every restart would load the same entry and crash
again. So, while binaries load, this process keeps their digests in its own
file, ``<pid>.<token>.loading``, in the guard folder. The file is mapped into memory
(``MAP_SHARED``), so marking a load costs a memory write, not a system call, and
what was written survives the process's death in the kernel's page cache. A
process holds a lock on its file while it lives (:mod:`.guard_files`); the next
process that finds the file of a process that is gone (it can take the lock)
moves those digests to the *suspect* list: a process killed from outside (``SIGKILL``,
``SIGTERM``, the out-of-memory killer) dies as one the driver crashed does, so a suspect
is not condemned but tried in a vetting child first, signed or not (:mod:`.vetting`): one
that loads there is known again, one that crashes the child is blocklisted. A death after
a child cleared it strikes it (:func:`.guard_records.read_suspects`), as do marks a folder
that cannot be written holds: this machine never loads it again (deleting the ``suspect``
file has it vetted again), builds from source, and evicts nothing (kills from outside can
be what struck it). Where no child can vet a suspect, this machine builds the program
from source and evicts nothing. A blocklisted binary counts as rejected by the driver: it
is evicted and the program is rebuilt from source.

The same folder keeps the list of *known* binaries (:mod:`.known_list`): those
the driver made in a process of this user, or that a vetting child loaded without
harm (see :mod:`runtime_cache.opencl.vetting`). Known binaries load directly. It
also keeps the binaries *set aside*: a vetting child loaded them, but their trial
launches failed or hung, which condemns nothing (a good kernel may fault on made-up
arguments). For :data:`SET_ASIDE_SECONDS` they are neither loaded nor vetted again on
this machine: the program is built from source, and nothing is evicted. Then they are
vetted once more (a trial killed by a busy machine's watchdog, or by the out-of-memory
killer, sets a good binary aside too). Deleting the ``set-aside`` file in the folder has
them vetted again at once.
A binary is known under a key (:func:`binding`), not by its digest alone: the
same bytes copied under another program's key are not known there.

The folder is ``$RUNTIME_CACHE_GUARD_DIR``, or ``opencl-guard`` in
``platformdirs.user_state_dir("runtime-cache")``; with no usable home folder (no
``HOME`` and no passwd entry, or a read-only one) it is ``opencl-guard`` in a
private temporary folder (:func:`runtime_cache.environment.fallback_directory`).
The guard is advisory: if no folder can be used, loading goes on unguarded. In one it
can read but not write (a read-only mount) it still refuses what the folder blocklisted,
and what dead processes were loading, but records no crash of its own.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Sequence

from .. import environment
from .binary_marks import Binary, binary_digest, binding, bindings
from .guard_files import (
    ReadOnlyFolder,
    dead_marks,
    marks_set_aside_since,
    open_folder,
    open_mark_file,
    process_alive,
    remove_left_temps,
)
from .guard_records import (
    BLOCKLIST,
    MAX_LINES,
    SET_ASIDE_LIST,
    SUSPECT_LIST,
    GuardRecords,
    Held,
    append_once,
    held_against,
    read_suspects,
)
from .known_list import KnownList, read_lines
from .list_watch import ListWatch
from .loading_marks import PAGE, LoadingMarks

__all__ = [
    "BLOCKED",
    "KNOWN",
    "SET_ASIDE",
    "STRUCK",
    "SUSPECT",
    "UNKNOWN",
    "Binary",
    "LoadGuard",
    "binary_digest",
    "binding",
    "bindings",
    "guard",
    "process_alive",
]

log = logging.getLogger(__name__)

ENV_GUARD_DIR = "RUNTIME_CACHE_GUARD_DIR"
#: The lists written anew through temporary files (a killed writer's are removed later).
_LISTS = (BLOCKLIST, SET_ASIDE_LIST, SUSPECT_LIST)
_REWRITTEN = frozenset(_LISTS)
#: How long a binary stays set aside (its line in the file holds when it was set aside).
SET_ASIDE_SECONDS = 86_400.0


#: A binary's standing with the guard (:meth:`LoadGuard.standing`).
KNOWN, BLOCKED, SET_ASIDE, UNKNOWN = "known", "blocked", "set aside", "unknown"
SUSPECT, STRUCK = "suspect", "struck"


def _set_aside_in(path: str) -> frozenset[str]:
    """The marks the set-aside list at ``path`` holds for :data:`SET_ASIDE_SECONDS` more."""
    return marks_set_aside_since(SET_ASIDE_SECONDS, read_lines(path)[-MAX_LINES:])


#: Seconds after which :meth:`LoadGuard.blocked`, asked before each load, reads what other
#: processes added to the blocklist since this one looked: a binary that killed another
#: process is refused here too within that time, for a few ``stat`` calls at most that often.
BLOCKLIST_LOOK_SECONDS = 0.1


class LoadGuard(LoadingMarks, GuardRecords):
    """Records the binaries being loaded; holds back those a dead process was loading."""

    def __init__(self, folder: str | None = None) -> None:
        self._folder = None if folder is None else environment.from_start(folder)
        self._given = folder is not None
        self._lock = threading.Lock()
        self._ready = False
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._used = 0
        self._blocked: set[str] = set()
        self._suspect: set[str] = set()
        self._struck: set[str] = set()  # never loaded here, never cleared (see the text)
        self._looked = 0.0  # (monotonic) when the lists were last read or looked at
        self._set_aside: frozenset[str] = frozenset()
        self._known: KnownList | None = None
        self._watch: ListWatch | None = None  # the lists as read (see .list_watch)
        self._loading: dict[str, int] = {}
        self._mark: str | None = None  # this process's mark file's name
        self.recovered = 0

    def _folder_given(self) -> bool:
        return self._given or bool(os.environ.get(ENV_GUARD_DIR, "").strip())

    @staticmethod
    def _open_folder(folder: str) -> list[str]:
        # A shared temporary folder's (telling by name: finding the temporary folder
        # itself writes a probe file there, a cost in every process's first load):
        # another user may have made the path first, so its parent is checked too.
        shared = os.path.basename(os.path.dirname(folder)) == environment.fallback_name("state")
        return open_folder(folder, private_parent=shared)

    @property
    def folder(self) -> str:
        """Where the guard keeps its files."""
        if self._folder is None:
            env = os.environ.get(ENV_GUARD_DIR, "").strip()
            if env:  # absolute, from where the process started: a chdir must not move it
                self._folder = environment.from_start(env)
            else:
                self._folder = os.path.join(environment.state_directory(), "opencl-guard")
        return self._folder

    def _start(self) -> None:
        """Once per process: adopt dead processes' in-flight digests, read the blocklist."""
        if self._ready:
            return
        self._ready = True
        folder = self.folder
        earlier: Held = ([], [], [])  # a read-only home's lists
        try:
            names, writable = self._open_folder(folder), True
        except OSError as exc:
            failed: OSError | None = exc
            if not self._folder_given():
                # A read-only home: keep the guard in a private temporary folder instead,
                # and still refuse what the home folder's guard blocklisted.
                environment.warn_no_home(str(exc))
                if isinstance(exc, ReadOnlyFolder):
                    earlier = held_against(folder, exc.names)
                folder = self._folder = os.path.join(
                    environment.fallback_directory("state"), "opencl-guard"
                )
                try:
                    names, writable, failed = self._open_folder(folder), True, None
                except OSError as again:  # (another user's folder at the temporary name)
                    failed = again
            if isinstance(failed, ReadOnlyFolder):  # read, though no crash can be recorded
                log.warning(
                    "runtime-cache: the OpenCL crash guard's folder %s cannot be written: "
                    "binaries it blocklisted are still refused, but a crash while loading "
                    "is not recorded",
                    folder,
                )
                names, writable = failed.names, False
            elif failed is not None:
                log.warning("runtime-cache: OpenCL crash guard off (%s)", failed)
                self._suspect, struck = read_suspects(earlier[1])
                self._blocked, self._struck = set(earlier[0]), struck | set(earlier[2])
                return
        self._read_folder(folder, names, writable, earlier)

    def _read_folder(self, folder: str, names: list[str], writable: bool, earlier: Held) -> None:
        """Read the lists in ``folder`` (its ``names``) and its dead processes' marks, and
        hold those and ``earlier`` against loading; where it is ``writable``, put the marks
        on the suspect list and make this process's mark file."""
        blocklist, aside, suspect = self._lists()
        # A dead process's marks go once on the suspect list (one death a digest), then are
        # removed; those it could not take (read-only, a full disk) are struck, and left.
        took = False

        def keep(digests: list[str]) -> bool:
            nonlocal took
            took = writable and append_once(suspect, digests)
            return took

        found = dead_marks(folder, names, process_alive, self._mark, keep)
        if writable:
            remove_left_temps(folder, names, _REWRITTEN)
        if found:
            self.recovered = len(found)
            log.warning(
                "runtime-cache: a process died while loading %d cached OpenCL binaries; %s",
                len(found),
                "each is tried in a vetting process before it loads here again"
                if writable
                else "they are built from source here (read-only folder: nothing recorded)",
            )
        try:  # (before the reads: a change meanwhile is read at the next look)
            self._watch = ListWatch(folder, (blocklist, aside, suspect))
        except OSError:
            self._watch = None
        lines = read_lines(suspect)[-MAX_LINES:]
        self._suspect, struck = read_suspects(earlier[1] + lines)
        unrecorded = set(found) if found and not took else set()  # (struck: see above)
        self._struck = struck | unrecorded | set(earlier[2])
        self._suspect -= self._struck
        self._blocked = set(read_lines(blocklist)[-MAX_LINES:]) | set(earlier[0])
        self._looked = time.monotonic()
        self._set_aside = _set_aside_in(aside)
        watch = self._watch
        self._known = KnownList(folder, watch.trusted if watch is not None else lambda: False)
        opened = open_mark_file(folder) if writable else None
        if opened is not None:
            self._fd, self._mark = opened
            self._map_file(PAGE)

    def blocked(self, digests: Sequence[str]) -> bool:
        """Whether any of these binaries once killed a process while loading. What other
        processes blocklisted since this one looked is read first, when
        :data:`BLOCKLIST_LOOK_SECONDS` have passed (a few ``stat`` calls)."""
        with self._lock:
            self._start()
            if any(d in self._blocked for d in digests):
                return True
            if time.monotonic() - self._looked < BLOCKLIST_LOOK_SECONDS:
                return False
            return self._refresh() and any(d in self._blocked for d in digests)

    def suspected(self, digests: Sequence[str]) -> bool:
        """Whether a process that died was loading any of these binaries, and no vetting
        child has loaded them since (see the module's text)."""
        with self._lock:
            self._start()
            return bool(self._suspect) and any(d in self._suspect for d in digests)

    def held_back(self, digests: Sequence[str]) -> bool:
        """Whether this process must not load these binaries, though nothing is evicted:
        suspects (not vetted yet) and struck ones. What other processes found since this
        one looked is read first, as :meth:`blocked` reads it."""
        quiet = time.monotonic() - self._looked < BLOCKLIST_LOOK_SECONDS
        if quiet and self._ready and not (self._suspect or self._struck):  # (most often)
            return False
        with self._lock:
            self._start()
            if time.monotonic() - self._looked >= BLOCKLIST_LOOK_SECONDS:
                self._refresh()
            suspect, struck = self._suspect, self._struck
            return any(d in suspect or d in struck for d in digests)

    def known(self, marks: Sequence[str]) -> bool:
        """Whether every one of these binaries is known to load here without harm
        (``marks`` from :func:`bindings`: each binary under its key)."""
        return self.standing(marks, ()) == KNOWN

    def standing(self, marks: Sequence[str], digests: Sequence[str]) -> str:
        """:data:`BLOCKED` (any of ``digests`` blocklisted), :data:`STRUCK`, :data:`SUSPECT`
        (:data:`SET_ASIDE` where one was set aside too), :data:`KNOWN` (every one known
        under its key, ``marks`` from :func:`bindings`), :data:`SET_ASIDE` (any set aside
        under its key) or :data:`UNKNOWN`, the first that holds. One look-up serves both
        questions: a known binary's load then needs no :meth:`vouch`."""
        with self._lock:
            self._start()
            answer = self._standing(marks, digests)
            # Not known here yet: another process of this machine may have vetted (or
            # blocked) them since this one read the lists; only then is a child started.
            if answer in (UNKNOWN, SET_ASIDE) and self._refresh():
                answer = self._standing(marks, digests)
            return answer

    def _standing(self, marks: Sequence[str], digests: Sequence[str]) -> str:
        blocked = self._blocked
        if any(d in blocked for d in digests):
            return BLOCKED
        aside = self._set_aside
        set_aside = bool(aside) and any(m in aside for m in marks)
        if self._struck and any(d in self._struck for d in digests):
            return STRUCK
        if self._suspect and any(d in self._suspect for d in digests):
            return SET_ASIDE if set_aside else SUSPECT  # (not vetted again for a while)
        known = self._known
        if all(m not in blocked and known is not None and m in known for m in marks):
            return KNOWN
        return SET_ASIDE if set_aside else UNKNOWN

    def _refresh(self) -> bool:
        """Read what other processes added to the lists since this one read them (the
        blocklist and the set-aside list when they changed, the known list's new marks);
        whether anything changed. A few ``stat`` calls when nothing did."""
        self._looked = time.monotonic()
        watch = self._watch
        if self._known is None or watch is None or not watch.trusted():
            return False  # no folder, or not one this process can trust to be the same
        changed = self._known.refresh()
        blocklist, aside, suspect = self._lists()
        if watch.changed(suspect):  # (appended to: read whole again; struck stays struck)
            self._suspect, struck = read_suspects(read_lines(suspect)[-MAX_LINES:])
            self._struck.update(struck)
            self._suspect -= self._struck
            changed = True
        if watch.changed(blocklist):
            # Added to, never replaced: this process's own unblocking stays (the file no
            # longer holds what it took off), and a digest a rewrite missed stays blocked.
            self._blocked.update(read_lines(blocklist)[-MAX_LINES:])
            changed = True
        if watch.changed(aside):
            self._set_aside = self._set_aside.union(_set_aside_in(aside))
            changed = True
        return changed

    def _lists(self) -> tuple[str, str, str]:
        """The paths of the blocklist, the set-aside list and the suspect list."""
        folder = self.folder
        return tuple(os.path.join(folder, n) for n in _LISTS)  # type: ignore[return-value]

    def close(self) -> None:
        """Remove this process's file (at exit): nothing is loading any more."""
        with self._lock:
            if self._map is not None:
                self._map.close()
                self._map = None
            self._used = 0
            if self._fd is not None:
                if self._mark is not None:  # while still locked: never seen as a dead one's
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.folder, self._mark))
                    self._mark = None
                os.close(self._fd)
                self._fd = None

    def after_fork(self) -> None:
        """In a forked child: drop the parent's file and state without touching them."""
        if self._map is not None:
            with contextlib.suppress(OSError, ValueError):
                self._map.close()
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._lock = threading.Lock()
        self._map = None
        self._used = 0
        self._fd = None
        self._mark = None  # the parent's, which it still holds
        self._ready = False
        self._loading = {}

    def reset(self) -> None:
        """Forget state so the next use reads the folder again (after fork, or in tests)."""
        self.close()
        with self._lock:
            self._ready = False
            self._folder = None
            self._blocked = set()
            self._suspect = set()
            self._struck = set()
            self._set_aside = frozenset()
            self._known = None
            self._watch = None
            self._loading = {}


guard = LoadGuard()
atexit.register(guard.close)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=guard.after_fork)
