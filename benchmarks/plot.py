"""Write docs/benchmarks.md and its three figures from the latest results in benchmarks/results.

Usage::

    python benchmarks/plot.py            # rewrite docs/benchmarks.md and docs/img/*.png
    python benchmarks/plot.py --check    # exit 1 if any of them is stale

``benchmarks/results/`` keeps the latest run per benchmark and platform (for OpenCL runs:
per device and driver-cache setting; for demo runs: per driver and device); older runs go to
``benchmarks/results/history/``, which nothing here reads. Two runs of one benchmark on one
platform in ``results/`` are an error, so a new run cannot silently hide behind an old one.

The page and every figure record a hash of their inputs (the JSON they come from and this
code): ``--check`` rebuilds the page's text and compares it, and compares each PNG's stored
hash with the one its inputs give now, so figures drawn by another matplotlib still pass.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # figures, labels, tables: also when imported from elsewhere

import figures  # noqa: E402
import labels  # noqa: E402
import tables  # noqa: E402

ROOT = HERE.parent
RESULTS = HERE / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img"
CODE = [HERE / "plot.py", HERE / "tables.py", HERE / "figures.py", HERE / "labels.py"]

Run = dict[str, Any]


class ResultsError(Exception):
    """Two runs of one benchmark on one platform, or a file that does not read."""


def platform_key(run: Mapping[str, Any]) -> tuple[str, ...]:
    """What makes two results files runs of the same benchmark on the same platform."""
    kind = str(run.get("benchmark", ""))
    if kind == "opencl":
        device = run.get("device", {})
        carried = "carried" if run.get("driver_cache_restored_files") else "plain"
        return (kind, str(device.get("name")), str(run.get("driver_cache")), carried)
    if kind == "demo":
        driver = run.get("driver", {})
        return (kind, str(driver.get("platform_name")), str(driver.get("device")))
    return ("file", str(run["_file"]))  # one file per configuration


def load(results: Path = RESULTS) -> list[Run]:
    """Every results file directly in ``results`` (not ``history/``), checked for duplicates."""
    runs: list[Run] = []
    seen: dict[tuple[str, ...], str] = {}
    for path in sorted(results.glob("*.json")):
        try:
            run = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ResultsError(f"{path}: {exc}") from None
        run["_file"] = path.name
        run["_bytes"] = path.read_bytes()
        key = platform_key(run)
        if key in seen:
            newer = max(path.name, seen[key], key=lambda n: str(_date(results / n)))
            older = seen[key] if newer == path.name else path.name
            raise ResultsError(
                f"{seen[key]} and {path.name} are runs of one benchmark on one platform; "
                f"move the older ({older}) to {results.name}/history/"
            )
        seen[key] = path.name
        runs.append(run)
    return runs


def _date(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    return str(data.get("date") or data.get("meta", {}).get("date") or "")


def digest(runs: Sequence[Run], code: Sequence[Path]) -> str:
    """A hash of the runs' files and of the code that turns them into a page or a figure."""
    h = hashlib.sha256()
    for run in sorted(runs, key=lambda r: str(r["_file"])):
        h.update(str(run["_file"]).encode() + b"\0" + run["_bytes"] + b"\0")
    for path in code:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _pick(runs: Sequence[Run], kind: str) -> list[Run]:
    return [r for r in runs if r.get("benchmark") == kind]


def _opencl_order(run: Run) -> tuple[int, str]:
    return (0 if "Portable" in str(run["device"].get("platform_name")) else 1, str(run["_file"]))


Figure = tuple[str, list[Run], Callable[[list[Run], Path, str], None], str]


def figure_plan(runs: Sequence[Run]) -> list[Figure]:
    """(file name, the runs it is drawn from, how to draw it, caption) for each figure."""
    demo = _pick(runs, "demo")
    opencl = sorted(_pick(runs, "opencl"), key=_opencl_order)
    backends = [r for r in runs if r["_file"] == "bench_backends.json"]
    plan: list[Figure] = []
    if demo:
        plan.append(("demo-first-inference.png", demo, figures.demo, figures.demo_caption(demo)))
    if opencl:
        caption = figures.opencl_caption(opencl)
        plan.append(("opencl-per-kernel.png", opencl, figures.opencl, caption))
    if backends:

        def draw(rs: list[Run], target: Path, inputs: str) -> None:
            figures.backends(rs[0], target, inputs)

        caption = figures.backends_caption(backends[0])
        plan.append(("backends-vs-diskcache.png", backends, draw, caption))
    return plan


def figure_inputs(members: Sequence[Run]) -> str:
    return digest(members, [HERE / "figures.py", HERE / "labels.py"])


def _image(name: str, title: str, caption: str) -> str:
    """The figure, with ``title`` as its alt text and the caption under it."""
    return f"![{title}](img/{name})\n\n*{title}. {caption}*"


FIGURE_1 = "Figure 1: time to first inference, cold vs warm, by phase"
FIGURE_2 = "Figure 2: time per OpenCL program, cold, parallel cold, warm and floor"
FIGURE_3 = "Figure 3: backend get and put against diskcache"

INTRO = """# Benchmarks

The benchmarks are scripts in `benchmarks/`. Each one prints a table and writes JSON to
`benchmarks/results/`; this page and its figures are generated from the latest run of each
benchmark on each platform by `benchmarks/plot.py`, so nothing here is typed or drawn by hand.
Earlier runs are kept in `benchmarks/results/history/`, and the method and the log of every
OpenCL run are on [OpenCL: method and run log](benchmarks-opencl.md).

```bash
python benchmarks/bench_demo.py          # and bench_opencl.py, bench_backends.py, ...
python benchmarks/plot.py                # rewrites this page and docs/img/*.png
python benchmarks/plot.py --check        # exit 1 if they are stale
```

Times are medians. Runs on a shared 2-core machine are noisy (other jobs share the cores): read
their ratios, taken within one run, rather than their absolute times."""


