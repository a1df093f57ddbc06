"""Crash safety of the directory backend: SIGKILL writers at random points, then check the cache.

Each trial starts ``--writers`` writer processes and one reader on one cache
directory. Writers put self-checking values (a header with writer, key, sequence
number and an xxh3 of the body; 100 B to 3 MB) through :class:`runtime_cache.Cache`,
delete some shared keys, and log each acknowledged put. The reader reads all the
time and logs any value that fails its self-check. Once all are up, after a random 0-0.6 s
every process is SIGKILLed, at staggered moments, mid-write or not.

Then the harness checks that:

* the cache opens;
* every stored entry verifies (:func:`runtime_cache.maintenance.verify`), so no
  partial entry exists to be served;
* every value served, by the reader during the trial or afterwards, passes its
  self-check (no torn or foreign value);
* for keys that one writer owns, the stored version is at least the last one
  the writer saw acknowledged (no acknowledged entry lost);
* temp files left by the killed writers are gone after the next open (when its
  hourly vacuum is due) or after :func:`runtime_cache.maintenance.prune`.

Usage::

    python benchmarks/crash_harness.py --trials 200        # the long run (about 5 minutes)
    python benchmarks/crash_harness.py --trials 10 --out /tmp/crash.json

Writes benchmarks/results/crash_harness.json unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import xxhash
from _common import machine_info, write_json

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.maintenance import prune, verify

_HEAD = struct.Struct("<4sIIQQ")  # magic, writer, key index, sequence, xxh3 of body
_MAGIC = b"RCHV"
OWNED_KEYS = 12
SHARED_KEYS = 8


def key_for(owner: int, index: int) -> rc.CacheKey:
    """The cache key of ``index`` owned by writer ``owner`` (``-1``: shared by all)."""
    module = f"shared/{index}" if owner < 0 else f"w{owner}/{index}"
    return rc.make_key(module_id=module, runtime="crash", purpose="harness", device=None)


def make_value(writer: int, index: int, seq: int, rng: random.Random) -> bytes:
    """A value that carries its own checksum and identity."""
    size = rng.randint(100, 64 << 10) if rng.random() < 0.7 else rng.randint(256 << 10, 3 << 20)
    body = rng.randbytes(size)
    return _HEAD.pack(_MAGIC, writer, index, seq, xxhash.xxh3_64_intdigest(body)) + body


def check_value(value: bytes, owner: int, index: int) -> tuple[bool, int]:
    """Return ``(ok, seq)``: whether ``value`` is whole and belongs to this key."""
    if len(value) < _HEAD.size:
        return False, -1
    magic, writer, got_index, seq, digest = _HEAD.unpack_from(value)
    body = value[_HEAD.size :]
    ok = magic == _MAGIC and got_index == index and xxhash.xxh3_64_intdigest(body) == digest
    if owner >= 0:
        ok = ok and writer == owner
    return ok, seq


# ------------------------------------------------------------------ children
def run_writer(root: str, writer: int, seed: int, ack_path: str) -> None:
    """Put and delete forever (until killed), logging each acknowledged put."""
    rng = random.Random(seed)
    cache = rc.Cache(DirectoryBackend(root, max_size=None))
    ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    seq = 0
    while True:
        seq += 1
        shared = rng.random() < 0.3
        owner = -1 if shared else writer
        index = rng.randrange(SHARED_KEYS if shared else OWNED_KEYS)
        key = key_for(owner, index)
        if shared and rng.random() < 0.2:
            cache.delete(key)
            continue
        if cache.put(key, make_value(writer, index, seq, rng)) and not shared:
            os.write(ack, f"{index} {seq}\n".encode())


def run_reader(root: str, writers: int, bad_path: str) -> None:
    """Read every key over and over; log each value that fails its self-check."""
    cache = rc.Cache(DirectoryBackend(root, max_size=None))
    keys = [(-1, i) for i in range(SHARED_KEYS)]
    keys += [(w, i) for w in range(writers) for i in range(OWNED_KEYS)]
    bad = os.open(bad_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    while True:
        for owner, index in keys:
            value = cache.get(key_for(owner, index))
            if value is not None and not check_value(value, owner, index)[0]:
                os.write(bad, f"{owner} {index}\n".encode())


# -------------------------------------------------------------------- harness
def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*") if p.is_file() or p.is_symlink()]


def _last_acked(path: Path) -> dict[int, int]:
    last: dict[int, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 2:  # a line cut by the kill is ignored
                index, seq = int(fields[0]), int(fields[1])
                last[index] = max(last.get(index, 0), seq)
    return last


def run_trial(
    root: Path, work: Path, trial: int, writers: int, rng: random.Random
) -> dict[str, Any]:
    """One trial: start, kill at random, reopen, verify; return its counts."""
    acks = [work / f"ack-{trial}-{w}" for w in range(writers)]
    bad_log = work / f"bad-{trial}"
    procs = [
        _spawn(["--writer", str(root), str(w), str(rng.randrange(2**32)), str(acks[w])])
        for w in range(writers)
    ]
    procs.append(_spawn(["--reader", str(root), str(writers), str(bad_log)]))
    deadline = time.monotonic() + 30
    while not all(p.exists() for p in [*acks, bad_log]) and time.monotonic() < deadline:
        time.sleep(0.01)  # each child creates its log once it is up and about to write
    time.sleep(rng.uniform(0.0, 0.6))
    for proc in rng.sample(procs, len(procs)):
        proc.send_signal(signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.05))
    for proc in procs:
        proc.wait()
    leftovers = len(_temp_files(root))

    # Reopen: half the trials make the open-time vacuum due, the other half use prune().
    by_open = trial % 2 == 0
    if by_open:
        marker = root / ".vacuumed"
        if marker.exists():
            os.utime(marker, (time.time() - 7200,) * 2)
    cache = rc.Cache(DirectoryBackend(root, max_size=None))
    after_open = len(_temp_files(root))
    report = verify(cache)
    wrong = 0
    lost = 0
    for owner in [-1, *range(writers)]:
        last = _last_acked(acks[owner]) if owner >= 0 else {}
        for index in range(SHARED_KEYS if owner < 0 else OWNED_KEYS):
            value = cache.get(key_for(owner, index))
            if value is None:
                lost += index in last
                continue
            ok, seq = check_value(value, owner, index)
            wrong += not ok
            if ok and owner >= 0 and seq < last.get(index, 0):
                lost += 1
    after_prune = after_open
    if not by_open:
        prune(cache)
        after_prune = len(_temp_files(root))
    served_bad = len(bad_log.read_text().splitlines()) if bad_log.exists() else 0
    return {
        "trial": trial,
        "leftover_temp_files": leftovers,
        "temp_files_after_open": after_open,
        "temp_files_after_cleanup": after_prune,
        "cleaned_by": "open" if by_open else "prune",
        "entries_checked": report.checked,
        "bad_entries": len(report.bad),
        "wrong_values_served": wrong + served_bad,
        "acknowledged_entries_lost": lost,
        "acknowledged_puts": sum(len(_last_acked(a)) for a in acks),
    }


def run(trials: int, writers: int, seed: int) -> dict[str, Any]:
    """Run ``trials`` trials on one cache directory; return the summary and per-trial rows."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="rc-crash-"))
    root = work / "cache"
    rows = []
    started = time.time()
    try:
        for trial in range(trials):
            rows.append(run_trial(root, work, trial, writers, rng))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = {
        name: sum(r[name] for r in rows)
        for name in (
            "leftover_temp_files",
            "entries_checked",
            "bad_entries",
            "wrong_values_served",
            "acknowledged_entries_lost",
        )
    }
    return {
        "benchmark": "crash_harness",
        **machine_info(),
        "trials": trials,
        "writers_per_trial": writers,
        "seed": seed,
        "seconds": round(time.time() - started, 1),
        "processes_killed": trials * (writers + 1),
        "trials_with_leftover_temp_files": sum(r["leftover_temp_files"] > 0 for r in rows),
        "temp_files_not_cleaned": sum(r["temp_files_after_cleanup"] for r in rows),
        "temp_files_not_cleaned_by_open": sum(
            r["temp_files_after_open"] for r in rows if r["cleaned_by"] == "open"
        ),
        **total,
        "failed_opens": trials - len(rows),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the harness, print a table, write JSON; exit 1 if any check failed."""
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--writer":
        run_writer(args[1], int(args[2]), int(args[3]), args[4])
        return 0
    if args and args[0] == "--reader":
        run_reader(args[1], int(args[2]), args[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    default_out = Path(__file__).parent / "results" / "crash_harness.json"
    parser.add_argument("--out", type=Path, default=default_out)
    opts = parser.parse_args(args)
    logging.disable(logging.WARNING)
    result = run(opts.trials, opts.writers, opts.seed)
    write_json(opts.out, result)
    names = [
        "trials",
        "processes_killed",
        "trials_with_leftover_temp_files",
        "leftover_temp_files",
        "temp_files_not_cleaned_by_open",
        "temp_files_not_cleaned",
        "entries_checked",
        "bad_entries",
        "wrong_values_served",
        "acknowledged_entries_lost",
        "seconds",
    ]
    width = max(map(len, names))
    for name in names:
        print(f"{name:<{width}}  {result[name]}")
    failed = (
        result["bad_entries"]
        + result["wrong_values_served"]
        + result["acknowledged_entries_lost"]
        + result["temp_files_not_cleaned"]
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
