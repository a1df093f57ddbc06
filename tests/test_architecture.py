"""Layering rules, checked on the AST: the core does no I/O, and nothing unpickles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = [
    "keys",
    "codec",
    "api",
    "errors",
    "registry",
    "provider",
    "cache",
    "stats",
    "maintenance",
    "listing",
]
FORBIDDEN_IMPORTS = {"os", "io", "pathlib", "socket", "sqlite3", "shutil", "tempfile"}
FORBIDDEN_ANYWHERE = {"pickle", "cPickle", "marshal", "dill", "shelve"}


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _calls(tree: ast.AST) -> set[str]:
    return {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }


@pytest.mark.parametrize("module", CORE)
def test_core_does_no_io(module: str) -> None:
    tree = ast.parse((ROOT / "runtime_cache" / f"{module}.py").read_text())
    assert not (_imports(tree) & FORBIDDEN_IMPORTS), module
    assert "open" not in _calls(tree), module


def _sources() -> list[Path]:
    return sorted((ROOT / "runtime_cache").rglob("*.py")) + sorted(
        (ROOT / "backends").rglob("*.py")
    )


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_marshal_or_eval(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert not (_imports(tree) & FORBIDDEN_ANYWHERE), path
    assert not ({"eval", "exec", "__import__"} & _calls(tree)), path


@pytest.mark.parametrize("path", sorted((ROOT / "backends").glob("*.py")), ids=lambda p: p.name)
def test_backends_import_only_the_contract(path: Path) -> None:
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("runtime_cache")
        ):
            allowed = {
                "runtime_cache.api",
                "runtime_cache.environment",  # the default cache folder
                "runtime_cache.errors",
                "runtime_cache.failure_policy",  # the one failure policy, shared with the front
                "runtime_cache.units",  # sizes, durations, booleans
                "runtime_cache.urls",  # URL parsing and redaction
            }
            if id(node) not in top_level:
                allowed.add("runtime_cache.registry")  # a composite opens its tiers lazily
            assert node.module in allowed, (path, node.module)
