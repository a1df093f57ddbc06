"""Folders of this user's state that another user could have made first.

With no home folder (no ``HOME``, no passwd entry: a container run as an arbitrary
uid), the drivers' caches and the detached store's records go under the shared
temporary folder, at names anyone can compute. Another user who makes those first
could plant the native code a driver loads from its cache, or point the detached
store's tidying (it removes old records and truncates its log) at the victim's files
through a link. Each is refused, and the rest runs without it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest

from runtime_cache import environment
from runtime_cache.opencl import driver_cache
from runtime_cache.opencl.detached_store import _prepare

OTHER_UID = 5555  # no passwd entry needed: root can give a folder to any uid
as_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="needs root, to give a folder to another uid",
)
DRIVER_VARIABLES = (
    "POCL_CACHE_DIR",
    "POCL_KERNEL_CACHE",
    "CUDA_CACHE_PATH",
    "CUDA_CACHE_DISABLE",
    driver_cache.ENV_DIR,
)


def _precious(folder: Path) -> None:
    """A private folder of the victim's: an old settings file and a large log."""
    folder.mkdir(mode=0o700)
    (folder / "settings.json").write_text("{}")
    old = time.time() - 10 * 86400
    os.utime(folder / "settings.json", (old, old))
    (folder / "detached.log").write_bytes(b"x" * (2 << 20))


def _intact(folder: Path) -> bool:
    return (folder / "settings.json").exists() and (folder / "detached.log").stat().st_size == (
        2 << 20
    )


def test_a_records_folder_that_is_a_link_is_refused_and_its_target_untouched(
    tmp_path: Path,
) -> None:
    _precious(tmp_path / "precious")
    (tmp_path / "state").mkdir(mode=0o700)
    link = tmp_path / "state" / "opencl-detached"
    link.symlink_to(tmp_path / "precious")
    with pytest.raises(PermissionError, match="link"):
        _prepare(str(link))
    assert _intact(tmp_path / "precious")


@as_root
def test_a_records_folder_in_another_users_folder_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "runtime-cache-0-state"
    parent.mkdir(mode=0o755)
    os.chown(parent, OTHER_UID, OTHER_UID)  # made first by someone else: they can swap it
    _precious(parent / "opencl-detached")
    with pytest.raises(PermissionError, match="another user"):
        _prepare(str(parent / "opencl-detached"))
    assert _intact(parent / "opencl-detached")


def test_a_records_folder_in_a_sticky_shared_folder_is_used(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp: nobody else can move our folder out of it
    _prepare(str(shared / "runs"))
    assert (shared / "runs").is_dir()


def test_a_records_folder_made_under_umask_002_is_used(tmp_path: Path) -> None:
    """Its parent, made 0775 by umask 002, refused the detached store for good."""
    old = os.umask(0o002)
    try:
        _prepare(str(tmp_path / "state" / "opencl-detached"))
    finally:
        os.umask(old)
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700


@as_root
def test_a_parent_only_the_users_private_group_can_write_is_private(tmp_path: Path) -> None:
    from runtime_cache.environment import group_of_one

    if not group_of_one(0, 0):
        pytest.skip("root's group is not root's alone here")
    parent = tmp_path / "state"
    parent.mkdir()
    parent.chmod(0o775)  # made by umask 002 before, in the user's private group
    _prepare(str(parent / "opencl-detached"))
    os.chown(parent, 0, OTHER_UID)  # a group with others in it: they could swap the folder
    with pytest.raises(PermissionError, match="move"):
        _prepare(str(parent / "opencl-detached"))


@pytest.fixture
def no_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No home folder: the drivers' caches go to ``tmp_path/fallback-driver``."""

    def no_home_folder(*args: object, **kwargs: object) -> str:
        raise RuntimeError("no HOME and no passwd entry")

    for name in DRIVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(platformdirs, "user_cache_dir", no_home_folder)
    monkeypatch.setattr(environment, "fallback_directory", lambda kind: str(tmp_path / kind))
    yield tmp_path / "driver"


def test_no_home_makes_a_private_folder_for_the_drivers_caches(no_home: Path) -> None:
    chosen = driver_cache.prepare()
    assert chosen == {"pocl": str(no_home / "pocl"), "nvidia": str(no_home / "nvidia")}
    assert os.environ["POCL_CACHE_DIR"] == str(no_home / "pocl")
    assert no_home.stat().st_mode & 0o777 == 0o700


def test_a_link_at_the_drivers_folder_leaves_the_drivers_alone(
    no_home: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "planted").mkdir(mode=0o777)
    no_home.symlink_to(tmp_path / "planted")
    with caplog.at_level(logging.WARNING, logger="runtime_cache"):
        assert driver_cache.prepare() == {}
    assert "POCL_CACHE_DIR" not in os.environ and "CUDA_CACHE_PATH" not in os.environ
    assert driver_cache.managed_folder("pocl") is None
    assert "left alone" in caplog.text


@as_root
def test_another_users_folder_at_the_drivers_name_leaves_the_drivers_alone(
    no_home: Path,
) -> None:
    (no_home / "pocl").mkdir(parents=True, mode=0o777)
    for folder in (no_home, no_home / "pocl"):
        os.chown(folder, OTHER_UID, OTHER_UID)
    assert driver_cache.prepare() == {}
    assert "POCL_CACHE_DIR" not in os.environ


def test_a_drivers_folder_others_can_write_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in DRIVER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    root = tmp_path / "drivers"
    (root / "pocl").mkdir(parents=True)
    (root / "pocl").chmod(0o777)  # anyone could plant a kernel library there
    monkeypatch.setenv(driver_cache.ENV_DIR, str(root))
    assert driver_cache.prepare() == {"nvidia": str(root / "nvidia")}
    assert "POCL_CACHE_DIR" not in os.environ
