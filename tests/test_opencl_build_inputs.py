"""What a build reads besides its source, on real PoCL: a header changed and changed back
during a build, a build in worker processes while another thread moves the process, and
``__has_include`` forms that read no file."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import run_kernel

import runtime_cache as rc
from runtime_cache.opencl import OpenCLModule, build_program, includes, opencl_stats

pytestmark = pytest.mark.opencl

_SRC = '#include "val.h"\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }'


def _rewrite(path: Path, text: str) -> None:
    time.sleep(0.03)  # past the file system's clock tick: each write moves the file's times
    path.write_text(text)


def test_a_header_changed_and_changed_back_during_the_build_is_stored_under_no_key(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted in the last closing note: the check after a build compared the headers'
    digests only, so a header edited during the build and put back before the check (a
    branch switched and switched back) stored the edited header's binary under the key of
    the one put back."""
    from runtime_cache.opencl import program as module

    header = tmp_path / "val.h"
    header.write_text("#define VAL 3.0f\n")
    options = ["-I", str(tmp_path)]
    built = module.source_build

    def build_while_edited(context: Any, plan: Any) -> Any:
        _rewrite(header, "#define VAL 7.0f\n")
        try:
            return built(context, plan)
        finally:
            _rewrite(header, "#define VAL 3.0f\n")  # as it was when the key was made

    monkeypatch.setattr(module, "source_build", build_while_edited)
    data = np.ones(4, dtype=np.float32)
    program = build_program(ctx, _SRC, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 7)
    assert cache.stats().stores == 0 and opencl_stats().uncacheable == 1
    monkeypatch.setattr(module, "source_build", built)
    for _ in range(2):  # built from source and stored, then loaded: the header's own value
        program = build_program(ctx, _SRC, options, cache=cache)
        np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 3)
    assert cache.stats().stores == 1 and opencl_stats().binary_loads == 1


