"""The include scan against helper-80's review: bytes, files and options that a compiler
reads otherwise than the scan did. Each served a stale binary on PoCL 3.1 (a warm build
loaded the binary of the header before); each is now either keyed or not cached."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import run_kernel

import runtime_cache as rc
from runtime_cache.opencl import build_program, opencl_stats, reset_opencl_stats
from runtime_cache.opencl.includes import include_digests

KERNEL = "__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }\n"


def _write(path: Path, data: str | bytes) -> None:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


@pytest.mark.parametrize(
    "header",
    [
        b'#\0include "b.h"\n',  # clang reads a NUL as a blank
        b'\0#include "b.h"\n',
        b'#include "b.h\0"\n',  # (os.stat raised "embedded null byte" from the scan)
        b'#warning see notes /*\n#/*\n*/include "b.h"\n',  # a comment to a later line
        b'#if 0\nit\'s /*\n#endif\n#/*\n*/include "b.h"\n',
        b'#include "\xe9t\xe9.h"\n',  # not UTF-8: the scan probed another name
        b"constant char TS[] = __TIMESTAMP__;\n",  # the header's time, not its bytes
    ],
)
def test_a_header_the_scan_cannot_read_as_the_compiler_does_is_not_cached(
    tmp_path: Path, header: bytes
) -> None:
    _write(tmp_path / "a.h", header)
    _write(tmp_path / "b.h", "#define VAL 1\n")
    assert include_digests('#include "a.h"\n' + KERNEL, ["-I", str(tmp_path)]) is None


def test_a_source_that_names_the_build_time_is_not_cached() -> None:
    for macro in ("__TIME__", "__DATE__", "__TIMESTAMP__"):
        assert include_digests(f"constant char t[] = {macro};\n" + KERNEL, []) is None


@pytest.mark.parametrize("kind", ["dev-null link", "fifo", "device"])
def test_a_device_or_fifo_at_a_header_name_is_not_cached(tmp_path: Path, kind: str) -> None:
    """A link to /dev/null in an earlier folder stubs the later folder's header out, and a
    FIFO is read as a stream: both were "absent", and the key stayed."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _write(second / "b.h", "#define VAL 5\n")
    options = ["-I", str(first), "-I", str(second)]
    source = '#include "b.h"\n' + KERNEL
    assert include_digests(source, options) is not None
    if kind == "fifo":
        os.mkfifo(first / "b.h")
    else:
        (first / "b.h").symlink_to("/dev/null" if kind == "dev-null link" else "/dev/zero")
    assert include_digests(source, options) is None
    (first / "b.h").unlink()
    (first / "b.h").mkdir()  # a folder is no header: compilers look on
    assert include_digests(source, options) is not None


def test_an_include_folder_named_with_a_quote_or_backslash_is_searched(tmp_path: Path) -> None:
    """PoCL splits its option string at blanks and keeps quotes and backslashes; the scan
    split it as a shell would, and searched another folder (or raised on one quote)."""
    for name in ("o'neil's_kernels", "one'quote", "back\\slash"):
        folder = tmp_path / name / "inc"
        folder.mkdir(parents=True)
        _write(folder / "b.h", "#define VAL 1\n")
        text = f"-I {folder} -cl-mad-enable"  # the driver's option string
        before = include_digests('#include "b.h"\n' + KERNEL, text)
        assert before and before[0][:2] == ["b.h", 0], (name, before)
        _write(folder / "b.h", "#define VAL 2\n")
        assert include_digests('#include "b.h"\n' + KERNEL, text) != before


def test_a_header_beside_pocls_copy_of_the_source_is_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PoCL compiles a copy of the source it writes to its cache folder, and the compiler
    looks for the source's quoted includes beside that copy first."""
    pocl = tmp_path / "pocl-cache"
    pocl.mkdir()
    inc = tmp_path / "inc"
    inc.mkdir()
    _write(inc / "b.h", "#define VAL 1\n")
    monkeypatch.setenv("POCL_CACHE_DIR", str(pocl))
    source = '#include "b.h"\n' + KERNEL
    before = include_digests(source, ["-I", str(inc)])
    _write(pocl / "b.h", "#define VAL 2\n")
    assert include_digests(source, ["-I", str(inc)]) != before
    (pocl / "b.h").unlink()
    (pocl / "uncached").mkdir()
    _write(pocl / "uncached" / "b.h", "#define VAL 3\n")
    assert include_digests(source, ["-I", str(inc)]) != before


