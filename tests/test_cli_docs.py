"""docs/cli.md is generated from the parser and must match what ``--help`` says."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from runtime_cache.cli import build_parser, main

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _gen_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## `([\w-]+)`$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _commands() -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return list(sub.choices)  # type: ignore[arg-type]


def test_cli_reference_is_not_stale() -> None:
    current = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert current == _gen_cli().render(), "docs/cli.md is stale: run python docs/gen_cli.py"


@pytest.mark.parametrize("command", _commands())
def test_reference_lists_the_same_options_as_help(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command, "--help"]) == 0
    help_text = capsys.readouterr().out
    section = _sections((DOCS / "cli.md").read_text(encoding="utf-8"))[command]
    in_help = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", help_text)) - {"--help"}
    in_docs = set(re.findall(r"`(--[a-z][\w-]*)`", section))
    assert in_docs == in_help - {"--cache", "--secret", "--secret-file"}  # global: own table
    description = " ".join(help_text.split("\n\n")[1].split())
    assert description in " ".join(section.split())


def test_global_options_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    reference = (DOCS / "cli.md").read_text(encoding="utf-8")
    for option in ("--cache", "--secret", "--secret-file", "--version"):
        assert option in help_text and f"`{option}`" in reference
    for command in _commands():
        assert command in help_text and f"## `{command}`" in reference


def _plot_module() -> ModuleType:
    path = DOCS.parent / "benchmarks" / "plot.py"
    spec = importlib.util.spec_from_file_location("bench_plot", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_plots_handle_whichever_results_exist(tmp_path: Path) -> None:
    plot = _plot_module()
    results, images = tmp_path / "results", tmp_path / "img"
    results.mkdir()
    assert "No results yet" in plot.section(results, images)
    (results / "nested.json").write_text(
        '{"meta": {"rounds": 3}, "results": {'
        '"1KiB": {"dir": {"get_us": 20.5, "ratio": 1.4}, "memory": {"get_us": 0.8, "ratio": 0.05}},'
        '"1MiB": {"dir": {"get_us": 90.0, "ratio": 0.4}}}}'
    )
    (results / "records.json").write_text(
        '[{"case": "cold", "median_s": 2.5}, {"case": "warm", "median_s": 0.1}]'
    )
    trials = ",".join(f'{{"trial": {i}, "lost": {i % 3}}}' for i in range(30))
    (results / "harness.json").write_text(f'{{"benchmark": "h", "killed": 90, "rows": [{trials}]}}')
    (results / "text_only.json").write_text('{"note": "nothing numeric"}')
    (results / "broken.json").write_text("{not json")
    text = plot.section(results, images)
    assert "| 1KiB | dir | 20.5 | 1.4 |" in text and "| 1MiB | dir | 90 | 0.4 |" in text
    assert "| cold | 2.5 |" in text and "| warm | 0.1 |" in text
    assert "Run conditions: rounds: 3." in text
    assert "| killed | 90 |" in text  # a single record is shown field by field
    assert "30 rows, summarized" in text and "| lost | 1 | 0 | 2 |" in text
    assert "| note | nothing numeric |" in text
    assert "Unreadable results file" in text
    assert sorted(p.name for p in images.iterdir()) == ["nested.png", "records.png"]
    assert (images / "nested.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (results / "records.json").unlink()
    plot.section(results, images)
    assert sorted(p.name for p in images.iterdir()) == ["nested.png"]  # no stale plots


def test_benchmark_section_is_replaced_between_markers() -> None:
    plot = _plot_module()
    page = f"# B\n\nprose\n\n{plot.START}\nold table\n{plot.END}\n\nafter\n"
    updated = plot.rewrite(page, "NEW")
    assert "old table" not in updated and "NEW" in updated
    assert updated.startswith("# B\n\nprose") and updated.endswith("after\n")
    assert plot.rewrite(updated, "NEW") == updated


def test_repeated_measurements_become_one_row_with_their_spread() -> None:
    plot = _plot_module()
    rows = plot.flatten({"seconds": {"cold": [3.0, 1.0, 2.0], "warm": [0.2, 0.1]}})
    assert rows == [
        (("seconds", "cold"), {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}),
        (("seconds", "warm"), {"median": pytest.approx(0.15), "min": 0.1, "max": 0.2, "n": 2}),
    ]
