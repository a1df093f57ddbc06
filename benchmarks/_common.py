"""What every benchmark script shares: the machine and the date, medians, its JSON, and
how it runs a side in a fresh child process of itself.

The scripts run as ``python benchmarks/<name>.py``, so this folder is on ``sys.path`` and
they import it as ``_common``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: Where the scripts write their JSON; ``plot.py`` reads it from here.
RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """The run's conditions: date, machine, CPU, Python, the load when it started, and the
    versions of the libraries on the hot path (xxhash 4.0.1's wheels hash 64 KiB 2-4 times
    slower than 4.1.0's).

    ``machine`` keeps the short form older results use (``"x86_64, 2 cores, Linux"``).
    """
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    versions = {}
    for name in ("runtime-cache", "xxhash", "msgpack", "pyopencl"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "versions": versions,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1m": None if load is None else round(load, 2),
    }


def median(values: Iterable[float]) -> float:
    """The median of ``values``; NaN when there are none (a phase that was skipped)."""
    numbers = list(values)
    return statistics.median(numbers) if numbers else math.nan


def interval(values: list[float], seed: int = 1) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of ``values`` (2,000 resamples, seeded)."""
    rng = random.Random(seed)
    meds = sorted(median(rng.choices(values, k=len(values))) for _ in range(2000))
    return meds[50], meds[1949]


def kernel_sources(n: int, salt: str) -> dict[str, str]:
    """N distinct kernels, one program each; ``salt`` makes a fresh set."""
    sources = {}
    for i in range(n):
        sources[f"k{i}"] = (
            f"// {salt}\n"
            f"__kernel void k{i}(__global float *a, __global const float *b) {{\n"
            f"    int g = get_global_id(0);\n"
            f"    float x = b[g];\n"
            f"    for (int j = 0; j < {i % 7 + 3}; ++j)\n"
            f"        x = x * {i + 1}.5f + sin(x) * {i % 13}.25f - cos(x * {i % 5}.5f);\n"
            f"    a[g] = x + {i}.0f;\n}}\n"
        )
    return sources


def write_json(path: str | Path, record: Mapping[str, Any], indent: int = 2) -> Path:
    """Write ``record`` as JSON to ``path``, making its folder first; return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=indent) + "\n", encoding="utf-8")
    return out


def add_child_arguments(parser: argparse.ArgumentParser) -> None:
    """The hidden arguments with which a script runs one side in a child of itself
    (:func:`run_child`): ``--child SIDE``, ``--salt`` and ``--dir``."""
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--salt", default="", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default="", help=argparse.SUPPRESS)


def child_env(top: Path, platform: str | None) -> dict[str, str]:
    """The environment of a run's children: this one's without ``RUNTIME_CACHE*``, with the
    default cache and the crash guard in ``top`` and ``BENCH_PLATFORM`` when given. Children
    write bytecode (``PYTHONDONTWRITEBYTECODE`` dropped), as an installed package has it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_CACHE")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(RUNTIME_CACHE=f"dir://{top / 'cache'}", RUNTIME_CACHE_GUARD_DIR=str(top / "guard"))
    if platform is not None:
        env["BENCH_PLATFORM"] = platform
    return env


def run_child(
    script: str, side: str, n: int, salt: str, folder: Path, env: Mapping[str, str]
) -> Any:
    """Run ``script --child side --n n --salt salt --dir folder`` in a fresh process, in
    ``folder`` (never a checkout, whose source tree must not shadow the install); return
    the JSON its last line of output holds. A failing child stops the run with its error."""
    command = [sys.executable, str(Path(script).resolve()), "--child", side]
    command += ["--n", str(n), "--salt", salt, "--dir", str(folder)]
    done = subprocess.run(
        command, cwd=folder, env=dict(env), capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"side {side} (n={n}) failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
