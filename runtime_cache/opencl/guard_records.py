"""What the crash guard (:mod:`.guard`) records on its lists: binaries known to load here,
blocklisted, set aside, or taken off the blocklist and the suspect list.

:class:`GuardRecords` is the part of :class:`~runtime_cache.opencl.guard.LoadGuard` that
writes those lists; the guard reads them (see its module's text for what each means).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from functools import partial

from .guard_files import (
    append_lines,
    dead_marks,
    lines_without,
    process_alive,
    record_nothing,
    rewrite_lines,
)
from .known_list import KnownList, read_lines

__all__ = [
    "BLOCKLIST",
    "CLEARED",
    "MAX_LINES",
    "SET_ASIDE_LIST",
    "SUSPECT_LIST",
    "GuardRecords",
    "Held",
    "append_once",
    "compact_suspects",
    "held_against",
    "read_suspects",
]

BLOCKLIST = "blocklist"
SET_ASIDE_LIST = "set-aside"
SUSPECT_LIST = "suspect"
#: The most lines a list keeps (the oldest go first).
MAX_LINES = 10_000
#: Begins a line of the suspect list that clears the digest after it (a child loaded it):
#: a line cut short by a full disk, then completed by the next append, is then no digest,
#: where a cut ``<digest>-`` would have read as one more death.
CLEARED = "-"


def read_suspects(lines: Sequence[str]) -> tuple[set[str], set[str]]:
    """``(suspect, struck)`` from the suspect list's lines, in the order written: a line
    per death while loading a digest, and ``-<digest>`` where a vetting child (or the
    driver) cleared it since. A death makes a suspect; a death after a clearance (a binary
    a child loaded, that a process then died loading again: a crash the child does not
    reproduce) strikes it for good, so that such a crash cannot repeat at every start.
    Deaths with no clearance between them are one incident (workers of one app killed
    together, restarted at once; a line written again after a cut append), since a suspect
    is never loaded before a clearance."""
    state: dict[str, bool] = {}  # digest -> cleared since its last death
    struck: set[str] = set()
    for line in lines:
        if line.startswith(CLEARED):
            digest = line[len(CLEARED) :]
            if digest in state:
                state[digest] = True
        elif state.get(line):
            struck.add(line)
        else:
            state[line] = False
    return {d for d, cleared in state.items() if not cleared} - struck, struck


def compact_suspects(lines: list[str], keep: int) -> list[str]:
    """The suspect list's ``lines`` written again, smaller: a struck digest as a death, a
    clearance and a death, a suspect as a death, cleared ones not at all (trimming by age
    would let a struck crash come back); the newest ``keep`` lines of that, if longer."""
    suspect, struck = read_suspects(lines)
    order = list(dict.fromkeys(line.lstrip(CLEARED) for line in lines))
    out: list[str] = []
    for digest in order:
        if digest in struck:
            out += [digest, CLEARED + digest, digest]
        elif digest in suspect:
            out.append(digest)
    return out[-keep:]


#: What a guard folder holds against loading: its blocklist's digests, its suspect list's
#: lines, and digests struck here (its dead processes' marks where it cannot be written).
Held = tuple[list[str], list[str], list[str]]


def held_against(folder: str, names: list[str]) -> Held:
    """What a guard folder this process cannot write (its ``names``) holds against loading
    (:data:`Held`); its dead processes' marks are left for a process that can record them."""
    found = dead_marks(folder, names, process_alive, None, record_nothing)
    suspect = read_lines(os.path.join(folder, SUSPECT_LIST))[-MAX_LINES:]
    return read_lines(os.path.join(folder, BLOCKLIST))[-MAX_LINES:], suspect, found


def append_once(path: str, digests: list[str]) -> bool:
    """Append ``digests`` to the suspect list at ``path``, each once; whether it took them."""
    return append_lines(path, list(dict.fromkeys(digests)), MAX_LINES, compact_suspects)


class GuardRecords:
    """The guard's writes to its lists."""

    _lock: threading.Lock
    _blocked: set[str]
    _suspect: set[str]
    _set_aside: frozenset[str]
    _known: KnownList | None

    @property
    def folder(self) -> str:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def vouch(self, marks: Sequence[str]) -> None:
        """Record binaries (under their keys, :func:`bindings`) as known: the driver made
        them, or a vetting child loaded them."""
        self._record(marks, known=True)

    def block(self, digests: Sequence[str]) -> None:
        """Blocklist binaries that a vetting child could not load (refused, or crashed on)."""
        self._record(digests, known=False)

    def set_aside(self, marks: Sequence[str]) -> None:
        """Record binaries (under their keys) whose trial launches failed or hung in a
        vetting child: not loaded, and not vetted again, here (see the module's text)."""
        with self._lock:
            self._start()
            new = [m for m in dict.fromkeys(marks) if m not in self._set_aside]
            self._set_aside = self._set_aside.union(new)
        if new:
            now = int(time.time())
            lines = [f"{mark}@{now}" for mark in new]
            append_lines(os.path.join(self.folder, SET_ASIDE_LIST), lines, MAX_LINES)

    def _record(self, digests: Sequence[str], *, known: bool) -> None:
        """Move ``digests`` onto the known list or the blocklist (and off the blocklist);
        append the new ones to that list's file."""
        with self._lock:
            self._start()  # may replace the lists: take them after it
            target = self._known
            if known:
                self._blocked.difference_update(digests)
                new = target.add(digests) if target is not None else []
            else:
                new = [d for d in dict.fromkeys(digests) if d not in self._blocked]
                self._blocked.update(new)  # a blocked mark is never known (see known())
                self._suspect.difference_update(digests)  # (blocked now: evicted, rebuilt)
        if known and target is not None:
            target.write(new)
        elif not known and new:
            append_lines(os.path.join(self.folder, BLOCKLIST), new, MAX_LINES)

    def unblock(self, digests: Sequence[str]) -> None:
        """Take ``digests`` off the blocklist and the suspect list: the driver itself
        produced or accepted them (a vetting child loaded them). A suspect is cleared by a
        line of its own (:func:`read_suspects`): a later death while loading it strikes it."""
        with self._lock:
            self._start()
            gone = self._blocked & set(digests)
            cleared = self._suspect & set(digests)
            self._blocked -= gone
            self._suspect -= cleared
        # Of the lines there now: another process's blocked digests since stay blocked.
        if gone:
            rewrite_lines(os.path.join(self.folder, BLOCKLIST), partial(lines_without, gone=gone))
        if cleared:
            lines = [f"{CLEARED}{digest}" for digest in sorted(cleared)]
            path = os.path.join(self.folder, SUSPECT_LIST)
            append_lines(path, lines, MAX_LINES, compact_suspects)
