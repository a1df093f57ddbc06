"""A shared, append-only journal of cache hits, written in batches.

Each process counts hits in memory and appends them as lines
``"<count> <unix time> <key>\\n"`` with one ``O_APPEND`` write per batch, so
lines from many processes never interleave. Readers sum the lines. Removing an
entry appends ``"- <unix time> <key>\\n"``: its count starts again from zero. Counts are
advisory: losing a batch (a crash, a full disk) never loses an entry.

The journal is opened relative to the cache's root descriptor with
``O_NOFOLLOW | O_NONBLOCK`` and used only when ``fstat`` says it is a regular
file: a link or a FIFO planted in its place is never written through, and a
huge file is not read. It is appended to, cut or ``chmod``-ed only when it has no
other name (:mod:`.fixed_files`): a hard link planted there (to a file of the writer's
outside the cache) is set aside as junk, never written.

A vacuum compacts it (one line per live key). So does a process whose append finds it
past :data:`COMPACT_AT`, on a thread of its own, at most once a :data:`COMPACT_EVERY`
seconds: a long-lived process hitting many keys grew it to the read cap (64 MiB then, 47
bytes a hit) in about 20 minutes at 1,000 hits a second, and no hit counted after that.
Where one line per live key is itself that large, the process waits for twice what its
last compaction kept before it compacts again.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Container, Iterator

from .dir_fs import NOFOLLOW, create_new, set_aside
from .dir_tree import keys_until
from .fixed_files import NotInPlace, in_place, open_in_place

__all__ = ["COMPACT_AT", "COMPACT_EVERY", "MAX_READ", "READ_SECONDS", "HitsJournal"]

log = logging.getLogger(__name__)

#: A journal this large is compacted by the process whose append finds it so.
COMPACT_AT = 8 << 20
#: A larger journal is junk: read as empty, and compacted so.
MAX_READ = 4 * COMPACT_AT
#: The longest a read parses (a padded journal: about 20 MB of lines a second).
READ_SECONDS = 0.5
#: Bytes parsed between two looks at the clock.
_PIECE = 1 << 18
#: The fewest seconds between two such compactions by one process.
COMPACT_EVERY = 60.0
#: The longest the listing of live keys for such a compaction may take.
_LIST_SECONDS = 1.0
#: The most hits a line may add (more digits: junk), and the most any key shows.
_MAX_DIGITS = 16
MAX_HITS = 1 << 53  # 16 digits: what compaction writes, a reader takes
_FULL = (errno.ENOSPC, errno.EDQUOT)
#: The journal may always grow this far, however full the disk (a sixteenth of the room
#: it leaves is the bound above that).
_LEAST_ROOM = 1 << 14
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW


class HitsJournal:
    """Counts hits per key and shares them with other processes through ``path``."""

    def __init__(
        self,
        dir_fd: int,
        name: str,
        *,
        batch: int = 64,
        interval: float = 5.0,
        mode: int = 0o600,
        chmod: int | None = None,
        temp_prefix: str | None = None,
        cap: int | None = None,
        on_batch: Callable[[], None] | None = None,
    ) -> None:
        self.dir_fd = dir_fd
        #: Called as a batch's first hit is counted (the backend's flush at exit is set).
        self.on_batch = on_batch
        # A cache of ``cap`` bytes: its journal is compacted past a sixteenth of that and
        # written no further past an eighth (it is not counted in the cap, and on a small
        # disk it filled what the entries left: every store failed, a compaction too).
        self.compact_at = COMPACT_AT if cap is None else max(1 << 16, min(COMPACT_AT, cap // 16))
        self.append_until = MAX_READ if cap is None else max(1 << 17, min(MAX_READ, cap // 8))
        self.name = name
        self.mode = mode
        self.chmod = chmod
        self.batch = max(1, batch)
        self.interval = interval
        self.writable = True
        self._set_aside = False  # a non-file at the journal's name removed, once a process
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._count = 0
        self._last_flush = time.monotonic()
        self._compacted = -COMPACT_EVERY  # (monotonic) when this process last compacted it
        self._kept = 0  # twice what its last compaction kept: many live keys, no sooner
        #: Where a compaction writes first (a temp name under the root); None: never here.
        self.temp_prefix = temp_prefix

    def forget_pending(self) -> None:
        """Drop the unflushed counts (a forked child must not append its parent's hits)."""
        self._lock = threading.Lock()
        self._pending, self._count = {}, 0

    def record(self, key: str) -> None:
        """Count one hit of ``key``; append the batch when it is full or old."""
        with self._lock:
            first = not self._count
            self._pending[key] = self._pending.get(key, 0) + 1
            self._count += 1
            due = self._count >= self.batch or time.monotonic() - self._last_flush > self.interval
        if first and self.on_batch is not None:
            self.on_batch()
        if due:
            self.flush()

    def flush(self) -> None:
        """Append the hits counted in memory to the journal."""
        with self._lock:
            pending, self._pending, self._count = self._pending, {}, 0
            self._last_flush = time.monotonic()
        if not pending or not self.writable:
            return
        now = time.time()
        self._append("".join(f"{n} {now:.3f} {k}\n" for k, n in pending.items()).encode())

    def forget(self, key: str) -> None:
        """Count ``key``'s hits from zero again: its entry was removed (a later entry under
        the key starts with none). Appends a ``-`` line that readers take as a reset."""
        with self._lock:
            self._pending.pop(key, None)
        if self.writable:
            self._append(f"- {time.time():.3f} {key}\n".encode())

    def _append(self, data: bytes) -> None:
        size, compact_past, full = 0, self.compact_at, False
        try:
            # Written only when a regular file with one name: a hard link planted here (a
            # file of ours outside the cache) is never appended to nor chmod-ed.
            fd = open_in_place(self.dir_fd, self.name, _APPEND, self.mode, self.chmod)
            try:
                st = os.fstat(fd)
                size = st.st_size + len(data)
                compact_past, until = self._bounds(fd, st.st_size)
                if st.st_size < until:
                    os.write(fd, data)  # one O_APPEND write: lines never interleave
            finally:
                os.close(fd)
        except NotInPlace as exc:  # a hard link, or a FIFO with a reader
            self._not_a_file(str(exc.strerror))
        except OSError as exc:  # advisory: losing counts never loses an entry
            if exc.errno in (errno.EISDIR, errno.ELOOP, errno.ENXIO):  # a folder, link, FIFO
                self._not_a_file("not a file")
            full = exc.errno in _FULL  # (compacted, whatever its size: room for entries)
        if self.temp_prefix is not None and (full or size >= max(compact_past, self._kept)):
            self._compact_soon(self.temp_prefix, 0 if full else compact_past)

    def _bounds(self, fd: int, size: int) -> tuple[int, int]:
        """The sizes past which the journal (now ``size`` bytes) is compacted, and past
        which it is appended to no more: the cap's (:attr:`compact_at`,
        :attr:`append_until`), and at most a sixteenth of the room the disk leaves it. The
        journal is not counted in the cap: on a small disk (a 2 MB one, with the default
        cap) its hits took what the entries left, and every store failed for an hour."""
        try:
            vfs = os.fstatvfs(fd)
        except OSError:
            return self.compact_at, self.append_until
        if not vfs.f_blocks:  # no size told (ramfs, a tmpfs with size=0): the cap's alone
            return self.compact_at, self.append_until
        room = size + vfs.f_bavail * vfs.f_frsize
        until = min(self.append_until, max(_LEAST_ROOM, room // 16))
        return min(self.compact_at, max(_LEAST_ROOM // 2, until // 2)), until

    def _not_a_file(self, what: str) -> None:
        # A folder, a link or a FIFO at the journal's name (planted, or left by a mistake)
        # turned hit counting off for good, without a word: set aside once, and said.
        if self._set_aside:
            return
        self._set_aside = True
        log.warning("runtime-cache: %s is %s; set aside, so that uses count again", self.name, what)
        set_aside(self.dir_fd, self.name, ".junk-")

    def _compact_soon(self, temp_prefix: str, past: int) -> None:
        # On a thread of its own: listing the keys and reading the journal take a second.
        with self._lock:
            if time.monotonic() - self._compacted < COMPACT_EVERY:
                return
            self._compacted = time.monotonic()
        try:  # the thread's own descriptor: the backend may close its own meanwhile
            root = os.dup(self.dir_fd)
        except OSError:
            return

        def live() -> set[str] | None:
            return keys_until(root, time.monotonic() + _LIST_SECONDS)

        def compact() -> None:
            try:
                self._kept = 2 * (self.compact(live, temp_prefix, past, root) or 0)
            except Exception:  # advisory: next time
                pass
            finally:
                os.close(root)

        try:
            threading.Thread(target=compact, name="runtime-cache hits", daemon=True).start()
        except RuntimeError:  # no new thread at the interpreter's exit (its last flush)
            os.close(root)

    def read(
        self,
        pending: bool = True,
        dir_fd: int | None = None,
        keep: Container[str] | None = None,
    ) -> dict[str, tuple[int, float]]:
        """Hits and last hit time per key: the journal plus this process's unflushed counts
        (``pending=False``: the journal's alone, as a compaction writes it back; ``dir_fd``:
        the root's descriptor to read it under, when not the journal's own; ``keep``: the
        keys to count, the others' lines skipped).

        A journal a writer of the folder padded (millions of lines of keys that are not
        there) costs at most :data:`READ_SECONDS` of parsing: the lines after are left
        out, and a compaction writes back what was counted."""
        counts: dict[str, tuple[int, float]] = {}
        raw = b""
        folder = self.dir_fd if dir_fd is None else dir_fd
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=folder)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_READ:  # else junk: compact
                    raw = os.read(fd, MAX_READ)
            except OSError:
                pass
            finally:
                os.close(fd)
        deadline = time.monotonic() + READ_SECONDS
        for lines in _pieces(raw):
            if time.monotonic() > deadline:
                log.warning(
                    "runtime-cache: hits journal %s took over %.1f s to read; the rest left "
                    "out (padded by a writer of the folder?)",
                    self.name,
                    READ_SECONDS,
                )
                break
            for line in lines:
                fields = line.split(" ", 2)
                if len(fields) != 3 or (keep is not None and fields[2] not in keep):
                    continue
                if fields[0] == "-":  # the entry was removed: its count starts again
                    counts.pop(fields[2], None)
                    continue
                hits = fields[0]
                # ASCII digits only ("²".isdigit() holds, and int() refuses it), and few.
                if not (hits.isascii() and hits.isdigit()) or len(hits) > _MAX_DIGITS:
                    continue
                try:
                    when = float(fields[1])
                except ValueError:
                    continue
                if not math.isfinite(when):
                    continue
                n, last = counts.get(fields[2], (0, 0.0))
                counts[fields[2]] = (min(n + int(hits), MAX_HITS), max(last, when))
        with self._lock:
            for key, n in self._pending.items() if pending else ():
                if keep is None or key in keep:
                    old, last = counts.get(key, (0, 0.0))
                    counts[key] = (old + n, last)
        return counts

    def compact(
        self,
        live: Callable[[], set[str] | None],
        temp_prefix: str,
        min_size: int = 1 << 20,
        dir_fd: int | None = None,
    ) -> int | None:
        """Rewrite the journal as one line per live key once it exceeds ``min_size`` bytes;
        the bytes written (``None``: not rewritten).

        ``live()`` lists the keys that still have entries (asked only when the journal
        is that large; ``None``: not now, compact another time). The new journal is
        written to a fresh temp file (``O_EXCL``, a random name starting with
        ``temp_prefix``), then renamed over the old one, which also replaces anything
        planted there. Appends racing with the rewrite may be lost; counts are advisory.
        ``dir_fd``: the root's descriptor to work under, when not the journal's own.
        """
        folder = self.dir_fd if dir_fd is None else dir_fd
        try:
            st = os.stat(self.name, dir_fd=folder, follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISREG(st.st_mode) and st.st_size < min_size:
            return None
        keys = live()
        if keys is None:
            return None
        # Not this process's unflushed counts: its next flush appends them (counted twice).
        counts = self.read(pending=False, dir_fd=folder, keep=keys)
        data = "".join(f"{n} {when:.3f} {k}\n" for k, (n, when) in counts.items()).encode()
        try:
            fd, temp = create_new(folder, temp_prefix, self.mode, self.chmod)
        except OSError as exc:
            return self._rewrite_in_place(folder, data) if exc.errno in _FULL else None
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, "short write")
            os.replace(temp, self.name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=folder)
            return self._rewrite_in_place(folder, data) if exc.errno in _FULL else None
        finally:
            os.close(fd)
        return len(data)

    def _rewrite_in_place(self, folder: int, data: bytes) -> int | None:
        # A full disk has no room for a new journal beside the old: the old one is cut and
        # written again (never more than it held). Appends racing it may be lost, and a
        # crash in between loses counts: advisory, as ever.
        try:
            fd = os.open(self.name, os.O_WRONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=folder)
        except OSError:
            return None
        try:
            if not in_place(os.fstat(fd)):  # a FIFO, or a hard link: never cut
                return None
            os.ftruncate(fd, 0)
            os.write(fd, data)
        except OSError:
            return None
        finally:
            os.close(fd)
        return len(data)


def _pieces(raw: bytes) -> Iterator[list[str]]:
    """The ``\n``-ended lines of ``raw``, about :data:`_PIECE` bytes of them at a time: no
    list of a whole padded journal's lines is made, and no piece runs on (lines ended by
    ``\r``, or another break ``str.splitlines`` knows, made one piece of 32 MiB, parsed past
    the read's deadline). A line longer than 4 KiB is junk, left out."""
    carry = b""
    for start in range(0, len(raw), _PIECE):
        chunk = carry + raw[start : start + _PIECE]
        cut = chunk.rfind(b"\n") + 1
        carry = chunk[cut:] if len(chunk) - cut <= 4096 else b""
        yield chunk[:cut].decode("utf-8", "replace").split("\n")  # (empty: the clock looks)
    yield carry.decode("utf-8", "replace").split("\n")
