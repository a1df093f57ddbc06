"""Machines without a usable home folder: no HOME and no passwd entry (containers, ``env -i``),
or a read-only home. get_cache() and build_program() carry on with one warning."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import runtime_cache as rc
from runtime_cache.backends.dir_url import DEFAULT_MAX_SIZE
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.errors import InvalidURLError

UID = 48213  # no passwd entry on a test machine
WARNING = "no usable home folder"


def _user_tmp() -> str:
    """A temporary folder every user can write (sticky and world-writable, as /tmp is): the
    tests' uid must make its own folders there. A private TMPDIR (0755, root's) made three
    of these tests fail for a reason of the machine's, so /tmp stands in for it then."""
    here = tempfile.gettempdir()
    return here if os.stat(here).st_mode & 0o1002 == 0o1002 else "/tmp"


TMP = _user_tmp()

SCRIPT = r"""
import logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import runtime_cache as rc
cache = rc.get_cache()
print("cache", cache)
if sys.argv[1] == "opencl":
    import pyopencl as cl
    from runtime_cache.opencl import build_program, choose_device, opencl_stats
    ctx = cl.Context([choose_device()])
    src = "__kernel void k(__global float *a) { a[get_global_id(0)] = 2.0f; }"
    build_program(ctx, src, module_id="no-home")
    build_program(cl.Context(ctx.devices), src, module_id="no-home")
    print("stats", cache.stats().hits, cache.stats().stores)
"""


def _as_user(uid: int, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run this Python as ``uid`` (no supplementary groups), able to read the interpreter and
    the source (CAP_DAC_READ_SEARCH: the test machine keeps them under /root) but not to
    write anything of root's."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run as a uid with no passwd entry")
    caps = ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *caps]
    return subprocess.run(
        [*command, "env", "-i", *[f"{k}={v}" for k, v in env.items()], *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TMP,
    )


def _env(**extra: str) -> dict[str, str]:
    root = str(Path(rc.__file__).resolve().parent.parent)
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "PYOPENCL_CTX")}
    path = os.pathsep.join([root, *sys.path[1:]])
    return {**keep, "TMPDIR": TMP, "PYTHONPATH": path, **extra}


@pytest.fixture
def fresh_uid() -> int:
    """A uid with no passwd entry, and no leftover temporary folders of its own."""
    import pwd

    try:
        pwd.getpwuid(UID)
        pytest.skip(f"uid {UID} has a passwd entry here")
    except KeyError:
        pass
    for kind in ("cache", "state", "driver"):
        shutil.rmtree(Path(TMP) / f"runtime-cache-{UID}-{kind}", True)
    return UID


def test_get_cache_without_home_or_passwd_entry_warns_once(fresh_uid: int) -> None:
    done = _as_user(fresh_uid, [sys.executable, "-c", SCRIPT, "plain"], _env())
    assert done.returncode == 0, done.stderr
    assert f"runtime-cache-{fresh_uid}-cache" in done.stdout  # a private temporary folder
    assert done.stderr.count(WARNING) == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", ["dir://", "dir://?max_size=64MiB"])
@pytest.mark.parametrize("how", ["env", "provider"])
def test_the_default_named_as_dir_falls_back_as_the_default_does(
    fresh_uid: int, how: str, url: str, tmp_path: Path
) -> None:
    """Operator review, session 36: ``set_cache_provider("dir://")`` (or ``RUNTIME_CACHE=dir://``)
    with a read-only home turned caching off, where the default it names falls back to a
    private temporary folder; with options (``dir://?max_size=64MiB``) it still did."""
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)  # root's, and read-only to the test user
    tmp_path.chmod(0o755)
    opened = "rc.set_cache_provider(sys.argv[1])" if how == "provider" else "rc.get_cache()"
    script = f"import sys, runtime_cache as rc; c = {opened}; print('cache', c, c.backend.max_size)"
    env = _env(HOME=str(home), **({"RUNTIME_CACHE": url} if how == "env" else {}))
    done = _as_user(fresh_uid, [sys.executable, "-c", script, url], env)
    assert done.returncode == 0, done.stderr
    assert f"runtime-cache-{fresh_uid}-cache" in done.stdout, done.stdout
    assert int(done.stdout.split()[-1]) == (DEFAULT_MAX_SIZE if url == "dir://" else 64 << 20)
    assert "caching is off" not in done.stderr, done.stderr