def test_touching_a_header_during_a_build_costs_one_store_and_serves_the_right_binary(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The price of the check above: a header rewritten with the same bytes during the
    build (a generator run again) leaves that build unstored; the next one stores."""
    from runtime_cache.opencl import program as module

    header = tmp_path / "val.h"
    header.write_text("#define VAL 3.0f\n")
    built = module.source_build

    def build_while_touched(context: Any, plan: Any) -> Any:
        _rewrite(header, "#define VAL 3.0f\n")
        return built(context, plan)

    monkeypatch.setattr(module, "source_build", build_while_touched)
    build_program(ctx, _SRC, ["-I", str(tmp_path)], cache=cache)
    monkeypatch.setattr(module, "source_build", built)
    build_program(ctx, _SRC, ["-I", str(tmp_path)], cache=cache)
    assert cache.stats().stores == 1 and opencl_stats().uncacheable == 1


def test_workers_build_where_the_keys_were_made_though_another_thread_moves_the_process(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted in the last closing note: ``build_all()``'s workers built in the folder the
    process was in when each job was sent, and the check read the headers in the folder it
    was in when the result came, so a ``chdir`` on another thread in between stored a
    binary of another folder's header under these keys. (A memory cache: no build is
    shared with other processes, so every program goes to a worker; one built in this
    process would read the headers wherever the other thread left it.)"""
    from runtime_cache.backends.memory import MemoryBackend
    from runtime_cache.opencl import reset_opencl_stats, worker_builds

    reset_opencl_stats()
    cache = rc.Cache(MemoryBackend())

    for app, value in (("app", 7), ("other", 2)):
        (tmp_path / app / "overrides").mkdir(parents=True)
        (tmp_path / app / "overrides" / "cfg.h").write_text(f"#define VAL {value}.0f\n")
    monkeypatch.chdir(tmp_path / "app")
    options = ["-I", "overrides"]
    sources = {
        f"k{i}": f'#include "cfg.h"\n__kernel void k{i}(__global float *a) '
        f"{{ a[get_global_id(0)] *= VAL + {i}.0f; }}"
        for i in range(8)
    }
    real = worker_builds.build_in_processes

    def moved_by_another_thread(
        devices: Any, jobs: Any, workers: int, on_result: Any, *a: Any
    ) -> Any:
        def back_home(result: Any) -> bool:
            os.chdir(tmp_path / "app")  # ... and back, before each result is taken
            taken: bool = on_result(result)
            os.chdir(tmp_path / "other")
            return taken

        os.chdir(tmp_path / "other")  # the app's other thread moves the process ...
        try:
            return real(devices, jobs, workers, back_home, *a)
        finally:
            os.chdir(tmp_path / "app")

    monkeypatch.setattr(worker_builds, "build_in_processes", moved_by_another_thread)
    OpenCLModule(ctx, sources, options=options, cache=cache).build_all(workers=3, processes=True)
    assert opencl_stats().source_builds == 8
    monkeypatch.setattr(worker_builds, "build_in_processes", real)
    warm = OpenCLModule(ctx, sources, options=options, cache=cache)
    data = np.ones(4, dtype=np.float32)
    got = [float(run_kernel(ctx, warm.kernel(f"k{i}"), data)[0]) for i in range(8)]
    assert got == [7.0 + i for i in range(8)]
    assert opencl_stats().binary_loads == 8


def test_no_spelling_hides_a_has_include_the_compiler_reads(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    """Two reviews of this session's exemptions (``__has_include`` in a string literal, or
    as the name a ``#define`` defines): each could be fooled into leaving a live
    ``__has_include(MACRO)`` unkeyed, and a header that appeared later served the old
    binary. Both exemptions are gone (the ``#ifndef __has_include`` / ``#define
    __has_include(x) 0`` idiom is uncacheable again), and a header name is read as one
    token: a ``/*`` or a quote in ``<...>`` opens no comment and no literal."""
    options = ["-I", str(tmp_path)]
    for unsound in (
        "#define __has_include(x) __has_include_next(x)\n",
        '#define HAS "x" __has_include\n',
        "#error don't use __has_include\n",
        "#if __has_include(HDR)\n#endif\n",
        # helper-76: a trigraph, quotes in a header name, a byte-order mark
        '#pragma message("asks __has_include(HDR)")\n',
        "#if (1 ??' 0) && __has_include(HDR) || 'a' == 0\n#endif\n",
        "#if __has_include(<it's.h>) || __has_include(HDR) || __has_include(<don't.h>)\n#endif\n",
        "#if '\\\ufeff' && __has_include(HDR) && 'x'\n#endif\n",
        # helper-78: a quote or a comment opener inside a header name
        "#if __has_include(<a'b.h>) || /* '\n#define /**/ __has_include(M)\n#endif\n",
        "#if __has_include(<nonexist/*>)\n#endif\n#if __has_include(M)\n#endif\n// */>)\n",
        "#if __has_include(<nonexist/*>)\n#endif\n#include M\n// */>)\n",
        "#include <a/*b.h>\n#include M\n// */\n",
        "#ifndef __has_include\n#  define __has_include(x) 0\n#endif\n",
        # helper-79: a comment opener the compiler reads as text, and comments around a
        # header name
        '#warning headers moved to include/*.h\n#define HDR "x.h"\n#include HDR\n/* e */\n',
        "#if 0\nit's slow /* for now\n#endif\n#include HDR\n// */\n",
        '#if 0\nsay "see src/*.cl\n#endif\n#include HDR\n// */\n',
        "#define Q it's /* odd\n#include HDR\n// */\n",
        "#if __has_include/**/(<a/*b.h>)\n#endif\n#include HDR\n// */>\n",
        "#if __has_include( /**/ <a/*b.h>)\n#endif\n#include HDR\n// */>\n",
        "#include /* */ <a/*b.h>\n#include HDR\n// */\n",
        "#warning x/*y\n/*\n*/ #include HDR\n// */\n",
        "#warning x/*y\n/* c */ #include HDR\n// */\n",
    ):
        assert includes.include_digests(unsound, options) is None, unsound
    src = '#define M "evil.h"\n#if __has_include(<nonexist/*>)\n#endif\n#if __has_include(M)\n'
    src += "#define VAL 2.0f\n#else\n#define VAL 1.0f\n#endif\n// */>)\n"
    src += "__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }"
    data = np.ones(4, dtype=np.float32)
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data)
    (tmp_path / "evil.h").write_text("/* here */\n")
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 2)
    assert opencl_stats().uncacheable == 2


