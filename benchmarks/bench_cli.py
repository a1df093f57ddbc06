"""How long the ``runtime-cache`` listings take on a directory cache of many small entries.

Usage::

    python benchmarks/bench_cli.py [--entries 10000] [--rounds 5] [--json FILE]

It fills a fresh ``dir://`` cache in a temp folder with ``--entries`` entries of
200 bytes (OpenCL program binaries and tuning records, three runtimes'
worth of keys), then times whole commands as a user runs them (a new process
each time: interpreter start, imports, listing, output to /dev/null; wall time
and the children's CPU time, which other load on a shared machine disturbs less) and,
in one process, the phases of a listing: the backend's ``scan`` (sizes, mtimes,
the hits journal), ``Cache.entries`` (reading and decoding each head), and the
JSON output. Figures are medians over ``--rounds`` runs.
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from _common import machine_info, median, write_json

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main as cli_main


def fill(root: Path, count: int) -> None:
    """Write ``count`` small entries, with a few hits recorded in the journal."""
    cache = rc.Cache(DirectoryBackend(root, max_size=None))
    device = {"vendor": "Acme", "name": "Acme GPU 7", "driver_version": "31.0.1"}
    items = {}
    for i in range(count):
        purpose = "tuning" if i % 4 == 0 else "program-binary"
        key = rc.make_key(
            module_id=f"model{i % 40}@{i:08x}",
            runtime="opencl",
            purpose=purpose,
            device=device,
            kernel=f"kernel_{i}",
            options="-cl-fast-relaxed-math",
        )
        items[key] = os.urandom(200)
    cache.put_many(items, build_seconds=0.05)
    for key in list(items)[:: max(1, count // 500)]:
        cache.get(key)
    cache.close()


def median_seconds(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def command(script: str, url: str, *argv: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(
            [script, "--cache", url, *argv], check=True, stdout=subprocess.DEVNULL, timeout=600
        )

    return run


def median_child_cpu(fn: Callable[[], Any], rounds: int) -> float:
    """Median CPU seconds (user + system) that ``fn``'s child processes used: less
    sensitive than wall time to other work on a shared machine."""
    spent = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        fn()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return median(spent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="benchmarks/results/bench_cli.json")
    args = parser.parse_args(argv)
    script = shutil.which("runtime-cache")
    if script is None:
        print("the runtime-cache script is not installed (pip install -e .)", file=sys.stderr)
        return 1
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cache"
        fill(root, args.entries)
        url = f"dir://{root}?max_size=none"
        for label, cmd in (
            ("runtime-cache ls --json", ["ls", "--json"]),
            ("runtime-cache ls", ["ls"]),
            ("runtime-cache stats --json", ["stats", "--json"]),
            ("runtime-cache --version (start-up only)", ["--version"]),
        ):
            run = command(script, url, *cmd)
            results[label] = {
                "median_s": median_seconds(run, args.rounds),
                "median_cpu_s": median_child_cpu(run, args.rounds),
            }
        backend = DirectoryBackend(root, max_size=None)
        cache = rc.Cache(backend)
        results["phase: backend scan"] = {
            "median_s": median_seconds(lambda: list(backend.scan()), args.rounds)
        }
        results["phase: Cache.entries"] = {
            "median_s": median_seconds(lambda: list(cache.entries()), args.rounds)
        }

        def in_process() -> None:
            with redirect_stdout(io.StringIO()):
                cli_main(["--cache", url, "ls", "--json"])

        results["phase: ls --json in process"] = {
            "median_s": median_seconds(in_process, args.rounds)
        }
        cache.close()
    meta = {
        **machine_info(),
        "entries": args.entries,
        "rounds": args.rounds,
    }
    width = max(map(len, results))
    print(f"{args.entries} entries, median of {args.rounds} runs")
    for label, row in results.items():
        cpu = f"  (CPU {row['median_cpu_s']:.3f} s)" if "median_cpu_s" in row else ""
        print(f"{label.ljust(width)}  {row['median_s']:.3f} s{cpu}")
    if args.json:
        write_json(args.json, {"meta": meta, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
