"""Draw the fleet cold-start figure for docs/shared-cache.md from committed results.

Reads ``benchmarks/results/fleet-nvidia-h200.json`` (written by
``bench_fleet.py``) and writes ``docs/img/fleet-cold-start.png``: per scenario,
the wall time until every process was ready, and the programs built from source
by all processes together (the work), beside what it would be without leases
(every process building every program).

Usage::

    python benchmarks/plot_fleet.py [--results FILE] [--out PNG]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "fleet-nvidia-h200.json"
OUT = ROOT / "docs" / "img" / "fleet-cold-start.png"
LABELS = {
    "lone_pinned": "1 proc.\n2 cores",
    "fleet_pinned_dir": "8 proc.\n2 cores each\ndir://",
    "fleet_pinned_redis": "8 proc.\n2 cores each\nredis://",
    "lone": "1 proc.\n16 cores",
    "fleet_dir": "8 proc.\n16 shared\ndir://",
    "fleet_redis": "8 proc.\n16 shared\nredis://",
}


def draw(results: Path, out: Path) -> None:
    """Write the two-panel PNG for the results file ``results``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(results.read_text())
    meta, runs = data["meta"], data["results"]
    names = [name for name in LABELS if name in runs]
    labels = [LABELS[name] for name in names]
    n = int(meta["n"])
    fig, (wall, work) = plt.subplots(1, 2, figsize=(12, 4.6))
    colors = ["#888888" if run["procs"] == 1 else "#2b6cb0" for run in map(runs.get, names)]
    wall.bar(labels, [runs[name]["wall_seconds"] for name in names], color=colors)
    wall.set_ylabel("seconds until every process is ready")
    wall.set_title("Wall time, cold (lower is better)")
    built = [runs[name]["source_builds"] for name in names]
    without = [runs[name]["procs"] * n for name in names]
    x = range(len(names))
    work.bar(
        [i - 0.2 for i in x],
        without,
        width=0.4,
        color="#dddddd",
        label="without leases (each builds all)",
    )
    work.bar([i + 0.2 for i in x], built, width=0.4, color=colors, label="with leases (measured)")
    work.set_xticks(list(x), labels)
    work.set_ylabel("programs built from source, all processes")
    work.set_title("Compile work")
    work.set_ylim(0, max(without) * 1.2)
    work.legend(loc="upper center", ncol=2, fontsize=8)
    for axis in (wall, work):
        axis.tick_params(axis="x", labelsize=8)
    fig.suptitle(
        f"Fleet cold start, {n} OpenCL kernels: {meta['device']} ({meta['machine']})", fontsize=11
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    draw(args.results, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
