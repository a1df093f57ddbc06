"""Every built-in in-process backend passes the shared conformance suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_cache.api import Backend
from runtime_cache.backends.callback import CallbackBackend
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.testing import BackendConformance, CacheConformance


class TestMemory(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        yield MemoryBackend(max_size="64MB")


class TestCallback(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        store: dict[str, bytes] = {}
        yield CallbackBackend(
            load=store.get,
            store=store.__setitem__,
            delete=lambda k: store.pop(k, None) is not None,
            keys=lambda: list(store),
        )


class TestDirectory(BackendConformance, CacheConformance):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[Backend]:
        backend = DirectoryBackend(tmp_path / "cache")
        yield backend
        backend.close()
