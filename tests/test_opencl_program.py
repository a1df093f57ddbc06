"""build_program on real PoCL: hit and miss, bad cache content, includes, build errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import SCALE_SRC, run_kernel

import runtime_cache as rc
from runtime_cache.opencl import (
    build_program,
    device_fingerprint,
    opencl_stats,
    recapture_binaries,
    reset_opencl_stats,
)
from runtime_cache.opencl.program import evict, plan_program

pytestmark = pytest.mark.opencl


def _binary(ctx: Any, program: Any) -> bytes:
    import pyopencl as cl

    return bytes(program.get_info(cl.program_info.BINARIES)[0])


def test_miss_then_hit(ctx: Any, cache: rc.Cache) -> None:
    data = np.arange(64, dtype=np.float32)
    cold = build_program(ctx, SCALE_SRC, "-cl-fast-relaxed-math", cache=cache)
    assert opencl_stats().source_builds == 1
    assert cache.stats().stores == 1
    warm = build_program(ctx, SCALE_SRC, "-cl-fast-relaxed-math", cache=cache)
    assert opencl_stats().binary_loads == 1
    assert opencl_stats().source_builds == 1
    assert cache.stats().hits == 1
    assert cache.stats().seconds_saved > 0
    for program in (cold, warm):
        out = run_kernel(ctx, program.scale, data, np.float32(3))
        np.testing.assert_array_equal(out, data * 3)
    # Other options are another binary: a miss.
    build_program(ctx, SCALE_SRC, "-cl-mad-enable", cache=cache)
    assert opencl_stats().source_builds == 2


def test_key_holds_device_fingerprint_and_options(ctx: Any, cache: rc.Cache) -> None:
    dev = ctx.devices[0]
    fp = device_fingerprint(dev)
    for name in ("platform_version", "name", "version", "driver_version", "address_bits"):
        assert name in fp
    build_program(ctx, SCALE_SRC, ["-D", "X=1"], cache=cache, module_id="demo@1")
    (info,) = list(cache.entries(runtime="opencl", purpose="program-binary"))
    assert info.device == fp
    assert info.module_id == "demo@1"
    assert "-D X=1" in info.parts["options"]
    # A driver update (another fingerprint) gives another key, so no stale binary is served.
    plan = plan_program(ctx, SCALE_SRC, ["-D", "X=1"], module_id="demo@1")
    assert plan.keys is not None
    other = rc.make_key(**{**plan.keys[0].parts, "device": {**fp, "driver_version": "99"}})
    assert str(other) != str(plan.keys[0]) == info.key


def test_driver_rejected_binary_is_evicted_and_rebuilt(
    ctx: Any, cache: rc.Cache, caplog: pytest.LogCaptureFixture
) -> None:
    plan = plan_program(ctx, SCALE_SRC)
    assert plan.keys is not None
    cache.put(plan.keys[0], b"this is not a program binary")
    with caplog.at_level(logging.WARNING, logger="runtime_cache.opencl"):
        program = build_program(ctx, SCALE_SRC, cache=cache)
    assert "rejected" in caplog.text
    assert opencl_stats().rejected_binaries == 1
    assert opencl_stats().source_builds == 1
    data = np.ones(8, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.scale, data, np.float32(2)), data * 2)
    # The good binary replaced the bad one, and is served next time.
    assert cache.get(plan.keys[0]) == _binary(ctx, program)
    build_program(ctx, SCALE_SRC, cache=cache)
    assert opencl_stats().binary_loads == 1


def test_eviction_keeps_an_entry_stored_since_the_refused_read(ctx: Any, cache: rc.Cache) -> None:
    plan = plan_program(ctx, SCALE_SRC)
    assert plan.keys is not None
    key = plan.keys[0]
    cache.put(key, b"the binary another process stored since")
    evict(cache, plan, "refused here", [b"the binary this process read and refused"])
    assert cache.get(key) == b"the binary another process stored since"  # kept
    evict(cache, plan, "refused here", [b"the binary another process stored since"])
    assert cache.get(key) is None  # the refused bytes themselves are deleted
    assert opencl_stats().rejected_binaries == 2


def test_flipped_bits_pass_the_codec_but_the_driver_rejects_them(ctx: Any, cache: rc.Cache) -> None:
    good = build_program(ctx, SCALE_SRC, cache=cache)
    plan = plan_program(ctx, SCALE_SRC)
    assert plan.keys is not None
    flipped = bytearray(_binary(ctx, good))
    for i in range(8):  # the binary's header: PoCL and Intel check it and refuse the binary
        flipped[i] ^= 0xFF
    cache.put(plan.keys[0], bytes(flipped))  # re-encoded: a valid entry with a valid checksum
    assert cache.get(plan.keys[0]) == bytes(flipped)
    program = build_program(ctx, SCALE_SRC, cache=cache)
    assert opencl_stats().rejected_binaries == 1
    data = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.scale, data, np.float32(5)), data * 5)
    assert cache.get(plan.keys[0]) == _binary(ctx, program)


def test_corrupt_entry_bytes_are_a_miss(ctx: Any, cache: rc.Cache, tmp_path: Path) -> None:
    build_program(ctx, SCALE_SRC, cache=cache)
    (path,) = (tmp_path / "cache").rglob("*.rce")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x55
    path.write_bytes(bytes(blob))
    program = build_program(ctx, SCALE_SRC, cache=cache)
    assert cache.stats().corrupt == 1
    assert opencl_stats().source_builds == 2
    data = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.scale, data, np.float32(2)), data * 2)


def test_changed_header_changes_the_key(ctx: Any, cache: rc.Cache, tmp_path: Path) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "factor.h").write_text("#define FACTOR 3.0f\n")
    src = (
        '#include "factor.h"\n__kernel void f(__global float *a) { a[get_global_id(0)] *= FACTOR; }'
    )
    options = ["-I", str(inc)]
    data = np.ones(4, dtype=np.float32)
    first = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, first.f, data), data * 3)
    (inc / "factor.h").write_text("#define FACTOR 7.0f\n")
    second = build_program(ctx, src, options, cache=cache)
    assert opencl_stats().source_builds == 2, "an edited header must not give a stale hit"
    np.testing.assert_array_equal(run_kernel(ctx, second.f, data), data * 7)
    third = build_program(ctx, src, options, cache=cache)
    assert opencl_stats().binary_loads == 1
    np.testing.assert_array_equal(run_kernel(ctx, third.f, data), data * 7)


def test_absent_include_is_cached_until_the_header_appears(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    inc = tmp_path / "inc"
    inc.mkdir()
    # pyopencl's random123 headers include headers that exist only for host C++ builds.
    src = '#if 0\n#include "nowhere.h"\n#endif\n#include "used.h"\n' + SCALE_SRC
    (inc / "used.h").write_text("#define UNUSED_HERE 1\n")
    options = ["-I", str(inc)]
    first = build_program(ctx, src, options, cache=cache)
    second = build_program(ctx, src, options, cache=cache)
    assert opencl_stats().uncacheable == 0
    assert (opencl_stats().source_builds, opencl_stats().binary_loads) == (1, 1)
    plan = plan_program(ctx, src, options)
    assert plan.keys is not None
    assert ["nowhere.h", -1, "absent"] in plan.keys[0].parts["includes"]
    # The missing header appears on the search path: a new key, a source build.
    (inc / "nowhere.h").write_text("#define NOW_HERE 1\n")
    later = plan_program(ctx, src, options)
    assert later.keys is not None and later.keys[0] != plan.keys[0]
    build_program(ctx, src, options, cache=cache)
    assert opencl_stats().source_builds == 2
    data = np.ones(4, dtype=np.float32)
    for program in (first, second):
        np.testing.assert_array_equal(run_kernel(ctx, program.scale, data, np.float32(4)), data * 4)


def test_header_appearing_in_the_working_folder_changes_the_key(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    src = '#if 0\n#include "late.h"\n#endif\n' + SCALE_SRC
    before = plan_program(ctx, src)
    assert before.keys is not None
    (tmp_path / "late.h").write_text("#define LATE 1\n")
    after = plan_program(ctx, src)
    assert after.keys is not None and after.keys[0] != before.keys[0]


def test_build_error_is_pyopencls_own(ctx: Any, cache: rc.Cache) -> None:
    import pyopencl as cl

    with pytest.raises(cl.RuntimeError) as caught:
        build_program(ctx, "__kernel void broken(__global float *a) { a[0] = nope; }", cache=cache)
    assert "nope" in str(caught.value)  # the build log
    assert cache.stats().stores == 0


def test_default_cache_and_disabled_cache(ctx: Any) -> None:
    reset_opencl_stats()
    build_program(ctx, SCALE_SRC)
    build_program(ctx, SCALE_SRC)
    assert rc.get_cache().stats().hits == 1
    assert opencl_stats().binary_loads == 1
    off = rc.Cache(None)
    build_program(ctx, SCALE_SRC, cache=off)
    build_program(ctx, SCALE_SRC, cache=off)
    assert opencl_stats().source_builds == 3


def test_recapture_restores_changed_binaries(ctx: Any, cache: rc.Cache) -> None:
    from runtime_cache.opencl.program import origins

    program = build_program(ctx, SCALE_SRC, cache=cache)
    data = np.ones(4, dtype=np.float32)
    run_kernel(ctx, program.scale, data, np.float32(2))
    # PoCL and Intel return the same binary after a launch: nothing to re-store.
    assert recapture_binaries(program) == 0
    # Stand in for a driver that finishes compiling at first launch (ARM Mali): the
    # binary recorded at build time differs from the one the driver returns now.
    plan = plan_program(ctx, SCALE_SRC)
    assert plan.keys is not None
    cache.put(plan.keys[0], b"binary read before the first launch")
    origins[program].digests = [0]
    assert recapture_binaries(program) == 1
    assert cache.get(plan.keys[0]) == _binary(ctx, program)
    assert opencl_stats().recaptured == 1
    assert recapture_binaries(program) == 0
    assert recapture_binaries(object()) == 0


@pytest.mark.parametrize(
    "spelling",
    [
        '#/**/include "val.h"',
        '#include \\\n"val.h"',
        '#inc\\\nlude "val.h"',
        '#include_next "val.h"',
        '#import "val.h"',
        '%:include "val.h"',
        '??=include "val.h"',
        "  #  include   <val.h>",
        '\ufeff#include "val.h"',  # a byte-order mark (Windows editors)
        '// x\r#include "val.h"\r',  # lines ended by CR alone
        '\f#include "val.h"',
        '#\vinclude "val.h"',
        '#inc\\\rlude "val.h"',  # a splice with a CR line end
        '#include \\\f\n"val.h"',  # blanks after the backslash
        'constant char s[] = "/*";\n#/**/include "val.h"',  # a comment opener in a string
    ],
)
def test_every_spelling_of_an_include_puts_its_header_in_the_key(
    tmp_path: Path, spelling: str
) -> None:
    """Only a plain `#include "x"` line was seen: the others kept the key when the header
    changed, so a stale binary was served."""
    from runtime_cache.opencl.includes import include_digests

    (tmp_path / "val.h").write_text("#define VAL 1\n")
    options = ["-I", str(tmp_path)]
    found = include_digests(spelling + "\n__kernel void k() {}\n", options)
    assert found and found[0][0] == "val.h", found
    (tmp_path / "val.h").write_text("#define VAL 2\n")
    assert include_digests(spelling + "\n__kernel void k() {}\n", options) != found
    # A comment from a directive's "#" to a later line: the name comes after it. Such a
    # build is not cached (helper-80 hid one behind a #warning's "/*").
    split = '# /* a\n b */ include "val.h"\n__kernel void k() {}\n'
    assert include_digests(split, options) is None


def test_an_include_that_cannot_be_hashed_makes_the_build_uncacheable(tmp_path: Path) -> None:
    """A macro include and a header over the size limit were recorded as nothing and as
    "absent": the key kept, whatever the header held."""
    from runtime_cache.opencl import header_reads, includes

    (tmp_path / "val.h").write_text("#define VAL 1\n")
    options = ["-I", str(tmp_path)]
    assert includes.include_digests('#define HDR "val.h"\n#include HDR\n', options) is None
    big = tmp_path / "big.h"
    with open(big, "wb") as handle:
        handle.truncate(header_reads.MAX_FILE_SIZE + 1)
    assert includes.include_digests('#include "big.h"\n', options) is None
    (tmp_path / "empty.h").write_text("")
    assert includes.include_digests('#include "empty.h"\n', options) == [
        ["empty.h", 0, includes.xxhash.xxh3_128_hexdigest(b"")]
    ]
    # Prose after // is no directive: the build stays cacheable. Prose that reads as a
    # directive on a line of its own inside /* */ makes it uncacheable (helper-79: where the
    # compiler reads a comment opener as text, the comment is no comment; the scan cannot
    # tell every such place, so a line that reads as a directive counts wherever it is).
    prose = "/*\n   #include the generated header before this one\n*/\n__kernel void k(){}"
    assert includes.include_digests(prose, []) is None
    assert includes.include_digests("// #include is not used here\n__kernel void k(){}", []) == []


def _follows_the_header(
    ctx: Any, cache: rc.Cache, header: Path, macro: str, src: str, options: list[str]
) -> None:
    """Build ``src`` (kernel ``f``, scaling by ``macro``) with ``header`` defining ``macro``
    as 3 and then as 7: each build computes with the header it reads."""
    data = np.ones(4, dtype=np.float32)
    for value in (3, 7):
        header.write_text(f"#define {macro} {value}.0f\n")
        program = build_program(ctx, src, options, cache=cache)
        np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * value)


def test_a_macro_include_is_built_from_source_when_its_header_changes(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    """The attacker-review repro: `#define HDR "val.h"` / `#include HDR` served the binary
    built with the old header."""
    inc = tmp_path / "inc"
    inc.mkdir()
    src = '#define HDR "factor.h"\n#include HDR\n'
    src += "__kernel void f(__global float *a) { a[get_global_id(0)] *= FACTOR; }"
    options = ["-I", str(inc)]
    _follows_the_header(ctx, cache, inc / "factor.h", "FACTOR", src, options)
    assert opencl_stats().source_builds == 2 and opencl_stats().uncacheable == 2


def test_options_and_include_scanning(tmp_path: Path) -> None:
    from runtime_cache.opencl.includes import include_digests, include_dirs, normalize_options

    tokens = normalize_options("-D A=1 -I 'my dir' -Iother")
    assert tokens == ["-D", "A=1", "-I", "my dir", "-Iother"]
    assert include_dirs(tokens) == ["my dir", "other"]
    assert normalize_options([b"-D", "B"]) == ["-D", "B"]
    assert include_digests("__kernel void f() {}", []) == []
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (first / "h.h").write_text('#include "inner.h"\n#define X 1\n')
    (first / "inner.h").write_text('#include "h.h"\n')  # a cycle ends
    (second / "h.h").write_text("#define X 2\n")
    options = ["-I", str(first), "-I", str(second)]
    found = include_digests('#include "h.h"\n', options)
    assert found is not None
    # Each file under each name and place it was found at: h.h from the source (the two
    # -I folders) and from inner.h (beside it, which is the first -I folder, then both),
    # inner.h beside h.h and in the first -I folder.
    assert sorted(name for name, _, _ in found) == ["h.h"] * 4 + ["inner.h"] * 2
    # The second folder's header is hashed too, though the first one shadows it.
    (second / "h.h").write_text("#define X 3\n")
    assert include_digests('#include "h.h"\n', options) != found
    assert include_digests("#include <nowhere.h>\n", options) == [["nowhere.h", -1, "absent"]]
    # Past the limit on headers, a build is not cached at all.
    many = "".join(f'#include "gone{i}.h"\n' for i in range(600))
    assert include_digests(many, options) is None


@pytest.mark.parametrize(
    "spelling",
    ['#incl\\\nude "val.h"', '#import "val.h"', '??=import "val.h"'],
    ids=["splice", "import", "trigraph"],
)
def test_a_build_whose_include_is_spelled_without_the_word_reads_its_header(
    ctx: Any, cache: rc.Cache, tmp_path: Path, spelling: str
) -> None:
    """The second attacker review: the key's scan ran only where the source held the word
    ``include``, so a splice or ``#import`` served the binary of the old header."""
    src = spelling + "\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }"
    _follows_the_header(ctx, cache, tmp_path / "val.h", "VAL", src, ["-I", str(tmp_path)])
    assert opencl_stats().source_builds == 2


