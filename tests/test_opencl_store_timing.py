"""When the OpenCL write-behind stores, and how it groups what it hands off.

The review of session 41: ``RUNTIME_CACHE_OPENCL_IDLE_SECONDS=inf`` killed the store
thread (a wait past ``threading.TIMEOUT_MAX``), ``abc`` was warned about at every wake-up,
``-5`` and ``nan`` were taken as "off" without a word; the idle hand-off, on by default,
halved a busy app's kernel launches while the detached store built its programs again (it
is off unless set); and a ``Pool`` worker that made a ``Cache`` a task handed its programs
to one detached store a task (200 at once), not one for the store they share.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.opencl import store_timing
from runtime_cache.opencl.store_jobs import StoreJob, group_by_store


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_timing, "_warned", set())
    monkeypatch.delenv(store_timing.ENV_IDLE_SECONDS, raising=False)


def test_the_idle_hand_off_is_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert store_timing.idle_seconds() is None
    for off in ("", "0", "off", "never"):
        monkeypatch.setenv(store_timing.ENV_IDLE_SECONDS, off)
        assert store_timing.idle_seconds() is None
    monkeypatch.setenv(store_timing.ENV_IDLE_SECONDS, "10")
    assert store_timing.idle_seconds() == 10.0
    monkeypatch.setenv(store_timing.ENV_IDLE_SECONDS, "1e10")  # (a wait takes no more)
    assert store_timing.idle_seconds() == threading.TIMEOUT_MAX


@pytest.mark.parametrize("bad", ["inf", "1e400", "nan", "-5", "abc"])
def test_a_bad_idle_setting_is_said_once_and_taken_as_off(
    bad: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(store_timing.ENV_IDLE_SECONDS, bad)
    with caplog.at_level(logging.WARNING, logger=store_timing.__name__):
        assert [store_timing.idle_seconds() for _ in range(3)] == [None, None, None]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "no number of seconds" in said[0], said


def test_programs_of_several_caches_of_one_store_go_to_one_hand_off(tmp_path: Path) -> None:
    one = [rc.Cache(rc.open_backend(f"dir://{tmp_path / 'a'}")) for _ in range(5)]
    other = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'b'}"))
    memory = [rc.Cache(rc.open_backend("memory://")) for _ in range(2)]  # (none reopens)
    jobs = [StoreJob(cache, None, None, 0.0, None) for cache in [*one, other, *memory]]
    groups = group_by_store(jobs)
    assert sorted(len(group) for group in groups) == [1, 1, 1, 5]
    signed = rc.Cache(rc.open_backend(f"dir://{tmp_path / 'a'}"), secret="another-key-0123456789")
    assert len(group_by_store([*jobs[:5], StoreJob(signed, None, None, 0.0, None)])) == 2
