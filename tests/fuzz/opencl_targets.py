"""Fuzz target for ``OpenCLModule.set_precompiled_programs`` on a real OpenCL driver (PoCL).

:class:`PrecompiledTarget` holds one context and a valid bundle of two programs.
:meth:`PrecompiledTarget.check` feeds one blob to a fresh module and then runs
both kernels: whatever the blob held, the module must either load a program
that computes the right answer or build it from source. A blob may only raise
:class:`~runtime_cache.errors.InvalidBundleError`.

:func:`flip_value_bits` flips bits deep inside the stored program binaries and
re-checksums the entries, so the codec passes them and only the driver stands
between a corrupted binary and the caller.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import numpy as np
from opencl_kernels import SCALE_SRC, SHIFT_SRC, run_kernel

import runtime_cache as rc
from runtime_cache import codec
from runtime_cache.errors import InvalidBundleError

from .targets import ContractViolation, rechecksum

SOURCES = {"scale": SCALE_SRC, "shift": SHIFT_SRC}
_HEADER = struct.Struct("<4sBBHIQQQ")


def flip_value_bits(blob: bytes, rng: random.Random, flips: int) -> bytes:
    """Flip ``flips`` random bits in an entry's value (past its first 64 bytes), re-checksummed."""
    _, _, _, _, meta_len, value_len, _, _ = _HEADER.unpack_from(blob)
    start = codec.HEADER_SIZE + meta_len
    out = bytearray(blob)
    low = start + min(64, value_len - 1)
    for _ in range(flips):
        pos = rng.randrange(low, start + value_len)
        out[pos] ^= 1 << rng.randrange(8)
    return rechecksum(bytes(out))


class PrecompiledTarget:
    """A real context, a valid bundle, and the check that every fuzzed blob must pass."""

    def __init__(self, ctx: Any) -> None:
        from runtime_cache.opencl import OpenCLModule

        self.ctx = ctx
        self.module_class = OpenCLModule
        self.bundle = OpenCLModule(ctx, SOURCES, cache=rc.Cache(None)).get_precompiled_programs()
        self.blobs = codec.decode_bundle(self.bundle)
        self.loaded = 0  # programs taken from fuzzed bundles, all checked by running them

    def check(self, data: bytes, verify_fallback: bool = True) -> int:
        """Feed ``data`` to a fresh module; return how many programs it took from it.

        The kernels are then run and their results checked; with
        ``verify_fallback=False`` only when a program came from ``data``
        (building the others from source is tested elsewhere, and slow).
        """
        module = self.module_class(self.ctx, SOURCES, cache=rc.Cache(None))
        try:
            taken = module.set_precompiled_programs(data)
        except InvalidBundleError:
            taken = 0
        except Exception as exc:
            raise ContractViolation(
                f"set_precompiled_programs raised {type(exc).__name__}: {exc}"
            ) from exc
        self.loaded += taken
        if not taken and not verify_fallback:
            return 0
        data_in = np.arange(64, dtype=np.float32)
        for name, factor, expect in (("scale", 3.0, data_in * 3), ("shift", 5.0, data_in + 5)):
            got = run_kernel(self.ctx, module.kernel(name), data_in, np.float32(factor))
            if not np.array_equal(got, expect):
                raise ContractViolation(f"kernel {name} computed a wrong result after loading")
        return taken
