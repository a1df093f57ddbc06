"""The long fuzz run: a seeded mutation fuzzer over every target, with hang and memory checks.

Targets (see targets.py): ``entry``, ``bundle``, ``tuning``, ``url``, ``size``,
and ``opencl`` (``set_precompiled_programs`` on real PoCL, see opencl_targets.py).
Inputs come from a corpus of valid blobs put through :func:`targets.mutate`,
re-checksummed some of the time so that they reach the parsers behind the
checksums. Each input runs under a 10 s alarm (a hang is a failure), and
tracemalloc records the peak memory the target allocated.

The ``opencl`` target runs in child processes, so that a crash could not end
the run. Each child reports each input before and after it; a child that dies
mid-input, or at exit, counts a crash of the caller, and a new child goes on
with the next input. Binaries that crash the driver should only ever crash the
vetting process (:mod:`runtime_cache.opencl.vetting`); those are counted
apart, as ``vetting_child_crashes``.

Usage::

    python tests/fuzz/run_fuzz.py --seconds 60            # every target, 60 s each
    python tests/fuzz/run_fuzz.py --targets entry,url --seconds 5

Writes benchmarks/results/fuzz.json; exits 1 on any contract violation or hang.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fuzz import targets as T  # noqa: E402

ROOT = HERE.parent.parent
HANG_SECONDS = 10


class Hang(Exception):
    """An input ran longer than HANG_SECONDS."""


def _alarm(_signum: int, _frame: Any) -> None:
    raise Hang()


Case = tuple[Callable[..., Any], tuple[Any, ...]]


def _generators() -> dict[str, Callable[[random.Random], Case]]:
    entries = [T.sample_entry(), T.sample_entry(b"\x00" * 900, 2)]
    entries.append(T.sample_entry(b"s", 1, T.SECRET))
    bundles = [T.sample_bundle(), T.sample_bundle(2, T.SECRET), T.sample_bundle(0)]
    tuning = T.sample_tuning_bundle()

    def entry(rng: random.Random) -> Case:
        blob = rng.choice(entries)
        mutated = T.mutate(blob, rng)
        if rng.random() < 0.4:
            return T.check_entry, (T.rechecksum(mutated),)
        original = T.codec.decode_entry(blob).value
        return T.check_entry, (mutated, original)

    def bundle(rng: random.Random) -> Case:
        data = rng.choice(bundles)
        pick = rng.random()
        if pick < 0.3:
            data = T.mutated_bundle_of_mutated_entries(data, rng)
        else:
            data = T.mutate(data, rng)
            if pick < 0.6:
                data = T.rechecksum_bundle(data)
        return T.check_bundle, (data, T.SECRET if rng.random() < 0.2 else None)

    def tuning_target(rng: random.Random) -> Case:
        pick = rng.random()
        if pick < 0.4:
            data = T.mutated_bundle_of_mutated_entries(tuning, rng)
        else:
            data = T.mutate(tuning, rng)
            if pick < 0.7:
                data = T.rechecksum_bundle(data)
        return T.check_tuning, (data,)

    def url(rng: random.Random) -> Case:
        return T.check_url, (T.random_url(rng),)

    def size(rng: random.Random) -> Case:
        text = "".join(rng.choice("0123456789.eE+- kKmMgGtTiIbBsShHdDwW\x00") for _ in range(12))
        return T.check_size_and_duration, (text[: rng.randint(0, 12)],)

    return {"entry": entry, "bundle": bundle, "tuning": tuning_target, "url": url, "size": size}


def run_target(name: str, seconds: float, seed: int) -> dict[str, Any]:
    """Fuzz one in-process target for ``seconds``; return its counts."""
    make = _generators()[name]
    rng = random.Random(seed)
    inputs = violations = hangs = 0
    slowest = 0.0
    examples: list[str] = []
    tracemalloc.start()
    tracemalloc.reset_peak()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        check, args = make(rng)
        started = time.perf_counter()
        signal.alarm(HANG_SECONDS)
        try:
            check(*args)
        except T.ContractViolation as exc:
            violations += 1
            if len(examples) < 5:
                examples.append(f"{exc} <- {args[0]!r:.300}")
        except Hang:
            hangs += 1
            examples.append(f"hang <- {args[0]!r:.300}")
        finally:
            signal.alarm(0)
        slowest = max(slowest, time.perf_counter() - started)
        inputs += 1
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "target": name,
        "inputs": inputs,
        "seconds": seconds,
        "violations": violations,
        "hangs": hangs,
        "crashes": 0,
        "slowest_input_ms": round(slowest * 1000, 1),
        "tracemalloc_peak_kib": peak // 1024,
        "examples": examples,
    }


# ----------------------------------------------------------------- opencl
def opencl_child(seed: int, start: int, count: int) -> None:
    """Child: feed inputs ``start..start+count`` of the seeded stream, reporting each one."""
    import pyopencl as cl
    from fuzz.opencl_targets import PrecompiledTarget, flip_value_bits

    from runtime_cache.opencl import opencl_stats
    from runtime_cache.opencl.vetting import vetter

    logging.disable(logging.CRITICAL)
    ctx = cl.Context([cl.get_platforms()[0].get_devices()[0]])
    target = PrecompiledTarget(ctx)
    for index in range(start, start + count):
        rng = random.Random(seed * 1_000_003 + index)
        pick = rng.random()
        if pick < 0.25:
            kind = "deep-bit-flips"
            blobs = [flip_value_bits(b, rng, rng.choice([1, 2, 8, 64])) for b in target.blobs]
            data = T.codec.encode_bundle(blobs)
        elif pick < 0.5:
            kind = "mutated-entries"
            data = T.mutated_bundle_of_mutated_entries(target.bundle, rng)
        elif pick < 0.75:
            kind = "mutated-bundle"
            data = T.rechecksum_bundle(T.mutate(target.bundle, rng))
        else:
            kind = "raw-mutation"
            data = T.mutate(target.bundle, rng)
        print(f"start {index} {kind}", flush=True)
        try:
            # A program taken from the blob is always run and checked; the fallback
            # (building from source) on every 10th input, as it costs a compile.
            taken = target.check(data, verify_fallback=index % 10 == 0)
            print(f"done {index} ok {taken}", flush=True)
        except T.ContractViolation as exc:
            print(f"done {index} violation {exc}", flush=True)
        stats = opencl_stats()
        print(f"vet {stats.vetted} {stats.vet_failures} {vetter.crashed}", flush=True)


def run_opencl(seconds: float, seed: int) -> dict[str, Any]:
    """Fuzz set_precompiled_programs in child processes for ``seconds``."""
    guard_dir = tempfile.mkdtemp(prefix="fuzz-guard-")  # nothing known yet
    env = {**os.environ, "POCL_KERNEL_CACHE": "0", "RUNTIME_CACHE_GUARD_DIR": guard_dir}
    deadline = time.monotonic() + seconds
    next_index = 0
    inputs = violations = crashes = exit_crashes = taken = 0
    vetting = [0, 0, 0]  # vetted, vet failures, vetting child crashes
    kinds: dict[str, dict[str, int]] = {}
    examples: list[str] = []
    while time.monotonic() < deadline:
        # stderr to a file: a driver may print much (and not UTF-8) before it dies.
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - closed at the end of the loop
        child = subprocess.Popen(
            [sys.executable, __file__, "--opencl-child", str(seed), str(next_index), "400"],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            errors="replace",
            env=env,
        )
        assert child.stdout is not None
        current: tuple[int, str] | None = None
        killed = False
        last_vet = [0, 0, 0]
        for line in child.stdout:
            fields = line.split(maxsplit=3)
            if fields[0] == "vet":
                last_vet = [int(f) for f in fields[1:4]]
                continue
            if fields[0] == "start":
                current = (int(fields[1]), fields[2])
                continue
            assert current is not None
            outcome = kinds.setdefault(current[1], {"inputs": 0, "taken": 0, "crashes": 0})
            outcome["inputs"] += 1
            inputs += 1
            if fields[2] == "violation":
                violations += 1
                examples.append(line.strip())
            else:
                outcome["taken"] += int(fields[3])
                taken += int(fields[3])
            next_index = current[0] + 1
            current = None
            if time.monotonic() > deadline:
                child.kill()
                killed = True
                break
        child.wait()
        vetting = [a + b for a, b in zip(vetting, last_vet, strict=True)]
        if current is None and not killed and child.returncode != 0:
            exit_crashes += 1  # every input done, then the process died (at exit)
            crashes += 1
        if current is not None:  # died inside an input: the driver crashed the process
            crashes += 1
            inputs += 1
            outcome = kinds.setdefault(current[1], {"inputs": 0, "taken": 0, "crashes": 0})
            outcome["inputs"] += 1
            outcome["crashes"] += 1
            errors.seek(0)
            err = errors.read().decode("utf-8", "replace").strip().splitlines()
            if len(examples) < 5:
                examples.append(f"input {current[0]} ({current[1]}): {err[-1] if err else ''}")
            next_index = current[0] + 1
        errors.close()
    shutil.rmtree(guard_dir, ignore_errors=True)
    return {
        "target": "opencl",
        "inputs": inputs,
        "seconds": seconds,
        "violations": violations,
        "hangs": 0,
        "crashes": crashes,
        "crashes_at_exit": exit_crashes,
        "programs_taken_and_verified": taken,
        "vetted": vetting[0],
        "vet_failures": vetting[1],
        "vetting_child_crashes": vetting[2],
        "by_kind": kinds,
        "examples": examples,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the chosen targets, print a table, write JSON; exit 1 on a violation or hang."""
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--opencl-child":
        opencl_child(int(args[1]), int(args[2]), int(args[3]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="entry,bundle,tuning,url,size,opencl")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.json")
    opts = parser.parse_args(args)
    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGALRM, _alarm)
    rows = []
    for name in opts.targets.split(","):
        if name == "opencl":
            rows.append(run_opencl(opts.seconds, opts.seed))
        else:
            rows.append(run_target(name, opts.seconds, opts.seed))
        row = rows[-1]
        print(
            f"{row['target']:<8} inputs {row['inputs']:>8}  violations {row['violations']}  "
            f"hangs {row['hangs']}  crashes {row['crashes']}  "
            f"peak {row.get('tracemalloc_peak_kib', '-')} KiB  "
            f"slowest {row.get('slowest_input_ms', '-')} ms",
            flush=True,
        )
    result = {
        "benchmark": "fuzz",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "seed": opts.seed,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "targets": rows,
    }
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"max RSS {result['max_rss_mib']} MiB; wrote {opts.out}")
    return 1 if any(r["violations"] or r["hangs"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
