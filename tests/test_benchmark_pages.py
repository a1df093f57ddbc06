"""benchmarks/plot.py: the latest run per platform, hashes of the inputs, and a current page."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot  # noqa: E402


def test_the_committed_page_and_figures_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = plot.PAGE.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 400


def test_two_runs_on_one_platform_are_refused(tmp_path: Path) -> None:
    results = ROOT / "benchmarks" / "results"
    shutil.copy(results / "opencl-pocl-run13.json", tmp_path)
    shutil.copy(results / "history" / "opencl-pocl-run10.json", tmp_path)
    with pytest.raises(plot.ResultsError, match=r"move the older \(opencl-pocl-run10.json\)"):
        plot.load(tmp_path)
    # The same device with the driver cache on is another platform.
    other = json.loads((results / "history" / "opencl-pocl-run10.json").read_text())
    other["driver_cache"] = "on"
    (tmp_path / "opencl-pocl-run10.json").write_text(json.dumps(other))
    assert len(plot.load(tmp_path)) == 2


def test_an_unreadable_file_is_an_error_and_no_results_give_a_bare_page(tmp_path: Path) -> None:
    assert plot.load(tmp_path) == []
    assert plot.page([]).startswith("# Benchmarks") and "## " not in plot.page([])
    assert plot.figure_plan([]) == []
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(plot.ResultsError, match=r"broken\.json"):
        plot.load(tmp_path)


def test_history_is_not_read_and_every_file_is_covered() -> None:
    runs = plot.load()
    assert all("/" not in str(r["_file"]) for r in runs)
    page = plot.page(runs)
    for run in runs:  # every latest result shows up on the page
        assert f"`{run['_file']}`" in page


def test_a_figure_records_its_inputs_and_a_change_makes_it_stale(tmp_path: Path) -> None:
    runs = plot.load()
    name, members, draw, caption = next(
        f for f in plot.figure_plan(runs) if f[0] == "backends-vs-diskcache.png"
    )
    assert "2 cores" in caption
    target = tmp_path / name
    draw(members, target, plot.figure_inputs(members))
    assert plot.png_inputs(target) == plot.figure_inputs(members)
    changed = [{**members[0], "_bytes": members[0]["_bytes"] + b" "}]
    assert plot.figure_inputs(changed) != plot.png_inputs(target)
    assert plot.png_inputs(tmp_path / "missing.png") is None
