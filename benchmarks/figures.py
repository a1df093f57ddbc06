"""The three figures of docs/benchmarks.md, drawn from the committed results JSON.

1. the demo's time to first inference, cold against warm, stacked by phase, per driver;
2. per-kernel cold, parallel cold, warm and floor times, per driver (``opencl-*.json``);
3. backend get and put against diskcache, on a log scale (``bench_backends.json``).

Each figure carries a title, axis units and a caption naming the machine and the driver;
the same caption goes under it in the page. ``inputs`` (a hash of what the figure is drawn
from) is stored in the PNG's metadata, so ``plot.py --check`` can tell a stale figure
without comparing pixels.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import labels

Run = Mapping[str, Any]

#: The PNG text key that holds the hash of a figure's inputs.
INPUTS_KEY = "runtime-cache-inputs"
PHASE_COLOURS = {
    "setup": "#9e9e9e",
    "compile": "#d1495b",
    "tune": "#edae49",
    "load": "#00798c",
    "run": "#30638e",
}
OPENCL_BARS = {
    "a": ("cold, one at a time (a)", "#d1495b"),
    "b": ("cold, parallel build_all (b)", "#edae49"),
    "c": ("warm from runtime-cache (c)", "#00798c"),
    "d": ("floor: raw binary load (d)", "#30638e"),
}
BACKEND_COLOURS = ["#30638e", "#00798c", "#66a182", "#edae49", "#d1495b"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _finish(fig: Any, caption: str, target: Path, inputs: str, bottom: float) -> None:
    """Put the caption under the axes, and save with the inputs' hash in the metadata."""
    fig.text(0.01, 0.01, textwrap.fill(caption, 150), fontsize=7.5, va="bottom", color="#333333")
    fig.subplots_adjust(bottom=bottom)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110, metadata={"Software": None, INPUTS_KEY: inputs})
    _pyplot().close(fig)


def demo_caption(runs: Sequence[Run]) -> str:
    parts = [
        f"{labels.demo_driver(r)}, {r['demo']['model']} model ({r['demo']['layers']} layers), "
        f"on {labels.machine(r)}"
        for r in runs
    ]
    return (
        "runtime-cache demo, each run in a fresh process, driver's own kernel cache off: "
        + "; ".join(parts)
        + "."
    )


