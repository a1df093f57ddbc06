"""Fuzzing the entry and bundle decoders, directly and through the Cache front (short CI run).

The long run is ``python tests/fuzz/run_fuzz.py``; both use the targets in
tests/fuzz/targets.py. Every input must give a typed error or a counted miss,
and a mutated entry is never served as another value.
"""

from __future__ import annotations

import logging
import random
import struct

import pytest
from fuzz.targets import (
    SECRET,
    check_bundle,
    check_entry,
    mutate,
    rechecksum,
    rechecksum_bundle,
    sample_bundle,
    sample_entry,
)
from hypothesis import given
from hypothesis import strategies as st

from runtime_cache import codec

ENTRIES = [sample_entry(), sample_entry(b"\x00" * 700, 2), sample_entry(b"s", 1, SECRET)]
BUNDLES = [sample_bundle(), sample_bundle(2, SECRET), sample_bundle(0)]


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="runtime_cache")


@given(st.binary(max_size=512))
def test_random_bytes_as_entry(blob: bytes) -> None:
    check_entry(blob)


@given(st.binary(max_size=64))
def test_random_bytes_behind_a_valid_header(tail: bytes) -> None:
    check_entry(sample_entry()[: codec.HEADER_SIZE] + tail)


@given(st.sampled_from(ENTRIES), st.randoms(use_true_random=False), st.booleans())
def test_mutated_entries(blob: bytes, rng: random.Random, fix_sums: bool) -> None:
    original = codec.decode_entry(blob).value
    mutated = mutate(blob, rng)
    if fix_sums:
        # The checksums then pass: only the layout checks and msgpack stand in the way,
        # so the value may differ and is not compared.
        check_entry(rechecksum(mutated))
    else:
        check_entry(mutated, original)


@given(st.binary(max_size=512))
def test_random_bytes_as_bundle(data: bytes) -> None:
    check_bundle(data)
    check_bundle(data, SECRET)


@given(st.sampled_from(BUNDLES), st.randoms(use_true_random=False), st.booleans())
def test_mutated_bundles(data: bytes, rng: random.Random, fix_sum: bool) -> None:
    mutated = mutate(data, rng)
    check_bundle(rechecksum_bundle(mutated) if fix_sum else mutated)


@given(st.lists(st.sampled_from(ENTRIES), max_size=4), st.randoms(use_true_random=False))
def test_bundles_of_mutated_entries(blobs: list[bytes], rng: random.Random) -> None:
    # Each entry is mutated and re-checksummed, then packed into a well-formed bundle,
    # so the fuzz reaches Cache.loads' per-entry checks.
    inner = [rechecksum(mutate(b, rng)) if rng.random() < 0.7 else b for b in blobs]
    accepted = check_bundle(codec.encode_bundle(inner))
    assert accepted <= len(set(inner))


@pytest.mark.parametrize("claim", [2**32 - 1, 2**63, 2**64 - 1])
def test_huge_length_claims_are_refused_without_allocating(claim: int) -> None:
    blob = bytearray(sample_entry())
    struct.pack_into("<Q", blob, 12, claim)
    check_entry(bytes(blob))
    bundle = bytearray(sample_bundle(1))
    struct.pack_into("<Q", bundle, 12, claim)  # the first entry's length field
    check_bundle(rechecksum_bundle(bytes(bundle)))