def test_the_detached_worker_builds_a_job_without_a_folder_where_it_started(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Noted in the last closing note: a job that carries no folder (its program reads no
    header) ran in the folder the job before it had moved the detached process to."""
    from runtime_cache.opencl.detached_worker import _store_one
    from runtime_cache.opencl.program import plan_program

    home, app = tmp_path / "home", tmp_path / "app"
    home.mkdir()
    app.mkdir()
    (app / "val.h").write_text("#define VAL 3.0f\n")
    monkeypatch.chdir(app)
    plain = "__kernel void g(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
    jobs = []
    for source, options in ((_SRC, ["-I", "."]), (plain, [])):
        plan = plan_program(ctx, source, options, module_id="m")
        assert plan.keys is not None
        keys = [str(k) for k in plan.keys]
        jobs.append([source, options, plan.options_text, [], "m", keys, 0.1, plan.folder])
    assert jobs[0][-1] == str(app) and jobs[1][-1] is None
    monkeypatch.chdir(home)
    opened = (ctx, list(ctx.devices))
    assert _store_one(cache, opened, jobs[0], str(home)) == "stored"
    assert os.getcwd() == str(app)
    assert _store_one(cache, opened, jobs[1], str(home)) == "stored"
    assert os.getcwd() == str(home)


@pytest.mark.parametrize(
    "hidden",
    [
        '// see the notes \\\ufeff\n#include "x.h"\n',  # a mark after a backslash: no splice
        '// see the notes ??/\n#include "x.h"\n',  # a splice only where trigraphs are read
    ],
    ids=["byte-order mark", "trigraph"],
)
def test_a_line_end_that_only_some_compilers_join_hides_no_include(
    ctx: Any, cache: rc.Cache, tmp_path: Path, hidden: str
) -> None:
    """helper-76: the scan dropped a byte-order mark anywhere and so joined a comment's
    ``\\<mark>`` with the next line, where the compiler joins nothing: the ``#include`` on
    it never went into the key, and a changed header's old binary was served."""
    (tmp_path / "x.h").write_text("#define VAL 2.0f\n")
    src = hidden + "__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }"
    assert [name for name, *_ in includes.include_digests(src, ["-I", str(tmp_path)])] == ["x.h"]
    if "??/" in hidden:
        return  # (PoCL reads trigraphs: the include is in the comment there)
    data = np.ones(4, dtype=np.float32)
    program = build_program(ctx, src, ["-I", str(tmp_path)], cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 2)
    _rewrite(tmp_path / "x.h", "#define VAL 5.0f\n")
    program = build_program(ctx, src, ["-I", str(tmp_path)], cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 5)


def test_a_socket_at_a_header_name_is_no_header(tmp_path: Path) -> None:
    """helper-76: opened without waiting, a socket at a header's name (``ENXIO``) made the
    build uncacheable, where it had been recorded absent; only a regular file is opened."""
    import socket

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "s.h"))
        got = includes.include_digests('#include "s.h"\n', ["-I", str(tmp_path)])
    assert got == [["s.h", -1, includes.ABSENT]]


