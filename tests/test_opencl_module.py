"""OpenCLModule on real PoCL: lazy programs, build_all, bundles (good, foreign, truncated)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from opencl_support import SCALE_SRC, SHIFT_SRC, generated_sources, run_kernel

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.codec import decode_bundle, decode_entry, encode_bundle, encode_entry
from runtime_cache.errors import InvalidBundleError
from runtime_cache.keys import make_key
from runtime_cache.opencl import OpenCLModule, opencl_stats, reset_opencl_stats

pytestmark = pytest.mark.opencl

SOURCES = {"scale": SCALE_SRC, "shift": SHIFT_SRC}


def _check(ctx: Any, module: OpenCLModule) -> None:
    data = np.arange(32, dtype=np.float32)
    out = run_kernel(ctx, module.kernel("scale"), data, np.float32(2))
    np.testing.assert_array_equal(out, data * 2)
    out = run_kernel(ctx, module.kernel("shift"), data, np.float32(5))
    np.testing.assert_array_equal(out, data + 5)


def test_lazy_build_then_second_module_hits(ctx: Any, cache: rc.Cache) -> None:
    module = OpenCLModule(ctx, SOURCES, cache=cache)
    assert module.built == []
    module.kernel("scale")
    assert module.built == ["scale"]
    assert module.build_all() == 1  # only "shift" was left
    _check(ctx, module)
    again = OpenCLModule(ctx, SOURCES, cache=cache)
    assert again.build_all() == 0
    assert opencl_stats().binary_loads == 2
    assert opencl_stats().source_builds == 2
    _check(ctx, again)
    with pytest.raises(KeyError):
        again.kernel("missing")


def test_programs_from_binaries_carry_their_source(ctx: Any, cache: rc.Cache) -> None:
    """A loaded program has its source, as a source build does, so pyopencl's Kernel() finds
    it instead of asking the driver for a kernel named "_source"."""
    OpenCLModule(ctx, SOURCES, cache=cache).build_all()
    again = OpenCLModule(ctx, SOURCES, cache=cache)
    lazy = again.program("scale")
    assert again.build_all() == 0
    assert opencl_stats().binary_loads == 2
    assert lazy._source == SCALE_SRC
    assert again.program("shift")._source == SHIFT_SRC
    assert again.kernel("scale")._source == SCALE_SRC  # pyopencl copies it into the kernel
    _check(ctx, again)


@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_build_all_in_parallel(ctx: Any, cache: rc.Cache, processes: bool) -> None:
    sources = generated_sources(4, salt=1 if processes else 2)
    module = OpenCLModule(ctx, sources, cache=cache)
    assert module.build_all(workers=2, processes=processes) == 4
    assert cache.stats().stores == 4
    data = np.arange(8, dtype=np.float32)
    for i in range(4):
        out = run_kernel(ctx, module.kernel(f"k{i}"), data)
        np.testing.assert_array_equal(out, data * (i + 2) + (1 if processes else 2))
    assert OpenCLModule(ctx, sources, cache=cache).build_all() == 0


def test_build_all_loads_hits_in_chunks_and_rebuilds_only_the_missing_and_refused(
    ctx: Any, cache: rc.Cache
) -> None:
    sources = generated_sources(12, salt=3)
    OpenCLModule(ctx, sources, cache=cache).build_all(workers=1)
    probe = OpenCLModule(ctx, sources, cache=cache)
    keys = {name: probe._plan(name).keys[0] for name in sources}  # type: ignore[index]
    for name in ("k2", "k7"):
        cache.delete(keys[name])
    flipped = bytearray(cache.get(keys["k5"]) or b"")
    for i in range(8):  # every driver checks the header (PoCL, Intel) and refuses the binary
        flipped[i] ^= 0xFF
    cache.put(keys["k5"], bytes(flipped))
    reset_opencl_stats()
    module = OpenCLModule(ctx, sources, cache=cache)
    # Chunks of 4 on two threads: nine hits load, the flipped one is vetted, refused
    # and evicted, and the two missing plus the refused one are built from source.
    assert module.build_all(workers=2) == 3
    stats = opencl_stats()
    assert (stats.binary_loads, stats.source_builds, stats.rejected_binaries) == (9, 3, 1)
    assert module.built == sorted(sources)
    data = np.arange(8, dtype=np.float32)
    for i in range(12):
        out = run_kernel(ctx, module.kernel(f"k{i}"), data)
        np.testing.assert_array_equal(out, data * (i + 2) + 3)
    reset_opencl_stats()
    assert OpenCLModule(ctx, sources, cache=cache).build_all(workers=2) == 0
    assert opencl_stats().binary_loads == 12


def test_bundle_round_trip(ctx: Any, cache: rc.Cache) -> None:
    module = OpenCLModule(ctx, SOURCES, cache=cache)
    assert module.supports_precompiled_programs()
    bundle = module.get_precompiled_programs()  # builds what is missing first
    assert sorted(module.built) == ["scale", "shift"]
    # The bundle is a Cache.dumps-style bundle: checksummed entries with key parts.
    entries = [decode_entry(b) for b in decode_bundle(bundle)]
    assert {e.parts["program"] for e in entries} == {"scale", "shift"}
    assert all(e.parts["device"]["name"] == ctx.devices[0].name for e in entries)
    empty = rc.Cache(DirectoryBackend(cache.backend.root.parent / "other"))  # type: ignore[attr-defined]
    fresh = OpenCLModule(ctx, SOURCES, cache=empty)
    before = opencl_stats().source_builds
    assert fresh.set_precompiled_programs(bundle) == 2
    _check(ctx, fresh)
    assert opencl_stats().source_builds == before
    # Accepted binaries went into the cache too, for the next process.
    assert empty.stats().stores == 2
    assert rc.Cache(None).loads(bundle) == 0  # a disabled cache stores nothing
    assert empty.loads(bundle) == 2  # and any cache can merge the bundle


def _reencode(bundle: bytes, change: Any) -> bytes:
    blobs = []
    for blob in decode_bundle(bundle):
        entry = decode_entry(blob)
        parts = change(entry.parts)
        key = make_key(**parts)
        blobs.append(encode_entry(str(key), key.parts, entry.value, created_at=time.time()))
    return encode_bundle(blobs)


def test_bundle_from_another_device_is_ignored(ctx: Any, cache: rc.Cache) -> None:
    bundle = OpenCLModule(ctx, SOURCES, cache=rc.Cache(None)).get_precompiled_programs()
    fake = _reencode(
        bundle,
        lambda p: {**p, "device": {**p["device"], "name": "Fake GPU", "driver_version": "0.1"}},
    )
    module = OpenCLModule(ctx, SOURCES, cache=cache)
    assert module.set_precompiled_programs(fake) == 0
    assert module.built == []
    before = opencl_stats().source_builds
    _check(ctx, module)  # built from source instead
    assert opencl_stats().source_builds == before + 2


def test_bundle_for_other_sources_is_ignored(ctx: Any, cache: rc.Cache) -> None:
    bundle = OpenCLModule(ctx, SOURCES, cache=rc.Cache(None)).get_precompiled_programs()
    changed = {"scale": SCALE_SRC.replace("a[i] * f", "a[i] * f * 1.0f"), "shift": SHIFT_SRC}
    module = OpenCLModule(ctx, changed, cache=cache, module_id="same-id@1")
    assert module.set_precompiled_programs(bundle) == 0  # module id and source digest differ
    # Same module id, one source changed: only the unchanged program is taken.
    renamed = _reencode(bundle, lambda p: {**p, "module_id": "same-id@1"})
    assert module.set_precompiled_programs(renamed) == 1
    assert module.built == ["shift"]
    _check(ctx, module)


def test_truncated_bundle_raises_and_module_stays_usable(ctx: Any, cache: rc.Cache) -> None:
    bundle = OpenCLModule(ctx, SOURCES, cache=rc.Cache(None)).get_precompiled_programs()
    module = OpenCLModule(ctx, SOURCES, cache=cache)
    for bad in (bundle[: len(bundle) // 2], b"", b"RCB\x01garbage", bundle + b"x"):
        with pytest.raises(InvalidBundleError):
            module.set_precompiled_programs(bad)
    assert module.built == []
    _check(ctx, module)


def test_bundle_with_rejected_binary_falls_back(ctx: Any, cache: rc.Cache) -> None:
    bundle = OpenCLModule(ctx, SOURCES, cache=rc.Cache(None)).get_precompiled_programs()
    blobs = []
    for blob in decode_bundle(bundle):
        entry = decode_entry(blob)
        value = bytes(b ^ 0xFF for b in entry.value[:8]) + entry.value[8:]
        blobs.append(encode_entry(entry.key, entry.parts, value, created_at=time.time()))
    module = OpenCLModule(ctx, SOURCES, cache=cache)
    assert module.set_precompiled_programs(encode_bundle(blobs)) == 0
    assert opencl_stats().rejected_binaries == 2
    _check(ctx, module)


def test_build_error_in_a_worker_is_raised_by_the_parent(ctx: Any, cache: rc.Cache) -> None:
    import pyopencl as cl

    sources = generated_sources(3, salt=9)
    sources["broken"] = "__kernel void broken(__global float *a) { a[0] = not_declared; }"
    module = OpenCLModule(ctx, sources, cache=cache)
    with pytest.raises(cl.RuntimeError) as caught:
        module.build_all(workers=2, processes=True)
    assert "not_declared" in str(caught.value)  # pyopencl's own error, with the build log
    # The good programs were taken from the workers and stored.
    assert sorted(module.built) == ["k0", "k1", "k2"]
    assert cache.stats().stores == 3


def _race(module: OpenCLModule, warm_up: Any, orders: Sequence[list[str]]) -> None:
    """``warm_up()`` on one thread while one thread per order asks for those kernels."""
    start = threading.Barrier(1 + len(orders))

    def run(step: Any) -> None:
        start.wait()
        step()

    def app(order: list[str]) -> None:
        for name in order:
            module.kernel(name)

    threads = [threading.Thread(target=run, args=(warm_up,))] + [
        threading.Thread(target=run, args=(functools.partial(app, order),)) for order in orders
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_build_all_beside_program_calls_loads_each_program_once(ctx: Any, cache: rc.Cache) -> None:
    """An app's threads asking for kernels while another thread runs build_all(): each
    program came from its binary 1.4-1.6 times (34-39 loads for 24 programs), since the
    build_all() loaders did not hold a program's name as program() does."""
    sources = generated_sources(24, salt=7)
    OpenCLModule(ctx, sources, cache=cache).build_all()
    reset_opencl_stats()
    module = OpenCLModule(ctx, sources, cache=cache)
    names = list(sources)
    _race(module, module.build_all, (names, names[::-1], names))
    assert sorted(module.built) == sorted(names)
    assert opencl_stats().binary_loads == 24 and opencl_stats().source_builds == 0