def test_whether_a_header_exists_is_in_the_key(ctx: Any, cache: rc.Cache, tmp_path: Path) -> None:
    """The second attacker review: ``#if __has_include("fast.h")`` compiled another program
    once the header appeared, and the old binary was served."""
    src = '#if __has_include("fast.h")\n#define VAL 2.0f\n#else\n#define VAL 1.0f\n#endif\n'
    src += "__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }"
    options = ["-I", str(tmp_path)]
    data = np.ones(4, dtype=np.float32)
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data)
    (tmp_path / "fast.h").write_text("/* here */\n")
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 2)
    assert opencl_stats().source_builds == 2
    from runtime_cache.opencl import includes

    assert includes.include_digests("#if __has_include(HDR)\n#endif\n", options) is None
    # (the review of the fix: a pasted __has_include, and a name with a blank at its edge)
    pasted = '#define CAT(a, b) a##b\n#if CAT(__has_, include)("fast.h")\n#endif\n'
    assert includes.include_digests(pasted, options) is None
    blank = includes.include_digests('#if __has_include(" fast.h")\n#endif\n', options)
    assert blank == [[" fast.h", -1, includes.ABSENT]]


def test_a_header_reached_through_a_link_includes_beside_the_link(
    ctx: Any, cache: rc.Cache, tmp_path: Path
) -> None:
    """The second attacker review: the scan looked for a linked header's quoted includes
    beside the file the link names; the compiler looks beside the link."""
    inc, elsewhere = tmp_path / "inc" / "sub", tmp_path / "elsewhere"
    inc.mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "common.h").write_text('#include "detail.h"\n')
    (inc / "common.h").symlink_to(elsewhere / "common.h")
    src = '#include "sub/common.h"\n'
    src += "__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }"
    options = ["-I", str(tmp_path / "inc")]
    _follows_the_header(ctx, cache, inc / "detail.h", "VAL", src, options)
    assert opencl_stats().source_builds == 2