def test_pocls_extra_build_flags_are_in_the_key(ctx: Any, tmp_path: Path) -> None:
    """helper-78: PoCL adds ``POCL_EXTRA_BUILD_FLAGS`` to every build's options, and the key
    did not hold it: built with ``-DV=1``, then loaded for ``-DV=2``. (PoCL reads it once a
    process: each build runs in a process of its own.)"""

    if "pocl" not in ctx.devices[0].platform.version.lower():
        pytest.skip("a variable of PoCL's")
    script = (
        "import json, os, numpy as np, pyopencl as cl, runtime_cache as rc\n"
        "from runtime_cache.backends.directory import DirectoryBackend\n"
        "from runtime_cache.opencl import build_program, opencl_stats\n"
        "ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])\n"
        "src = '__kernel void f(__global float *a) { a[get_global_id(0)] *= V; }'\n"
        "cache = rc.Cache(DirectoryBackend(os.environ['CACHE_UNDER_TEST']))\n"
        "prg = build_program(ctx, src, [], cache=cache)\n"
        "q = cl.CommandQueue(ctx); a = np.ones(1, np.float32)\n"
        "buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)\n"
        "prg.f(q, (1,), None, buf); cl.enqueue_copy(q, a, buf); q.finish()\n"
        "print(json.dumps([float(a[0]), opencl_stats().binary_loads]))\n"
    )
    seen = [_run_with_flags(script, value, tmp_path) for value in (1, 2, 1)]
    assert seen == [[1.0, 0], [2.0, 0], [1.0, 1]]