def test_the_default_folder_shared_without_a_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """Review: ``dir://?shared=1`` and no secret fell back as a home folder's trouble, to a
    temporary folder and then memory, saying "no usable home folder"; it is the setting's
    error, raised as ``dir:///path?shared=1`` raises it. (In a cache folder of the test's
    own: in the user's, it left ``~/.cache/runtime-cache`` made shared, ``2775``, and every
    later default cache of that user refused it.)"""
    from runtime_cache.errors import InsecureStoreError

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("RUNTIME_CACHE_SECRET", raising=False)
    with pytest.raises(InsecureStoreError):
        rc.set_cache_provider("dir://?shared=1")
    assert "no usable home folder" not in caplog.text


@pytest.mark.parametrize("how", ["env", "provider"])
def test_a_typo_in_the_default_folders_options_is_still_an_error(how: str) -> None:
    url = "dir://?max_sise=64MiB"
    if how == "provider":
        with pytest.raises(InvalidURLError, match="max_sise"):
            rc.set_cache_provider(url)
        return
    script = "import runtime_cache as rc; print('cache', rc.get_cache())"
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(HOME=TMP, RUNTIME_CACHE=url),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=TMP,
    )
    assert done.returncode == 0 and "max_sise" in done.stderr and "caching is off" in done.stderr


def test_a_link_planted_at_the_fallback_folder_is_never_followed(fresh_uid: int) -> None:
    """Another user (root here) puts a link at the temporary folder this user would take,
    to a folder of this user's: the cache must not open there (its vacuum would clean it)."""
    victim = Path(tempfile.mkdtemp(prefix="rc-victim-", dir=TMP))
    planted = Path(TMP) / f"runtime-cache-{fresh_uid}-cache"
    try:
        notes = victim / ".tmp-0123456789abcdef"
        notes.write_text("the user's own file")
        os.utime(notes, (1, 1))
        os.chown(notes, fresh_uid, fresh_uid)
        os.chown(victim, fresh_uid, fresh_uid)
        planted.symlink_to(victim)
        done = _as_user(fresh_uid, [sys.executable, "-c", SCRIPT, "plain"], _env())
        assert done.returncode == 0, done.stderr
        assert "MemoryBackend" in done.stdout and str(victim) not in done.stdout
        assert notes.read_text() == "the user's own file"
        assert sorted(p.name for p in victim.iterdir()) == [notes.name]
        assert "Traceback" not in done.stderr
    finally:
        planted.unlink(missing_ok=True)
        shutil.rmtree(victim, ignore_errors=True)


def test_the_driver_cache_switched_on_without_home_warns_not_raises(fresh_uid: int) -> None:
    script = "import runtime_cache.opencl, os; print('driver', os.environ.get('POCL_CACHE_DIR'))"
    done = _as_user(fresh_uid, [sys.executable, "-c", script], _env(RUNTIME_CACHE_DRIVER_CACHE="1"))
    assert done.returncode == 0, done.stderr
    assert f"runtime-cache-{fresh_uid}-driver" in done.stdout
    assert "Traceback" not in done.stderr


def test_ls_without_home_makes_no_temporary_folder(fresh_uid: int) -> None:
    """With no home, the default is the temporary folder: a command that only reads names
    it and makes nothing (the check itself used to make it)."""
    done = _as_user(fresh_uid, [sys.executable, "-m", "runtime_cache", "ls"], _env())
    folder = Path(TMP) / f"runtime-cache-{fresh_uid}-cache"
    assert done.returncode == 1, done.stderr
    assert f"no cache at {folder}" in done.stderr and not folder.exists()
    assert "Traceback" not in done.stderr


@pytest.mark.opencl
def test_build_program_without_home_or_passwd_entry_warns_once(fresh_uid: int) -> None:
    from opencl_support import opencl_device

    opencl_device()
    done = _as_user(fresh_uid, [sys.executable, "-c", SCRIPT, "opencl"], _env())
    assert done.returncode == 0, done.stderr
    assert "stats 1 1" in done.stdout  # stored once, then loaded from the cache
    assert done.stderr.count(WARNING) == 1, done.stderr
    guard = Path(TMP) / f"runtime-cache-{fresh_uid}-state" / "opencl-guard"
    assert guard.is_dir() and guard.stat().st_uid == fresh_uid


@pytest.mark.opencl
def test_build_program_with_runtime_cache_set_and_no_home(fresh_uid: int, tmp_path: Path) -> None:
    from opencl_support import opencl_device

    opencl_device()
    done = _as_user(
        fresh_uid, [sys.executable, "-c", SCRIPT, "opencl"], _env(RUNTIME_CACHE="memory://")
    )
    assert done.returncode == 0, done.stderr
    assert "MemoryBackend" in done.stdout  # the cache asked for
    assert "stats 1 1" in done.stdout
    assert done.stderr.count(WARNING) == 1, done.stderr  # the guard's folder moved