def page(runs: Sequence[Run]) -> str:
    """The whole of docs/benchmarks.md."""
    out = [INTRO, ""]
    plan = {name: (members, caption) for name, members, _, caption in figure_plan(runs)}
    demo = _pick(runs, "demo")
    if demo:
        out += ["## Time to first inference: the demo", ""]
        out += [
            "`runtime-cache demo` runs a 12-layer CNN's first inference in a fresh process twice:",
            "cold (compile every OpenCL program, tune every layer) and warm (load both from the",
            "cache). Figure 1 stacks each run's time by phase. From "
            + ", ".join(f"`{r['_file']}`" for r in demo)
            + ".",
            "",
        ]
        caption = plan["demo-first-inference.png"][1]
        out += [_image("demo-first-inference.png", FIGURE_1, caption), ""]
        out += [tables.demo(demo), ""]
    opencl = sorted(_pick(runs, "opencl"), key=_opencl_order)
    if opencl:
        out += ["## OpenCL programs: cold, warm and the floor", ""]
        out += [
            "`benchmarks/bench_opencl.py` builds 100 distinct kernels, one program each, in fresh",
            "processes. The floor (d) is the driver loading the same binaries with nothing",
            "around it; warm (c) is runtime-cache doing the same from its store, checks included.",
            "",
            _image("opencl-per-kernel.png", FIGURE_2, plan["opencl-per-kernel.png"][1]),
            "",
            tables.opencl(opencl),
            "",
            tables.opencl_conditions(opencl),
            "",
        ]
    backends = [r for r in runs if r["_file"] == "bench_backends.json"]
    if backends:
        caption = plan["backends-vs-diskcache.png"][1]
        out += ["## Backends against diskcache", ""]
        out += ["From `bench_backends.json`: one process, values of three sizes.", ""]
        out += [_image("backends-vs-diskcache.png", FIGURE_3, caption), ""]
        out += [tables.backends(backends[0]), ""]
    stress = [r for r in runs if str(r["_file"]).startswith("stress-")]
    sections: list[tuple[str, list[Run], Callable[..., str], bool]] = [
        ("Redis", [r for r in runs if r["_file"] == "bench_redis.json"], tables.redis, False),
        ("The CLI", [r for r in runs if r["_file"] == "bench_cli.json"], tables.cli, False),
        ("Many processes at once: stress", stress, tables.stress, True),
        ("Killed writers: the crash harness", _pick(runs, "crash_harness"), tables.crash, False),
        ("Fuzzing", _pick(runs, "fuzz"), tables.fuzz, True),
        (
            "Warm loads against the code before this round: rotating fresh processes",
            [r for r in runs if r.get("benchmark") == "warm-ab"],
            tables.warm_ab,
            True,
        ),
        (
            "A fleet's cold start: N processes on one shared cache",
            [r for r in runs if r.get("benchmark") == "fleet"],
            tables.fleet,
            True,
        ),
        (
            "pyopencl's own test suite under install(): cold and warm against no cache",
            [r for r in runs if r.get("benchmark") == "pyopencl-suite"],
            tables.pyopencl_suite,
            True,
        ),
        (
            "Driver caches: when NVIDIA reads its ComputeCache",
            [r for r in runs if r.get("benchmark") == "nvidia-computecache-probe"],
            tables.computecache_probe,
            False,
        ),
    ]
    for title, members, render, many in sections:
        if not members:
            continue
        files = ", ".join(f"`{r['_file']}`" for r in members)
        out += [f"## {title}", "", f"From {files}; {_conditions(members)}.", ""]
        out += [render(members) if many else render(members[0]), ""]
    out += [f"<!-- generated by benchmarks/plot.py from inputs {digest(runs, CODE)} -->"]
    return "\n".join(out) + "\n"


def _conditions(runs: Sequence[Run]) -> str:
    return "; ".join(sorted({f"on {labels.machine(r)}" for r in runs}))


def png_inputs(path: Path) -> str | None:
    """The inputs hash stored in a PNG's text chunks, or None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and b"\0" in body:
            key, value = body.split(b"\0", 1)
            if key.decode("latin-1") == figures.INPUTS_KEY:
                return value.decode("latin-1")
        pos += 12 + length
    return None


def check(runs: Sequence[Run]) -> list[str]:
    """What is stale: the page, and each figure whose stored inputs hash differs."""
    stale = []
    if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page(runs):
        stale.append(str(PAGE.relative_to(ROOT)))
    for name, members, _, _ in figure_plan(runs):
        if png_inputs(IMAGES / name) != figure_inputs(members):
            stale.append(f"docs/img/{name}")
    return stale


def main(argv: list[str] | None = None) -> int:
    """Rewrite the page and the figures, or check them with ``--check``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if anything is stale")
    args = parser.parse_args(argv)
    try:
        runs = load()
    except ResultsError as exc:
        print(f"benchmarks/results: {exc}", file=sys.stderr)
        return 1
    if args.check:
        stale = check(runs)
        if stale:
            print(f"stale: {', '.join(stale)}; run python benchmarks/plot.py", file=sys.stderr)
            return 1
        return 0
    for name, members, draw, _ in figure_plan(runs):
        draw(members, IMAGES / name, figure_inputs(members))
    PAGE.write_text(page(runs), encoding="utf-8")
    print(f"wrote {os.path.relpath(PAGE)} and {len(figure_plan(runs))} figures in docs/img")
    return 0


if __name__ == "__main__":
    sys.exit(main())
