"""Fuzzing TuningCache.loads with random, mutated and re-checksummed bundles (short run)."""

from __future__ import annotations

import logging
import random
import struct

import pytest
from fuzz.targets import (
    DEVICE,
    check_tuning,
    mutate,
    rechecksum,
    rechecksum_bundle,
    sample_tuning_bundle,
)
from hypothesis import given
from hypothesis import strategies as st

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.tuning import TuningCache

BUNDLE = sample_tuning_bundle()


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="runtime_cache")


def _tuning() -> TuningCache:
    return TuningCache("fuzz-model@1", "opencl", DEVICE, cache=rc.Cache(MemoryBackend()))


@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    check_tuning(data)


@given(st.randoms(use_true_random=False), st.booleans())
def test_mutated_bundle(rng: random.Random, fix_sum: bool) -> None:
    mutated = mutate(BUNDLE, rng)
    check_tuning(rechecksum_bundle(mutated) if fix_sum else mutated)


@given(st.randoms(use_true_random=False))
def test_mutated_records_inside_a_valid_bundle(rng: random.Random) -> None:
    blobs = codec.decode_bundle(BUNDLE)
    inner = [rechecksum(mutate(b, rng)) for b in blobs]
    check_tuning(codec.encode_bundle(inner))


@given(st.binary(max_size=300))
def test_any_record_bytes_under_the_right_key(raw: bytes) -> None:
    # A well-formed entry under this module's key whose value is arbitrary bytes:
    # only the record decoder stands between it and the caller.
    key = _tuning().key("conv_1")
    blob = codec.encode_entry(str(key), key.parts, raw, created_at=1.0)
    check_tuning(codec.encode_bundle([blob]))


def test_record_that_grows_when_re_encoded_is_skipped_not_raised() -> None:
    # Found by fuzzing: 12,000 float32 values fit the 64 KiB record limit, but
    # re-encode as float64 (108 KB); loads raised InvalidRecordError mid-merge.
    tuning = _tuning()
    n = 12_000
    raw = b"\x81\xa1a\xdd" + struct.pack(">I", n) + (b"\xca" + struct.pack(">f", 1.5)) * n
    assert len(raw) < 64 * 1024
    big = tuning.key("conv_1")
    good = tuning.key("gemm_2")
    blobs = [
        codec.encode_entry(str(big), big.parts, raw, created_at=1.0),
        codec.encode_entry(str(good), good.parts, b"\x81\xa1t\x04", created_at=1.0),
    ]
    assert tuning.loads(codec.encode_bundle(blobs)) == 1
    assert tuning.records() == {"gemm_2": {"t": 4}}