@pytest.mark.opencl
def test_a_header_stubbed_out_by_a_dev_null_link_is_built_with_the_stub(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    """End to end, on the driver under test: with the header in a later folder, then with
    an earlier folder's link to /dev/null (the source's #ifndef gives VAL 1)."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    _write(second / "b.h", "#define VAL 5.0f\n")
    source = '#include "b.h"\n#ifndef VAL\n#define VAL 1.0f\n#endif\n' + KERNEL
    options = ["-I", str(first), "-I", str(second)]
    data = np.ones(4, dtype=np.float32)
    reset_opencl_stats()
    out = run_kernel(ctx, build_program(ctx, source, options, cache=cache).f, data)
    np.testing.assert_array_equal(out, data * 5)
    (first / "b.h").symlink_to("/dev/null")
    out = run_kernel(ctx, build_program(ctx, source, options, cache=cache).f, data)
    np.testing.assert_array_equal(out, data)
    assert opencl_stats().binary_loads == 0 and opencl_stats().uncacheable == 1


@pytest.mark.opencl
def test_a_fifo_header_is_read_by_the_build_and_not_cached(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    """A FIFO at the header's name, fed by a writer: each build reads what it is fed."""
    (tmp_path / "b.h").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "b.h")
    source = '#include "b.h"\n' + KERNEL
    data = np.ones(4, dtype=np.float32)
    reset_opencl_stats()
    for value in (2, 3):

        def feed(value: int = value) -> None:
            with open(tmp_path / "b.h", "w") as handle:  # waits for the compiler to open it
                handle.write(f"#define VAL {value}.0f\n")

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        program = build_program(ctx, source, ["-I", str(tmp_path)], cache=cache)
        writer.join(timeout=30)
        np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * value)
    assert opencl_stats().binary_loads == 0 and opencl_stats().uncacheable == 2


