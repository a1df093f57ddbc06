"""The crash guard: a process that dies while loading cached binaries does not doom the next one.

A process killed from outside (SIGKILL, SIGTERM: a container stopped, the out-of-memory
killer) dies as one the driver crashed does. Its binaries were blocklisted and evicted,
good ones too, from a shared store as well (an operator review). Now they are *suspects*:
tried in a vetting child first, signed or not; one that loads there loads here, one that
crashes the child is blocklisted; with vetting off they are built from source here, and
nothing is evicted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from guard_scripts import TWO_PROGRAMS

from conftest import need
from runtime_cache.opencl.cached_load import CONCURRENT_LOADS

N = 60
CHILD = """
import sys
import pyopencl as cl
import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.opencl import OpenCLModule, choose_device, opencl_stats
ctx = cl.Context([choose_device()])
n = int(sys.argv[2])
sources = {f"k{i}": f"kernel void k{i}(global float *a) {{ a[get_global_id(0)] += {i}.0f; }}"
           for i in range(n)}
secret = sys.argv[3] if len(sys.argv) > 3 else None
module = OpenCLModule(ctx, sources, cache=rc.Cache(DirectoryBackend(sys.argv[1]), secret=secret))
module.build_all(processes=False)
s = opencl_stats()
print(s.binary_loads, s.source_builds, s.rejected_binaries, s.vetted, flush=True)
"""


def _run(cache: Path, env: dict[str, str], *secret: str) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(cache), str(N), *secret],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(x) for x in out.stdout.split()]


def _kill_mid_load(
    cache: Path, env: dict[str, str], guard_dir: Path, *secret: str
) -> tuple[Path, int]:
    """Kill a loading process once its mark names a binary; return the mark and how many
    binaries it names after the kill."""
    victim = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cache), str(N), *secret],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    loading = guard_dir / "none yet"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and victim.poll() is None:
        loading = next(guard_dir.glob(f"{victim.pid}.*.loading"), loading)  # its mark file
        if loading.exists() and loading.read_bytes().strip(b"\0"):  # a digest is in it
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.0005)
    victim.wait(30)
    if victim.returncode != -signal.SIGKILL:
        pytest.fail("the loader finished before it could be killed mid-load")
    # What the dead process was loading: one binary, or two where the driver loads two at
    # once (CONCURRENT_LOADS: PoCL); the second may land just before the kill. None when
    # the kill landed after a load had ended (the Intel runtime, once in CI).
    return loading, len(loading.read_bytes().strip(b"\0").split())


@pytest.mark.parametrize("kind", ["unsigned", "signed", "vetting off"])
def test_a_process_killed_while_loading_neither_repeats_nor_condemns(
    tmp_path: Path, kind: str
) -> None:
    try:
        import pyopencl as cl

        cl.get_platforms()
    except Exception as exc:  # no driver or no platform
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))
    guard_dir = tmp_path / "guard"
    env = {**os.environ, "POCL_KERNEL_CACHE": "0", "RUNTIME_CACHE_GUARD_DIR": str(guard_dir)}
    secret = ("guard-secret",) if kind == "signed" else ()
    cache = tmp_path / "cache"
    assert _run(cache, env, *secret) == [0, N, 0, 0]  # cold: from source, binaries stored
    stored = {p: p.read_bytes() for p in cache.rglob("*.rce")}
    assert len(stored) == N
    # A process loading those binaries dies in the middle (SIGKILL, as a driver crash would).
    for _ in range(5):  # a kill that lands just after a load emptied the mark: again
        loading, in_flight = _kill_mid_load(cache, env, guard_dir, *secret)
        if in_flight:
            break
    assert 1 <= in_flight <= max(CONCURRENT_LOADS.values())
    if kind == "vetting off":
        # Built from source here, none loaded, none evicted: the rebuilt binaries are
        # stored, and on the run after that every program loads.
        loads, builds, rejected, vetted = _run(cache, {**env, "RUNTIME_CACHE_OPENCL_VET": "off"})
        assert (loads, builds, rejected, vetted) == (N - in_flight, in_flight, 0, 0)
        assert _run(cache, env)[:3] == [N, 0, 0]
    else:
        # Signed or not, the next process tries them in a child first (a crash there would
        # blocklist them), then loads every program: nothing rebuilt, nothing evicted.
        loads, builds, rejected, vetted = _run(cache, env, *secret)
        assert (loads, builds, rejected, vetted) == (N, 0, 0, in_flight)
        assert {p: p.read_bytes() for p in cache.rglob("*.rce")} == stored
        assert _run(cache, env, *secret) == [N, 0, 0, 0]  # known again: no child
    assert not loading.exists()
    assert not (guard_dir / "blocklist").exists() or not (guard_dir / "blocklist").read_text()


def test_dead_process_digests_are_suspects_until_the_driver_makes_them(tmp_path: Path) -> None:
    from runtime_cache.opencl.guard import SUSPECT, LoadGuard

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    dead_pid = int(done.stdout)
    (tmp_path / f"{dead_pid}.loading").write_text("aaaa\nbbbb\n")  # an earlier version's
    (tmp_path / f"{os.getpid()}.loading").write_text("cccc\n")  # alive: left alone
    guard = LoadGuard(str(tmp_path))
    assert guard.suspected(["aaaa"]) and guard.suspected(["x", "bbbb"])
    assert not guard.suspected(["cccc"]) and not guard.blocked(["aaaa"])
    assert guard.standing([], ["aaaa"]) == SUSPECT
    assert guard.recovered == 2 and not (tmp_path / f"{dead_pid}.loading").exists()
    (mine,) = tmp_path.glob(f"{os.getpid()}.*.loading")
    # The file is mapped into memory and padded with NULs to a page.
    with guard.loading(["dddd"]):
        assert mine.read_text().rstrip("\0") == "dddd\n"
        with guard.loading(["eeee", "ffff"]):
            assert mine.read_text().rstrip("\0") == "dddd\neeee\nffff\n"
    assert mine.read_text().rstrip("\0") == ""
    many = [f"{i:032x}" for i in range(300)]  # more than a page: the map grows
    with guard.loading(many):
        assert mine.read_text().rstrip("\0").split() == many
    guard.unblock(["aaaa"])
    guard.close()
    again = LoadGuard(str(tmp_path))
    assert not again.suspected(["aaaa"]) and again.suspected(["bbbb"])
    assert (tmp_path / "suspect").read_text().split() == ["aaaa", "bbbb", "-aaaa"]  # cleared
    again.close()


def test_a_planted_temporary_guard_folder_turns_the_guard_off(tmp_path: Path) -> None:
    """The private temporary folder's name, made writable by others first: not used."""
    from runtime_cache import environment
    from runtime_cache.opencl.guard import LoadGuard

    planted = tmp_path / environment.fallback_name("state")
    planted.mkdir()
    planted.chmod(0o777)  # as if another user had made it for us
    guard = LoadGuard(str(planted / "opencl-guard"))
    assert guard.known(["x"]) is False  # started: refused the folder, kept no files
    assert guard._fd is None
    assert not list((planted / "opencl-guard").glob("*.loading"))
    planted.chmod(0o700)
    mine = LoadGuard(str(planted / "opencl-guard"))
    mine.known(["x"])
    assert mine._fd is not None  # a private folder of this user's own is used
    mine.close()


