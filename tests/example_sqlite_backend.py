"""A small SQLite backend: the worked example of docs/guides/custom-backend.md.

tests/test_custom_backend.py runs the conformance suite and the CLI against it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator

from runtime_cache.api import Backend, BackendURL
from runtime_cache.errors import BackendError, InvalidKeyError


class SqliteBackend(Backend):
    """Entries as rows of one SQLite table. URL: ``sqlite:///abs/path/cache.db``."""

    scheme = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()  # one connection, shared by threads in turn
        try:
            self._db: sqlite3.Connection | None = sqlite3.connect(path, check_same_thread=False)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value BLOB NOT NULL)"
            )
            self._db.commit()
        except sqlite3.Error as exc:
            raise BackendError(f"cannot open {path}: {exc}") from exc

    @classmethod
    def from_url(cls, url: str) -> SqliteBackend:
        parsed = BackendURL.parse(url)
        parsed.reject_unknown()  # this backend takes no ?options
        return cls(parsed.netloc + parsed.path)

    def _run(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self._db is None:
            raise BackendError(f"{self.path} is closed")
        try:
            with self._lock:
                cursor = self._db.execute(sql, args)
                self._db.commit()
                return cursor
        except sqlite3.Error as exc:  # typed errors: the Cache front decides the policy
            raise BackendError(f"sqlite {self.path}: {exc}") from exc

    @staticmethod
    def _check(key: str) -> None:
        if not isinstance(key, str) or not key or "\x00" in key:
            raise InvalidKeyError(f"a key must be a non-empty str without NUL: {key!r}")

    def get(self, key: str) -> bytes | None:
        self._check(key)
        row = self._run("SELECT value FROM entries WHERE key = ?", key).fetchone()
        return None if row is None else bytes(row[0])

    def set(self, key: str, value: bytes) -> None:
        self._check(key)
        self._run("INSERT OR REPLACE INTO entries VALUES (?, ?)", key, bytes(value))

    def delete(self, key: str) -> bool:
        self._check(key)
        return self._run("DELETE FROM entries WHERE key = ?", key).rowcount > 0

    def keys(self, prefix: str = "") -> Iterator[str]:
        sql = "SELECT key FROM entries WHERE substr(key, 1, ?) = ?"
        return iter([row[0] for row in self._run(sql, len(prefix), prefix).fetchall()])

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