def test_cold_build_all_in_workers_beside_program_calls_compiles_each_program_once(
    ctx: Any, cache: rc.Cache
) -> None:
    """Cold, with app threads asking for kernels while build_all() hands programs to worker
    processes: a program() call and a worker compiled the same program at once (12-16
    source builds for 12 programs), since a worker's job did not hold the program's name."""
    sources = generated_sources(12, salt=23)
    module = OpenCLModule(ctx, sources, cache=cache)
    names = list(sources)
    warm_up = functools.partial(module.build_all, workers=2, processes=True)
    _race(module, warm_up, (names[::-1], names[5:] + names[:5]))
    assert sorted(module.built) == sorted(names)
    assert opencl_stats().source_builds == 12
    assert cache.stats().stores == 12
    data = np.arange(16, dtype=np.float32)
    out = run_kernel(ctx, module.kernel("k7"), data)
    np.testing.assert_array_equal(out, data * 9 + 23)


def test_a_bundle_loaded_beside_build_all_and_program_calls_loads_each_program_once(
    ctx: Any, cache: rc.Cache
) -> None:
    """helper-83: ``set_precompiled_programs()`` on one thread while ``build_all()`` ran on
    another counted 54-73 binary loads for 40 programs: the bundle's loads did not hold a
    program's name as ``program()`` and ``build_all()`` do, so both loaded it."""
    sources = generated_sources(40, salt=29)
    bundle = OpenCLModule(ctx, sources, cache=cache).get_precompiled_programs()
    reset_opencl_stats()
    module = OpenCLModule(ctx, sources, cache=cache)
    names = list(sources)
    supplied: list[int] = []

    def load_bundle_and_build_all() -> None:
        both = threading.Thread(target=module.build_all)
        both.start()
        supplied.append(module.set_precompiled_programs(bundle))
        both.join()

    _race(module, load_bundle_and_build_all, (names[::-1], names[20:] + names[:20]))
    assert sorted(module.built) == sorted(names)
    stats = opencl_stats()
    assert stats.binary_loads == 40 and stats.source_builds == 0
    assert 0 <= supplied[0] <= 40