@pytest.mark.opencl
def test_pocls_flags_set_before_the_import_and_taken_back_are_a_change(
    ctx: Any, tmp_path: Path
) -> None:
    """helper-80: a process set POCL_EXTRA_BUILD_FLAGS=-I <folder>, built once (PoCL read
    the variable then), and took the variable back before its first cached build, which
    then searched no such folder: its header changed, and the binary stayed."""
    import json
    import subprocess
    import sys

    if "pocl" not in ctx.devices[0].platform.version.lower():
        pytest.skip("a variable of PoCL's")
    _write(tmp_path / "b.h", "#define VAL 1.0f\n")
    script = (
        "import json, os, sys\n"
        "os.environ['POCL_EXTRA_BUILD_FLAGS'] = '-I ' + sys.argv[1]\n"
        "import pyopencl as cl, runtime_cache as rc\n"
        "from runtime_cache.opencl import build_program, opencl_stats\n"
        "ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])\n"
        "cl.Program(ctx, '__kernel void g() {}').build()  # PoCL reads the variable\n"
        "del os.environ['POCL_EXTRA_BUILD_FLAGS']\n"
        "cache = rc.Cache(rc.open_backend('memory://'))\n"
        f"build_program(ctx, '#include \"b.h\"\\n' + {KERNEL!r}, [], cache=cache)\n"
        "print(json.dumps([opencl_stats().uncacheable, len(list(cache.entries()))]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "POCL_EXTRA_BUILD_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-I", "-c", script, str(tmp_path)],
        env={**env, "POCL_KERNEL_CACHE": "0"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [1, 0]


# ---------------------------------------------------------------- helper-81's review
@pytest.mark.parametrize(
    "source",
    [
        "constant char t[] = __TI\\\nME__;\n",  # a splice
        "#define CAT(a, b) a##b\nconstant char t[] = CAT(__TI, ME__);\n",  # pasted
        "constant int n = sizeof(__FILE__);\n",  # PoCL's temporary file, in its folder
        "constant int n = sizeof(__FILE_NAME__);\n",
        "constant int n = sizeof(__BASE_FILE__);\n",
    ],
)
def test_a_source_that_names_the_build_time_in_other_spellings_is_not_cached(
    source: str,
) -> None:
    assert include_digests(source + KERNEL, []) is None


def test_a_header_may_name_its_own_file_but_not_the_builds_time_or_base_file(
    tmp_path: Path,
) -> None:
    """A header's ``__FILE__`` is its path, which the key holds (the -I folder and which
    one); ``__BASE_FILE__`` is PoCL's temporary file, and a splice spells ``__TIME__``."""
    options = ["-I", str(tmp_path)]
    for text, cached in (
        ("constant int n = sizeof(__FILE__);\n", True),
        ("constant int n = sizeof(__BASE_FILE__);\n", False),
        ("constant char t[] = __TI\\\nME__;\n", False),
    ):
        _write(tmp_path / "a.h", text)
        assert (include_digests('#include "a.h"\n' + KERNEL, options) is not None) == cached


def test_a_header_through_a_link_no_path_names_is_not_cached(tmp_path: Path) -> None:
    """A link to /proc/<pid>/fd/N resolves to no path (``/memfd:hdr (deleted)``), so the
    header was recorded absent while the compiler read it."""
    fd = os.memfd_create("hdr")
    try:
        os.write(fd, b"#define VAL 1\n")
        (tmp_path / "b.h").symlink_to(f"/proc/{os.getpid()}/fd/{fd}")
        assert include_digests('#include "b.h"\n' + KERNEL, ["-I", str(tmp_path)]) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["kcache", "uncached", "no home", "blank", "changed"])
def test_every_folder_pocl_may_copy_the_source_to_is_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """PoCL writes the source it compiles to ``<top>/kcache`` with its kernel cache on (its
    default), to ``/tmp/pocl`` without a home, keeps blanks in the variables, and reads them
    once a process: each such folder is in the key's search."""
    from runtime_cache.opencl import pocl_flags
    from runtime_cache.opencl.include_paths import pocl_source_folders

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    expected = tmp_path / "xdg" / "pocl" / "kcache"
    if where == "uncached":
        expected = tmp_path / "xdg" / "pocl" / "uncached"
    elif where == "no home":
        monkeypatch.delenv("XDG_CACHE_HOME")
        monkeypatch.setenv("HOME", "")
        expected = Path("/tmp/pocl/uncached")
    elif where == "blank":
        monkeypatch.setenv("XDG_CACHE_HOME", " ")
        expected = tmp_path / " " / "pocl"
    elif where == "changed":  # PoCL keeps the value it read first: one seen at the import
        monkeypatch.setitem(pocl_flags._at_import, "POCL_CACHE_DIR", str(tmp_path / "first"))
        monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "second"))
        expected = tmp_path / "first"
    assert str(expected) in pocl_source_folders(str(tmp_path)), pocl_source_folders(str(tmp_path))


@pytest.mark.timeout(60)
def test_many_unclosed_comment_openers_on_a_line_scan_in_linear_time() -> None:
    """40,000 ``/*`` in a string literal (valid C) took the scan 22.6 s (plain pyopencl
    built it in 0.5 s): each opener was tried to the line's end. A million bytes of them
    would have taken about 20 minutes."""
    literal = "/* " * 350_000
    source = f'#include "b.h"\nconstant char s[] = "{literal}";\n' + KERNEL
    assert include_digests(source, []) == [["b.h", -1, "absent"]]
    assert include_digests(f'#include "b.h"\n{literal}\n' + KERNEL, []) is not None


@pytest.mark.opencl
def test_options_that_define_a_macro_as_the_builds_time_are_not_cached(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    reset_opencl_stats()
    source = "constant char t[] = WHEN;\n" + KERNEL.replace("VAL", "(float)t[0]")
    build_program(ctx, source, ["-DWHEN=__TIME__"], cache=cache)
    assert opencl_stats().uncacheable == 1 and not list(cache.entries())
    # PoCL's extra flags too. (Not through a build here: a process that changes them caches
    # no PoCL build for the rest of its life, the other tests' included.)
    from runtime_cache.opencl.program import _options_name_build_time

    monkeypatch.setenv("POCL_EXTRA_BUILD_FLAGS", "-DWHEN=__DATE__")
    assert _options_name_build_time("-cl-mad-enable")