@pytest.mark.opencl
def test_read_only_home_warns_once_and_caches_in_a_temporary_folder(
    fresh_uid: int, tmp_path: Path
) -> None:
    from opencl_support import opencl_device

    opencl_device()
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)  # root's, and read-only to the test user
    tmp_path.chmod(0o755)
    done = _as_user(fresh_uid, [sys.executable, "-c", SCRIPT, "opencl"], _env(HOME=str(home)))
    assert done.returncode == 0, done.stderr
    assert f"runtime-cache-{fresh_uid}-cache" in done.stdout
    assert "stats 1 1" in done.stdout
    assert done.stderr.count(WARNING) == 1, done.stderr


def test_a_relative_dir_url_stays_where_it_was_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    backend = rc.open_backend("dir://relative/cache")
    assert isinstance(backend, DirectoryBackend)
    assert backend.root == tmp_path / "relative" / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    backend.set("k/one", b"value")
    assert backend.get("k/one") == b"value"
    assert not (elsewhere / "relative").exists()
    assert rc.open_backend("dir://../relative/cache").get("k/one") == b"value"


@pytest.mark.parametrize(
    "home", [None, "", "relative", "/home/someone", "/tmp/a b/", "/tmp//x", "/"]
)
@pytest.mark.parametrize("xdg", [None, "", "  ", "/srv/state", "relative/state"])
def test_state_directory_is_platformdirs_user_state_dir(
    monkeypatch: pytest.MonkeyPatch, home: str | None, xdg: str | None
) -> None:
    """The guard's folder: the quick XDG default on Linux is platformdirs' answer."""
    import platformdirs

    from runtime_cache import environment

    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    if xdg is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", xdg)
    expected = platformdirs.user_state_dir("runtime-cache", appauthor=False)
    assert environment.state_directory() == expected


@pytest.mark.skipif(sys.platform != "linux", reason="the quick path is Linux's")
def test_state_directory_on_linux_needs_no_platformdirs(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a home and no XDG_STATE_HOME, the guard's folder is found without platformdirs
    (a process's first OpenCL load pays for its classes otherwise)."""
    import platformdirs

    from runtime_cache import environment

    def refuse(*args: object, **kwargs: object) -> str:
        raise AssertionError("platformdirs asked")

    monkeypatch.setenv("HOME", "/home/someone")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setattr(platformdirs, "user_state_dir", refuse)
    assert environment.state_directory() == "/home/someone/.local/state/runtime-cache"


def test_the_cli_says_when_the_default_folder_moved(tmp_path: Path) -> None:
    """A default cache folder that cannot be used (here a file stands in its place): the
    command works on the temporary one, and says so even without -v."""
    (tmp_path / "runtime-cache").write_text("not a folder")
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_CACHE"}
    env.update(XDG_CACHE_HOME=str(tmp_path), TMPDIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "runtime_cache", "ls"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "no usable home folder" in done.stderr and "not a directory" in done.stderr


def _in_forked_child_as(uid: int, run: Callable[[], str]) -> str:
    """``run()``'s text, run in a forked child of this (root) process as ``uid`` with no
    groups and no capabilities: the modules it needs are imported already (the
    interpreter's own files may be closed to that uid); its exception's repr, if any."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            said = run()
        except BaseException as exc:
            said = repr(exc)
        os.write(writing, said.encode())
        os._exit(0)
    os.close(writing)
    with os.fdopen(reading, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return said


def test_a_default_folder_another_user_made_private_falls_back(
    fresh_uid: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator review of session 41: ``~/.cache/runtime-cache`` made ``0700`` by root
    (a ``sudo`` run that kept ``HOME``) was opened all the same (``O_PATH`` opens any
    folder), and every read and write of the user's app failed, for good. It is refused
    at the open now, and the default falls back to the private temporary folder."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder another user may not enter")
    from runtime_cache import provider
    from runtime_cache.errors import ReadOnlyBackendError

    base = Path(tempfile.mkdtemp(dir=TMP))  # (pytest's folders are closed to the uid)
    request.addfinalizer(lambda: shutil.rmtree(base, True))
    base.chmod(0o755)
    home = base / "home"
    theirs = home / ".cache" / "runtime-cache"
    theirs.mkdir(parents=True)
    theirs.chmod(0o700)  # root's
    for folder in (home, home / ".cache"):
        os.chown(folder, fresh_uid, fresh_uid)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", TMP)

    def refused() -> str:
        try:
            DirectoryBackend(theirs)
        except ReadOnlyBackendError as exc:
            return f"refused: {exc}"
        return "opened"

    said = _in_forked_child_as(fresh_uid, refused)
    assert said.startswith("refused: ") and "no permission to enter it" in said, said
    said = _in_forked_child_as(fresh_uid, lambda: str(provider._embedded().backend))
    assert f"runtime-cache-{fresh_uid}-cache" in said, said
