"""What a fresh process pays to read its first value through the cache: the import, the
backend's opening, the ``Cache`` and the first ``get``, against reading the same file raw.

Usage::

    python benchmarks/bench_open.py [--python PY ...] [--rounds 21] [--json FILE]

It stores one 64 KiB value in a fresh ``dir://`` cache in a temp folder, then runs, in
rounds whose order rotates, one fresh process per side: ``floor`` (``open(path).read()``
of the entry's file, nothing imported) and ``ours@PY`` for each ``--python`` interpreter
(the current one by default; give two, each with runtime-cache installed, for an A/B of
two versions). Each child is ``python -I`` (no current folder on ``sys.path``, so an
installed package is what runs) and reports the time from its first line to the value
in hand; the parent also takes the whole process's wall time (the interpreter's start
included). Figures are medians with bootstrap 95% intervals; each round's ratio pairs
the sides of that round.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import interval, machine_info, median, write_json

_KEY = "rc.make_key(module_id='m0', runtime='bench', purpose='open')"
_OURS = (
    "import time\n"
    "t = time.perf_counter()\n"
    "import runtime_cache as rc\n"
    "cache = rc.Cache(rc.open_backend({url!r}))\n"
    f"value = cache.get({_KEY})\n"
    "took = time.perf_counter() - t\n"
    "assert value is not None and len(value) == {size}\n"
    "import sys\n"
    "print(took, 'importlib.metadata' in sys.modules)\n"
)
_FLOOR = (
    "import time\n"
    "t = time.perf_counter()\n"
    "with open({path!r}, 'rb') as f:\n"
    "    value = f.read()\n"
    "took = time.perf_counter() - t\n"
    "assert len(value) > {size}\n"
    "print(took, False)\n"
)


def _store(root: Path, python: str, size: int) -> Path:
    """Store the value with ``python``'s runtime-cache; the entry's file."""
    code = (
        "import runtime_cache as rc\n"
        f"cache = rc.Cache(rc.open_backend({('dir://' + str(root))!r}))\n"
        f"assert cache.put({_KEY}, bytes({size}))\n"
    )
    subprocess.run([python, "-I", "-c", code], cwd=root.parent, check=True)
    return next(p for p in root.rglob("*.rce"))


def _run(python: str, code: str, folder: Path) -> tuple[float, float, bool]:
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-I", "-c", code], cwd=folder, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{python} failed:\n{done.stderr[-3000:]}")
    took, metadata = done.stdout.split()
    return float(took), wall, metadata == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", action="append", default=None, help="interpreter (repeat)")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--size", type=int, default=64 * 1024)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory(prefix="bench-open-") as top:
        folder = Path(top)
        root = folder / "cache"
        path = _store(root, pythons[0], args.size)
        url = f"dir://{root}"
        sides: dict[str, tuple[str, str]] = {
            "floor": (pythons[0], _FLOOR.format(path=str(path), size=args.size))
        }
        for i, python in enumerate(pythons):
            sides[f"ours@{i}"] = (python, _OURS.format(url=url, size=args.size))
        names = list(sides)
        took: dict[str, list[float]] = {name: [] for name in names}
        wall: dict[str, list[float]] = {name: [] for name in names}
        metadata: dict[str, bool] = {}
        for _ in range(2):  # warm the page cache and the bytecode
            for name in names:
                _run(*sides[name], folder)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                t, w, m = _run(*sides[name], folder)
                took[name].append(t)
                wall[name].append(w)
                metadata[name] = m
    record: dict[str, Any] = {
        "benchmark": "open",
        "conditions": machine_info(),
        "rounds": args.rounds,
        "size": args.size,
        "pythons": pythons,
        "sides": {},
    }
    for name in names:
        pair = [w / f for w, f in zip(wall[name], wall["floor"], strict=True)]
        record["sides"][name] = {
            "in_process_ms": median(took[name]) * 1e3,
            "in_process_ms_ci": [x * 1e3 for x in interval(took[name])],
            "wall_ms": median(wall[name]) * 1e3,
            "wall_over_floor": median(pair),
            "wall_over_floor_ci": list(interval(pair)),
            "imports_importlib_metadata": metadata[name],
        }
    if len(pythons) > 1:
        pair = [a / b for a, b in zip(took["ours@1"], took["ours@0"], strict=True)]
        record["in_process_1_over_0"] = median(pair)
        record["in_process_1_over_0_ci"] = list(interval(pair))
    for name, side in record["sides"].items():
        print(
            f"{name:8} in process {side['in_process_ms']:7.2f} ms "
            f"[{side['in_process_ms_ci'][0]:.2f}, {side['in_process_ms_ci'][1]:.2f}]  "
            f"wall {side['wall_ms']:7.1f} ms  wall/floor {side['wall_over_floor']:.3f}  "
            f"importlib.metadata {'yes' if side['imports_importlib_metadata'] else 'no'}"
        )
    if len(pythons) > 1:
        print(f"in process, ours@1 / ours@0 (paired): {record['in_process_1_over_0']:.3f}")
    if args.json:
        print(f"wrote {write_json(args.json, record)}")
    else:
        print(json.dumps(record["sides"], indent=1))


if __name__ == "__main__":
    main()