def demo(runs: Sequence[Run], target: Path, inputs: str) -> None:
    """Figure 1: cold and warm bars per driver, each stacked by phase."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 1.6 + 1.3 * len(runs)))
    names, y = [], 0.0
    positions = []
    for run in runs:
        result = run["demo"]
        for which in ("cold", "warm"):
            phases = result[which]["phases"]
            left = 0.0
            for phase, colour in PHASE_COLOURS.items():
                width = float(phases.get(phase, 0.0))
                label = phase if y == 0.0 else None
                ax.barh(y, width, left=left, color=colour, label=label, height=0.7)
                left += width
            total = result[which]["time_to_first_inference_s"]
            note = f"{total:.2f} s"
            if which == "warm" and result.get("speedup"):
                note += f"  ({result['speedup']:.1f}x faster)"
            ax.text(left, y, "  " + note, va="center", fontsize=9)
            names.append(f"{labels.demo_driver(run)}\n{which}")
            positions.append(y)
            y += 1.0
        y += 0.4
    ax.set_yticks(positions)
    ax.set_yticklabels(names, fontsize=8.5)
    ax.invert_yaxis()
    ax.set_xlabel("time to first inference (s), by phase")
    ax.set_xlim(0, max(r["demo"]["cold"]["time_to_first_inference_s"] for r in runs) * 1.25)
    ax.set_title("Time to first inference of the demo CNN: cold vs warm from the cache")
    ax.legend(loc="lower right", fontsize=8, ncols=5, frameon=False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    fig.tight_layout()
    _finish(fig, demo_caption(runs), target, inputs, bottom=0.3 if len(runs) == 1 else 0.2)


def opencl_caption(runs: Sequence[Run]) -> str:
    parts = [f"{labels.opencl_driver(r)}: {r['n']} kernels, host {labels.machine(r)}" for r in runs]
    lead = "benchmarks/bench_opencl.py, medians of repeated fresh processes. "
    return lead + "; ".join(parts) + "."


def opencl(runs: Sequence[Run], target: Path, inputs: str) -> None:
    """Figure 2: ms per kernel for cold, parallel cold, warm and floor, per driver."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 5.2))
    width = 0.8 / len(OPENCL_BARS)
    for index, (key, (label, colour)) in enumerate(OPENCL_BARS.items()):
        xs, values = [], []
        for group, run in enumerate(runs):
            value = run["median_seconds"].get(key, math.nan) * 1000 / run["n"]
            if not math.isnan(value):
                xs.append(group + (index - (len(OPENCL_BARS) - 1) / 2) * width)
                values.append(value)
        ax.bar(xs, values, width=width * 0.95, color=colour, label=label)
        for x, value in zip(xs, values, strict=True):
            text = f"{value:.0f}" if value >= 10 else f"{value:.2g}"
            ax.text(x, value * 1.08, text, ha="center", va="bottom", fontsize=7.5)
    ax.set_yscale("log")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([textwrap.fill(labels.opencl_driver(r), 28) for r in runs], fontsize=8.5)
    ax.set_ylabel("time per kernel (ms, log scale)")
    ax.set_title("Loading 100 OpenCL programs: cold builds, warm loads, and the driver's floor")
    ax.legend(fontsize=8, frameon=False, loc="upper right")
    ax.grid(axis="y", color="#dddddd", linewidth=0.6, which="both")
    ax.set_axisbelow(True)
    top = max(r["median_seconds"]["a"] * 1000 / r["n"] for r in runs)
    ax.set_ylim(top=top * 6)
    fig.tight_layout()
    _finish(fig, opencl_caption(runs), target, inputs, bottom=0.27)


def backends_caption(run: Run) -> str:
    meta = run.get("meta", {})
    return (
        "benchmarks/bench_backends.py: median time per operation of the median of "
        f"{meta.get('rounds', '?')} rounds, on {labels.machine(run)}, "
        f"Python {meta.get('python', '?')}"
        "; no GPU driver is involved. dir via Cache front adds encoding, checksums and key "
        "checks; raw dir stores the same encoded entries."
    )


def backends(run: Run, target: Path, inputs: str) -> None:
    """Figure 3: get and put per backend and value size, against diskcache, log scale."""
    plt = _pyplot()
    results = run["results"]
    sizes = list(results)
    subjects = list(next(iter(results.values())))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    width = 0.8 / len(subjects)
    for ax, op in zip(axes, ("get", "put"), strict=True):
        for index, name in enumerate(subjects):
            xs = [s + (index - (len(subjects) - 1) / 2) * width for s in range(len(sizes))]
            values = [results[size][name][f"{op}_us"] for size in sizes]
            colour = BACKEND_COLOURS[index % len(BACKEND_COLOURS)]
            hatch = "//" if name == "diskcache" else None
            ax.bar(xs, values, width=width * 0.95, color=colour, label=name, hatch=hatch)
        ax.set_yscale("log")
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([s.replace("KiB", " KiB").replace("MiB", " MiB") for s in sizes])
        ax.set_xlabel("value size")
        ax.set_title(f"{op}")
        ax.grid(axis="y", color="#dddddd", linewidth=0.6, which="both")
        ax.set_axisbelow(True)
    axes[0].set_ylabel("time per operation (µs, log scale)")
    axes[0].legend(fontsize=8, frameon=False, loc="upper left")
    fig.suptitle("Backend get and put against diskcache")
    fig.tight_layout()
    _finish(fig, backends_caption(run), target, inputs, bottom=0.2)
