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
    assert in_docs == in_help - {"--cache", "--secret", "--secret-file", "--verbose"}  # global
    description = " ".join(help_text.split("\n\n")[1].split())
    assert description in " ".join(section.split())


def test_global_options_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    reference = (DOCS / "cli.md").read_text(encoding="utf-8")
    for option in ("--cache", "--secret", "--secret-file", "--verbose", "--version"):
        assert option in help_text and f"`{option}`" in reference
    for command in _commands():
        assert command in help_text and f"## `{command}`" in reference