def test_a_header_changed_during_the_build_is_stored_under_no_key(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second attacker review: a header edited while a build ran (a checkout during a
    long build) gave a binary of the new header stored under the old header's key."""
    from runtime_cache.opencl import program as module

    (tmp_path / "val.h").write_text("#define VAL 3.0f\n")
    src = '#include "val.h"\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }'
    options = ["-I", str(tmp_path)]
    built = module.source_build

    def build_while_edited(context: Any, plan: Any) -> Any:
        (tmp_path / "val.h").write_text("#define VAL 7.0f\n")  # after the plan, before the build
        return built(context, plan)

    monkeypatch.setattr(module, "source_build", build_while_edited)
    data = np.ones(4, dtype=np.float32)
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 7)
    assert cache.stats().stores == 0 and opencl_stats().uncacheable == 1
    monkeypatch.setattr(module, "source_build", built)
    (tmp_path / "val.h").write_text("#define VAL 3.0f\n")  # back: the old key misses
    program = build_program(ctx, src, options, cache=cache)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 3)
    assert cache.stats().stores == 1


@pytest.mark.parametrize("named_by", ["option", "one token", "environment", "header", "digraph"])
def test_a_kernel_named_by_a_macro_loads_from_the_cache(
    ctx: Any,
    cache: rc.Cache,
    tmp_path: Path,
    named_by: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second attacker review: a kernel named by a ``-D`` macro or by one in a header
    was taken for another program's binary (the source says ``KNAME``, the driver
    ``scale_fast``): evicted and built again on every run. (The review of the fix: in one
    option token with others, from ``PYOPENCL_BUILD_OPTIONS``, or defined with ``%:``.)"""
    src = "__kernel void KNAME(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
    options: list[str] = []
    if named_by == "option":
        options = ["-DKNAME=scale_fast"]
    elif named_by == "one token":
        options = ["-cl-mad-enable -DKNAME=scale_fast"]
    elif named_by == "environment":
        monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", "-DKNAME=scale_fast")
    elif named_by == "digraph":
        src = "%:define KNAME scale_fast\n" + src
    else:
        (tmp_path / "names.h").write_text("#define KNAME scale_fast\n")
        src, options = '#include "names.h"\n' + src, ["-I", str(tmp_path)]
    for _ in range(3):
        program = build_program(ctx, src, options, cache=cache)
    data = np.ones(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.scale_fast, data), data * 2)
    stats = opencl_stats()
    assert (stats.source_builds, stats.binary_loads, stats.rejected_binaries) == (1, 2, 0)


@pytest.mark.parametrize("shaped_by", ["option", "header"])
def test_another_programs_binary_is_caught_though_macros_shape_the_source(
    ctx: Any, cache: rc.Cache, tmp_path: Path, shaped_by: str
) -> None:
    """The review of the fix: the kernel-name check was skipped for any ``-D`` option or
    header, so another program's binary planted under the key (unsigned private folder)
    was served, and ``prg.f`` failed. Only a kernel name that is itself a macro skips it."""
    import pyopencl as cl

    from runtime_cache.opencl.program import read_binaries

    src = "__kernel void f(__global float *a) { a[get_global_id(0)] *= N; }"
    if shaped_by == "option":
        options = ["-DN=3.0f"]
    else:
        (tmp_path / "n.h").write_text("#define N 3.0f\n")
        src, options = '#include "n.h"\n' + src, ["-I", str(tmp_path)]
    other = cl.Program(ctx, "__kernel void other(__global float *a) { a[0] = 1.0f; }").build()
    plan = plan_program(ctx, src, options)
    assert plan.keys is not None
    cache.put_many(dict(zip(plan.keys, read_binaries(cl, other, plan.devices), strict=True)))
    program = build_program(ctx, src, options, cache=cache)
    data = np.ones(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 3)
    assert opencl_stats().rejected_binaries == 1


def test_a_build_in_worker_processes_reads_relative_include_folders_as_here(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the fix: worker processes built in a private folder of their own, so a
    relative ``-I`` folder named another header there than the one the keys hashed here."""
    from runtime_cache.opencl import OpenCLModule

    (tmp_path / "app" / "overrides").mkdir(parents=True)
    (tmp_path / "defaults").mkdir()
    (tmp_path / "app" / "overrides" / "cfg.h").write_text("#define VAL 7.0f\n")
    (tmp_path / "defaults" / "cfg.h").write_text("#define VAL 2.0f\n")
    monkeypatch.chdir(tmp_path / "app")
    options = ["-I", "overrides", "-I", str(tmp_path / "defaults")]
    sources = {
        f"k{i}": f'#include "cfg.h"\n__kernel void k{i}(__global float *a) '
        f"{{ a[get_global_id(0)] *= VAL + {i}.0f; }}"
        for i in range(8)
    }
    OpenCLModule(ctx, sources, options=options, cache=cache).build_all(workers=3, processes=True)
    assert opencl_stats().source_builds == 8
    warm = OpenCLModule(ctx, sources, options=options, cache=cache)
    data = np.ones(4, dtype=np.float32)
    got = [float(run_kernel(ctx, warm.kernel(f"k{i}"), data)[0]) for i in range(8)]
    assert got == [7.0 + i for i in range(8)]
    assert opencl_stats().binary_loads == 8