@pytest.mark.parametrize(
    ("backend", "workers", "processes"),
    [
        ("dir", 2, False),
        ("dir", 2, True),
        ("memory", 1, False),
        ("memory", 2, False),
        ("memory", 2, True),
    ],
    ids=["shared-threads", "shared-processes", "one-thread", "threads", "processes"],
)
def test_concurrent_build_alls_count_each_source_build_once(
    ctx: Any, tmp_path: Any, backend: str, workers: int, processes: bool
) -> None:
    """Two threads' cold ``build_all()`` of one module each returned every program they
    found missing (24 for 12 source builds): the count is now of the programs each call
    built itself. ``dir://`` leases take the shared path, memory the plain one."""
    from runtime_cache.backends.memory import MemoryBackend

    store = DirectoryBackend(tmp_path / "c") if backend == "dir" else MemoryBackend()
    cache = rc.Cache(store)
    reset_opencl_stats()
    module = OpenCLModule(ctx, generated_sources(12, salt=41 + workers), cache=cache)
    start = threading.Barrier(2)
    counts: list[int] = []

    def build() -> None:
        start.wait()
        counts.append(module.build_all(workers=workers, processes=processes))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(counts) == 2 and len(module.built) == 12
    assert sum(counts) == opencl_stats().source_builds == 12, counts
