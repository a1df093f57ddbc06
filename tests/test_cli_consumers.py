"""export -> clear -> import -> ls --json on a cache that holds entries made by the real
consumers: OpenCL program binaries built on PoCL and tuning records from TuningCache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opencl_support import SCALE_SRC, SHIFT_SRC, opencl_context, run_kernel

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.tuning import TuningCache


def _ls(capsys: pytest.CaptureFixture[str], url: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["--cache", url, "ls", "--json"]) == 0
    return [
        {k: v for k, v in e.items() if k not in ("hits", "last_access")}
        for e in json.loads(capsys.readouterr().out)["entries"]
    ]


def test_round_trip_with_opencl_and_tuning_entries(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ctx = opencl_context()
    from runtime_cache.opencl import (
        build_program,
        device_fingerprint,
        opencl_stats,
        reset_opencl_stats,
    )

    root = tmp_path / "cache"
    url = f"dir://{root}"
    cache = rc.Cache(DirectoryBackend(root))
    for source in (SCALE_SRC, SHIFT_SRC):
        build_program(ctx, source, "-cl-fast-relaxed-math", cache=cache)
    device = device_fingerprint(ctx.devices[0])
    tuning = TuningCache("scale-net@1", "opencl", device, cache=cache)
    for symbol, tile in (("conv_1", 4), ("conv_2", 8)):
        tuning.put(symbol, {"tile": tile, "local_size": [8, 8]}, tune_seconds=0.5)
    cache.close()

    before = _ls(capsys, url)
    assert {(e["runtime"], e["purpose"]) for e in before} == {
        ("opencl", "program-binary"),
        ("opencl", "tuning"),
    }
    assert sum(e["purpose"] == "tuning" for e in before) == 2
    bundle = tmp_path / "app.rcb"
    assert main(["--cache", url, "export", str(bundle)]) == 0
    assert main(["--cache", url, "clear", "--yes"]) == 0
    assert _ls(capsys, url) == []
    assert main(["--cache", url, "import", str(bundle)]) == 0
    assert _ls(capsys, url) == before

    # The imported entries serve the consumers: no source build, same results.
    cache = rc.Cache(DirectoryBackend(root))
    reset_opencl_stats()
    program = build_program(ctx, SCALE_SRC, "-cl-fast-relaxed-math", cache=cache)
    assert opencl_stats().source_builds == 0 and opencl_stats().binary_loads >= 1
    data = np.arange(16, dtype=np.float32)
    assert np.array_equal(run_kernel(ctx, program.scale, data, np.float32(3.0)), data * 3)
    tuning = TuningCache("scale-net@1", "opencl", device, cache=cache)
    assert tuning.get("conv_2") == {"tile": 8, "local_size": [8, 8]}
    cache.close()


def test_a_bundle_from_another_device_never_matches_this_one(tmp_path: Path) -> None:
    ctx = opencl_context()
    from runtime_cache.opencl import build_program, device_fingerprint

    device = device_fingerprint(ctx.devices[0])
    # "Another phone": the same kernels and tuning, keyed for another driver version.
    other = {**device, "driver_version": str(device.get("driver_version", "")) + "-other"}
    phone = rc.Cache(DirectoryBackend(tmp_path / "other"))
    TuningCache("scale-net@1", "opencl", other, cache=phone).put("conv_1", {"tile": 2})
    phone.close()
    bundle = tmp_path / "other.rcb"
    assert main(["--cache", f"dir://{tmp_path / 'other'}", "export", str(bundle)]) == 0
    assert main(["--cache", f"dir://{tmp_path / 'here'}", "import", str(bundle)]) == 0
    here = rc.Cache(DirectoryBackend(tmp_path / "here"))
    assert len(list(here.entries())) == 1  # accepted...
    assert TuningCache("scale-net@1", "opencl", device, cache=here).get("conv_1") is None
    build_program(ctx, SCALE_SRC, cache=here)  # ...and this device builds its own
    assert len(list(here.entries(purpose="program-binary"))) >= 1
    here.close()