def test_a_program_built_while_a_header_changed_is_in_no_bundle(
    ctx: Any, cache: rc.Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The review of the fix: its store was refused, but ``get_precompiled_programs()``
    still packed it under the old header's key, for other machines to load."""
    from runtime_cache.opencl import OpenCLModule
    from runtime_cache.opencl import module as module_file

    (tmp_path / "val.h").write_text("#define VAL 3.0f\n")
    src = '#include "val.h"\n__kernel void f(__global float *a) { a[get_global_id(0)] *= VAL; }'
    built = module_file.source_build

    def build_while_edited(context: Any, plan: Any) -> Any:
        (tmp_path / "val.h").write_text("#define VAL 7.0f\n")
        return built(context, plan)

    monkeypatch.setattr(module_file, "source_build", build_while_edited)
    module = OpenCLModule(ctx, {"f": src}, options=["-I", str(tmp_path)], cache=cache)
    module.program("f")
    assert cache.stats().stores == 0 and opencl_stats().uncacheable == 1
    from runtime_cache.backends.memory import MemoryBackend

    assert rc.Cache(MemoryBackend()).loads(module.get_precompiled_programs()) == 0


def test_a_binary_holding_only_some_of_the_declared_kernels_is_caught(
    ctx: Any, cache: rc.Cache
) -> None:
    """A planted binary that holds one of the source's two kernels passed the check, and
    the caller's ``prg.g`` then raised ``INVALID_KERNEL_NAME``."""
    import pyopencl as cl

    from runtime_cache.opencl.program import read_binaries

    src = "__kernel void f(__global float *a) { a[get_global_id(0)] *= 2.0f; }\n"
    src += "__kernel void g(__global float *a) { a[get_global_id(0)] *= 3.0f; }\n"
    part = cl.Program(ctx, "__kernel void f(__global float *a) { a[0] = 9.0f; }").build()
    plan = plan_program(ctx, src)
    assert plan.keys is not None
    cache.put_many(dict(zip(plan.keys, read_binaries(cl, part, plan.devices), strict=True)))
    program = build_program(ctx, src, cache=cache)
    data = np.ones(4, dtype=np.float32)
    np.testing.assert_array_equal(run_kernel(ctx, program.g, data), data * 3)
    np.testing.assert_array_equal(run_kernel(ctx, program.f, data), data * 2)
    assert opencl_stats().rejected_binaries == 1


def test_the_last_reviews_include_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last review: ``#define HAS __has_include`` then ``HAS("x.h")`` was not keyed; a
    name that resolved to a file hashed under another name got no entry (a link re-pointed
    kept the key); a removed working folder raised ``FileNotFoundError`` from the scan."""
    from runtime_cache.opencl import includes

    options = ["-I", str(tmp_path)]
    bare = '#define HAS __has_include\n#if HAS("feature.h")\n#endif\n'
    assert includes.include_digests(bare, options) is None
    # (the review of that fix: a macro whose name ends in "defined")
    for macro in ("is_defined", "undefined"):
        hidden = f'#define {macro} __has_include\n#if {macro}("feature.h")\n#endif\n'
        assert includes.include_digests(hidden, options) is None
    for asks in (
        "#ifdef __has_include\n#endif\n",
        "#if defined(__has_include)\n#endif\n",
        "#if defined __has_include && 1\n#endif\n",
        "#undef __has_include\n",
        "#if 0\n#elifndef __has_include\n#endif\n",
    ):
        assert includes.include_digests(asks, options) == [], asks  # asking reads no file
    (tmp_path / "impl_a.h").write_text("#define VAL 1\n")
    (tmp_path / "impl_b.h").write_text("#define VAL 10\n")
    (tmp_path / "zimpl.h").symlink_to(tmp_path / "impl_a.h")
    src = '#if 0\n#include "impl_a.h"\n#include "impl_b.h"\n#endif\n#include "zimpl.h"\n'
    before = includes.include_digests(src, options)
    (tmp_path / "zimpl.h").unlink()
    (tmp_path / "zimpl.h").symlink_to(tmp_path / "impl_b.h")
    assert includes.include_digests(src, options) != before
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert includes.include_digests('#include "val.h"\n', ["-I", "relative"]) is None


@pytest.mark.parametrize("define", ["/* name */ #define", "#/**/define"])
def test_a_kernel_named_by_a_macro_defined_after_a_comment_loads_from_the_cache(
    ctx: Any, cache: rc.Cache, define: str
) -> None:
    """The last review: a comment before the ``#`` or inside the directive hid the
    ``#define`` from the kernel-name check: evicted and rebuilt on every load."""
    src = define + " KNAME scale\n"
    src += "__kernel void KNAME(__global float *a) { a[get_global_id(0)] *= 2.0f; }"
    for _ in range(3):
        build_program(ctx, src, cache=cache)
    stats = opencl_stats()
    assert (stats.source_builds, stats.binary_loads, stats.rejected_binaries) == (1, 2, 0)


def test_fetch_takes_a_known_standing_as_read_and_screens_any_other(
    ctx: Any, cache: rc.Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read-ahead thread looks up each binary's standing with the crash guard as it
    reads it; ``fetch`` takes ``KNOWN`` as it is (a known binary stays known, and the
    blocklist is asked again at the load), and screens any other standing itself."""
    from runtime_cache.opencl import OpenCLModule, program
    from runtime_cache.opencl.guard import KNOWN, UNKNOWN, binary_digest

    module = OpenCLModule(ctx, {"scale": SCALE_SRC}, cache=cache)
    module.build_all()
    plan = module._plan("scale")
    assert plan.keys is not None
    found = cache.get_many_views([str(k) for k in plan.keys])
    digests = [binary_digest(found[str(k)]) for k in plan.keys]
    screened: list[object] = []  # the crash guard's look-ups of a standing
    look_up = program.guard.standing

    def noting(*args: Any, **kwargs: Any) -> str:
        screened.append(args)
        return look_up(*args, **kwargs)

    monkeypatch.setattr(program.guard, "standing", noting)
    assert program.fetch(ctx, plan, cache, found, digests=digests, standing=KNOWN) is not None
    assert screened == []
    assert program.fetch(ctx, plan, cache, found, digests=digests, standing=UNKNOWN) is not None
    assert len(screened) == 1
    monkeypatch.setattr(program.guard, "blocked", lambda digests: True)  # blocklisted since
    assert program.fetch(ctx, plan, cache, found, digests=digests, standing=KNOWN) is None
