"""Stale and foreign binaries, and fuzzing set_precompiled_programs, on real PoCL (short run).

Covered elsewhere, not repeated here (see docs/reliability.md):
tests/test_opencl_module.py::test_bundle_from_another_device_is_ignored (a bundle
from another device loads nothing) and
tests/test_opencl_program.py::test_flipped_bits_pass_the_codec_but_the_driver_rejects_them
(a re-checksummed binary with a broken header is rejected by PoCL, rebuilt from source).

What this file adds: a driver update end to end; a forged, re-checksummed binary
stopped by the signature before it reaches the driver; and hypothesis inputs to
set_precompiled_programs. Bit flips deep inside a binary, on which PoCL may
segfault or abort in LLVM, are in tests/test_opencl_vetting.py. The long run is
``python tests/fuzz/run_fuzz.py --targets opencl``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fuzz.opencl_targets import SCALE_SRC, PrecompiledTarget
from fuzz.targets import mutate, rechecksum, rechecksum_bundle
from hypothesis import given, settings
from hypothesis import strategies as st
from opencl_kernels import scale_works

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.directory import DirectoryBackend

pytestmark = pytest.mark.opencl
# The conftest profile, with fewer examples: each one loads programs on a real driver.


@pytest.fixture(scope="module")
def target(ctx: Any) -> PrecompiledTarget:
    return PrecompiledTarget(ctx)


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    from runtime_cache.opencl import reset_opencl_stats

    reset_opencl_stats()
    caplog.set_level(logging.ERROR)
    yield


def test_driver_update_does_not_serve_the_old_binary(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runtime_cache.opencl import build_program, device_fingerprint, opencl_stats
    from runtime_cache.opencl import fingerprint as fp_module

    cache = rc.Cache(DirectoryBackend(tmp_path))
    build_program(ctx, SCALE_SRC, cache=cache)
    build_program(ctx, SCALE_SRC, cache=cache)
    assert (opencl_stats().source_builds, opencl_stats().binary_loads) == (1, 1)
    device = ctx.devices[0]
    current = device_fingerprint(device)
    updated = {**current, "driver_version": "the next release"}
    monkeypatch.setitem(fp_module._memo, int(device.int_ptr), updated)
    program = build_program(ctx, SCALE_SRC, cache=cache)
    # The old binary sits in the cache under the old key and is not used.
    assert (opencl_stats().source_builds, opencl_stats().binary_loads) == (2, 1)
    assert scale_works(ctx, program, 4)
    drivers = {info.device["driver_version"] for info in cache.entries(runtime="opencl")}
    assert drivers == {updated["driver_version"], current["driver_version"]}
    monkeypatch.undo()


def test_forged_binary_is_stopped_by_the_signature_before_the_driver(
    ctx: Any, tmp_path: Path
) -> None:
    from runtime_cache.opencl import build_program, opencl_stats
    from runtime_cache.opencl.program import plan_program

    signed = rc.Cache(DirectoryBackend(tmp_path), secret="fleet secret")
    build_program(ctx, SCALE_SRC, cache=signed)
    plan = plan_program(ctx, SCALE_SRC)
    assert plan.keys is not None
    key = plan.keys[0]
    good = signed.get(key)
    assert good is not None
    # Someone without the secret writes a corrupted binary with valid checksums.
    forger = rc.Cache(DirectoryBackend(tmp_path))
    bad = bytearray(good)
    for pos in random.Random(5).sample(range(64, len(bad)), 16):
        bad[pos] ^= 0x10
    forger.put(key, bytes(bad))
    program = build_program(ctx, SCALE_SRC, cache=signed)
    assert signed.stats().rejected == 1  # refused by the HMAC check, never handed to PoCL
    assert opencl_stats().rejected_binaries == 0 and opencl_stats().source_builds == 2
    assert scale_works(ctx, program, 4)


@settings(max_examples=15)  # the profile runtime-cache supplies the rest
@given(st.binary(max_size=300))
def test_random_bytes(target: PrecompiledTarget, data: bytes) -> None:
    assert target.check(data, verify_fallback=False) == 0


@settings(max_examples=15)  # the profile runtime-cache supplies the rest
@given(st.randoms(use_true_random=False), st.sampled_from(["raw", "bundle-sum", "entry-meta"]))
def test_mutated_bundles(target: PrecompiledTarget, rng: random.Random, how: str) -> None:
    if how == "raw":
        data = mutate(target.bundle, rng)
    elif how == "bundle-sum":
        data = rechecksum_bundle(mutate(target.bundle, rng))
    else:
        # Entries whose metadata bytes (not the binary, not the lengths) were altered
        # and re-checksummed: the key parts no longer match, or still do.
        blobs = []
        for blob in target.blobs:
            out = bytearray(blob)
            meta_end = codec.HEADER_SIZE + int.from_bytes(blob[8:12], "little")
            for _ in range(rng.randint(1, 4)):
                out[rng.randrange(codec.HEADER_SIZE, meta_end)] = rng.randrange(256)
            blobs.append(rechecksum(bytes(out)))
        data = codec.encode_bundle(blobs)
    target.check(data, verify_fallback=False)