def _binaries(folder: Path) -> dict[str, bytes]:
    """The values stored in the ``dir://`` cache at ``folder``, by key."""
    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend

    cache = rc.Cache(DirectoryBackend(str(folder)))
    return {key: cache.get(key) or b"" for key in cache.backend.keys("")}


def test_a_binary_a_process_dies_loading_again_after_a_child_loaded_it_is_refused(
    tmp_path: Path,
) -> None:
    """A crash that the vetting child does not reproduce (the app's state, another thread)
    must not repeat at every start: one death makes a suspect, which a child clears; a
    second death while loading it strikes it: never loaded here again, built from source,
    and not evicted (kills from outside may be what struck it). The re-attack review: a
    source build that gave the same bytes cleared the strike in memory, so the next load
    of those bytes in the process crashed again."""
    try:
        import pyopencl as cl

        cl.get_platforms()
    except Exception as exc:  # no driver or no platform
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", str(exc))
    env = {
        **os.environ,
        "RUNTIME_CACHE_GUARD_DIR": str(tmp_path / "guard"),
        "POCL_KERNEL_CACHE": "0",
    }

    def run(mode: str) -> list[str]:
        command = [sys.executable, "-c", TWO_PROGRAMS, f"dir://{tmp_path / 'cache'}", mode]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        if mode == "crash":
            assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
            return []
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    assert run("plain") == ["0", "2", "0", "0"]  # cold
    run("crash")
    assert run("plain") == ["2", "0", "0", "1"]  # a suspect: a child loaded it, so here too
    stored = _binaries(tmp_path / "cache")
    run("crash")  # the same binary kills a process again
    assert run("plain") == ["1", "1", "0", "0"]  # struck: built from source, none evicted
    # Stored again from that build: the same bytes stay struck here (built from source at
    # every start, never loaded); a driver whose rebuild differs loads the new ones.
    again = _binaries(tmp_path / "cache")
    assert again.keys() == stored.keys()
    same = again == stored  # (the binaries: an entry written again has a new time)
    assert run("plain") == (["1", "1", "0", "0"] if same else ["2", "0", "0", "0"])