def _run_with_flags(script: str, value: int | None, tmp_path: Path, *argv: str) -> Any:
    """``script``'s last line of JSON, run in a fresh process started with PoCL's extra
    flags ``-DV=<value>.0f`` (``None``: none) over the cache in ``tmp_path / "cache"``."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "POCL_EXTRA_BUILD_FLAGS": f"-DV={value}.0f", "POCL_KERNEL_CACHE": "0"}
    if value is None:
        del env["POCL_EXTRA_BUILD_FLAGS"]
    env["CACHE_UNDER_TEST"] = str(tmp_path / "cache")
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, *argv],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


#: What both PoCL-flags scripts begin with: imports, a context, and ``run(prg, name)``, a
#: kernel's output for an input of 1.0.
_FLAGS_SCRIPT_HEAD = (
    "import json, os, sys, numpy as np, pyopencl as cl, runtime_cache as rc\n"
    "from runtime_cache.backends.directory import DirectoryBackend\n"
    "from runtime_cache.opencl import OpenCLModule, build_program, opencl_stats\n"
    "ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])\n"
    "q = cl.CommandQueue(ctx)\n"
    "def run(prg, name='f'):\n"
    "    a = np.ones(1, np.float32)\n"
    "    mf = cl.mem_flags\n"
    "    buf = cl.Buffer(ctx, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=a)\n"
    "    getattr(prg, name)(q, (1,), None, buf); cl.enqueue_copy(q, a, buf); q.finish()\n"
    "    return float(a[0])\n"
)


def test_a_process_that_changes_pocls_extra_build_flags_caches_nothing_after(
    ctx: Any, tmp_path: Path
) -> None:
    """Noted in session 27, and worse than noted: PoCL reads ``POCL_EXTRA_BUILD_FLAGS`` once
    a process, at its first build, while the key read it at each call. A process started
    with ``-DV=1`` that set ``V=2`` stored a ``V=1`` build under the ``V=2`` key, and a
    process started with ``V=2`` loaded it (1.0 for 2.0). After such a change, PoCL builds
    are not cached (those of a module planned before the change too)."""

    if "pocl" not in ctx.devices[0].platform.version.lower():
        pytest.skip("a variable of PoCL's")
    script = _FLAGS_SCRIPT_HEAD + (
        "src = '__kernel void f(__global float *a) { a[get_global_id(0)] *= V; }'\n"
        "cache = rc.Cache(DirectoryBackend(os.environ['CACHE_UNDER_TEST']))\n"
        "module = OpenCLModule(ctx, {'f': src, 'g': src + ' // g'}, cache=cache)\n"
        "seen = [run(module.program('f'))]\n"
        "if sys.argv[1] == 'change':\n"
        "    os.environ['POCL_EXTRA_BUILD_FLAGS'] = '-DV=2.0f'\n"
        "seen += [run(build_program(ctx, src, [], cache=cache)), run(module.program('g'))]\n"
        "more = OpenCLModule(ctx, {n: src + ' // ' + n for n in 'hij'}, cache=cache)\n"
        "more.build_all(workers=2, processes=True)  # (workers would take the new flags)\n"
        "seen += [run(more.program(n)) for n in 'hij']\n"
        "s = opencl_stats()\n"
        "print(json.dumps([seen, s.binary_loads, s.uncacheable, len(list(cache.entries()))]))\n"
    )
    runs = ((1, "change"), (2, "keep"), (1, "keep"))
    seen = [_run_with_flags(script, start, tmp_path, how) for start, how in runs]
    # The changing process: PoCL kept V=1; only 'f', built before the change, was stored.
    one, two = [1.0] * 6, [2.0] * 6
    assert seen[0] == [one, 0, 5, 1], seen[0]
    assert seen[1] == [two, 0, 0, 7]  # V=2 from its start: built, not loaded
    assert seen[2] == [one, 1, 0, 12]  # V=1: 'f' loads; the other five are built


def test_flags_pocl_took_before_the_process_took_them_back_are_seen(
    ctx: Any, tmp_path: Path
) -> None:
    """Closing note 28, left open: a process sets ``POCL_EXTRA_BUILD_FLAGS``, PoCL builds
    (and holds that value for good), and the variable is taken back before runtime-cache
    looks. Every value runtime-cache can see agrees, and it loaded the ``V=1`` binary where
    this process's PoCL builds ``V=2``. PoCL's reported build options end in the flags it
    held: now such a load is refused here (the entry kept for others), and nothing this
    process builds is stored."""
    if "pocl" not in ctx.devices[0].platform.version.lower():
        pytest.skip("a variable of PoCL's")
    script = _FLAGS_SCRIPT_HEAD + (
        "src = '#ifndef V\\n#define V 1.0f\\n#endif\\n'\n"
        "src += '__kernel void f(__global float *a) { a[get_global_id(0)] *= V; }'\n"
        "cache = rc.Cache(DirectoryBackend(os.environ['CACHE_UNDER_TEST'] + sys.argv[2]))\n"
        "if sys.argv[1] == 'set-and-take-back':\n"
        "    os.environ['POCL_EXTRA_BUILD_FLAGS'] = '-DV=2.0f'\n"
        "    cl.Program(ctx, '__kernel void z(__global int *a) { a[0] = 0; }').build()\n"
        "    del os.environ['POCL_EXTRA_BUILD_FLAGS']\n"
        "seen = [run(build_program(ctx, src, [], cache=cache))]\n"
        "named = {n: src.replace('void f', 'void ' + n) for n in 'ghi'}\n"
        "module = OpenCLModule(ctx, named, cache=cache)\n"
        "seen += [run(module.program(n), n) for n in 'ghi']\n"
        "s, stored = opencl_stats(), len(list(cache.entries()))\n"
        "print(json.dumps([seen, s.binary_loads, s.rejected_binaries, stored]))\n"
    )
    one, two = [1.0] * 4, [2.0] * 4
    assert _run_with_flags(script, None, tmp_path, "keep", "-a") == [one, 0, 0, 4]
    # Loads refused here, nothing evicted; built with PoCL's V=2, nothing stored.
    assert _run_with_flags(script, None, tmp_path, "set-and-take-back", "-a") == [two, 0, 0, 4]
    assert _run_with_flags(script, None, tmp_path, "keep", "-a") == [one, 4, 0, 4]
    assert _run_with_flags(script, None, tmp_path, "set-and-take-back", "-b") == [two, 0, 0, 0]
    assert _run_with_flags(script, None, tmp_path, "keep", "-b") == [one, 0, 0, 4]


def test_the_include_folders_of_pocls_extra_build_flags_are_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """helper-79: with ``POCL_EXTRA_BUILD_FLAGS="-I extra"``, a header found only there was
    recorded absent, and an edit to it served the old binary."""
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "y.h").write_text("#define VAL 1\n")
    monkeypatch.setenv("POCL_EXTRA_BUILD_FLAGS", f"-I {tmp_path / 'extra'}")
    before = includes.include_digests('#include "y.h"\n', [])
    assert before is not None and before[0][1] != -1
    (tmp_path / "extra" / "y.h").write_text("#define VAL 2\n")
    assert includes.include_digests('#include "y.h"\n', []) != before
