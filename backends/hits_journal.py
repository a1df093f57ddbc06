"""A shared, append-only journal of cache hits, written in batches.

Each process counts hits in memory and appends them as lines
``"<count> <unix time> <key>\\n"`` with one ``O_APPEND`` write per batch, so
lines from many processes never interleave. Readers sum the lines. Counts are
advisory: losing a batch (a crash, a full disk) never loses an entry.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["HitsJournal"]

_MAX_READ = 64 << 20


class HitsJournal:
    """Counts hits per key and shares them with other processes through ``path``."""

    def __init__(self, path: str, *, batch: int = 64, interval: float = 5.0) -> None:
        self.path = path
        self.batch = max(1, batch)
        self.interval = interval
        self.writable = True
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._count = 0
        self._last_flush = time.monotonic()

    def record(self, key: str) -> None:
        """Count one hit of ``key``; append the batch when it is full or old."""
        with self._lock:
            self._pending[key] = self._pending.get(key, 0) + 1
            self._count += 1
            due = self._count >= self.batch or time.monotonic() - self._last_flush > self.interval
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
        data = "".join(f"{n} {now:.3f} {k}\n" for k, n in pending.items()).encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)  # one O_APPEND write: lines never interleave
            finally:
                os.close(fd)
        except OSError:
            pass  # advisory: losing counts never loses an entry

    def read(self) -> dict[str, tuple[int, float]]:
        """Hits and last hit time per key: the journal plus this process's unflushed counts."""
        counts: dict[str, tuple[int, float]] = {}
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read(_MAX_READ)
        except OSError:
            raw = b""
        for line in raw.decode("utf-8", "replace").splitlines():
            fields = line.split(" ", 2)
            if len(fields) != 3 or not fields[0].isdigit():
                continue
            try:
                when = float(fields[1])
            except ValueError:
                continue
            n, last = counts.get(fields[2], (0, 0.0))
            counts[fields[2]] = (n + int(fields[0]), max(last, when))
        with self._lock:
            for key, n in self._pending.items():
                old, last = counts.get(key, (0, 0.0))
                counts[key] = (old + n, last)
        return counts

    def compact(self, live: set[str], temp: str, min_size: int = 1 << 20) -> None:
        """Rewrite the journal as one line per live key once it exceeds ``min_size`` bytes.

        Appends racing with the rewrite may be lost; counts are advisory.
        """
        try:
            if os.stat(self.path).st_size < min_size:
                return
        except OSError:
            return
        counts = {k: v for k, v in self.read().items() if k in live}
        data = "".join(f"{n} {when:.3f} {k}\n" for k, (n, when) in counts.items())
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                handle.write(data)
            os.replace(temp, self.path)
        except OSError:
            pass