def test_processes_dying_together_on_one_binary_make_one_suspect(tmp_path: Path) -> None:
    """The re-attack review: two workers of one app killed together while loading the same
    binary (one ``docker stop``) left two marks, counted as two deaths: struck unvetted."""
    from runtime_cache.opencl.guard import SUSPECT, LoadGuard

    pids = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
        )
        pids.append(int(done.stdout))
    for pid in pids:
        (tmp_path / f"{pid}.loading").write_text("aaaa\n")
    guard = LoadGuard(str(tmp_path))
    try:
        assert guard.standing([], ["aaaa"]) == SUSPECT and guard.recovered == 2
    finally:
        guard.close()
    assert (tmp_path / "suspect").read_text().split() == ["aaaa"]


def test_a_binary_held_back_during_its_load_is_not_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-attack review: a process that had read the lists before another process's
    death found the binary suspect only at the load (the blocklist's look read the new
    list), took the refusal for the driver's and evicted a good entry."""
    from opencl_support import opencl_context

    import runtime_cache as rc
    from runtime_cache.backends.directory import DirectoryBackend
    from runtime_cache.opencl import build_program, program
    from runtime_cache.opencl.guard import binary_digest, guard

    monkeypatch.setenv("RUNTIME_CACHE_GUARD_DIR", str(tmp_path / "guard"))
    guard.reset()
    ctx = opencl_context()
    cache = rc.Cache(DirectoryBackend(str(tmp_path / "cache")))
    source = "kernel void held(global float *a) { a[0] += 7.0f; }"
    build_program(ctx, source, cache=cache)
    (key,) = program.plan_program(ctx, source).keys or ()
    stored = cache.backend.get(str(key))
    assert stored is not None

    def died_meanwhile(*args: Any, **kwargs: Any) -> None:
        guard._suspect.update(binary_digest(b) for b in args[2])  # another process's death
        return None

    monkeypatch.setattr(program, "load_from_binaries", died_meanwhile)
    plan = program.plan_program(ctx, source)
    found = cache.get_many_views(plan.keys or [])
    assert program.fetch(ctx, plan, cache, found, vet=False) is None  # a local miss
    assert cache.backend.get(str(key)) == stored  # not evicted
    guard.reset()


def test_a_death_the_full_list_did_not_take_is_struck_though_the_list_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second re-attack review: on a full disk the append of a death failed, and a
    digest the list already named (a death and its clearance) read as recorded and
    cleared: loaded again, and the crash repeated at every start."""
    from runtime_cache.opencl import guard_records
    from runtime_cache.opencl.guard import STRUCK, LoadGuard

    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    (tmp_path / f"{int(done.stdout)}.loading").write_text("aaaa\n")
    (tmp_path / "suspect").write_text("aaaa\n-aaaa\n")
    monkeypatch.setattr(guard_records, "append_lines", lambda *args, **kwargs: False)
    guard = LoadGuard(str(tmp_path))
    try:
        assert guard.standing([], ["aaaa"]) == STRUCK and guard.held_back(["aaaa"])
    finally:
        guard.close()
    assert (tmp_path / f"{int(done.stdout)}.loading").exists()  # left for a later process


def test_the_suspect_list_reads_one_incident_once_and_keeps_strikes_when_trimmed() -> None:
    """The third re-attack review: two workers restarted at once each recorded the same
    death (struck after one incident); a line written again after a cut append did the
    same; and trimming the list by age let struck binaries load again."""
    from runtime_cache.opencl.guard_records import compact_suspects, read_suspects

    assert read_suspects(["a"]) == ({"a"}, set())
    assert read_suspects(["a", "a"]) == ({"a"}, set())  # one incident, no clearance between
    assert read_suspects(["a", "-a"]) == (set(), set())
    assert read_suspects(["a", "-a", "a"]) == (set(), {"a"})  # died again after a clearance
    assert read_suspects(["a", "-a", "a", "-a"]) == (set(), {"a"})  # struck for good
    assert read_suspects(["-a", "b"]) == ({"b"}, set())  # a clearance of no suspect
    filler = [line for i in range(3000) for line in (f"f{i}", f"-f{i}")]
    lines = ["s", "-s", "s", "t", *filler, "u"]
    kept = compact_suspects(lines, 5000)
    assert read_suspects(kept) == read_suspects(lines) == ({"t", "u"}, {"s"})
    assert len(kept) == 5
