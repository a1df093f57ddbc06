"""Layering rules, checked on the AST: the core does no I/O, and nothing unpickles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = [
    "keys",
    "codec",
    "entry_meta",
    "api",
    "errors",
    "registry",
    "provider",
    "cache",
    "builds",
    "stats",
    "maintenance",
    "pruning",
    "listing",
    "inventory",
    "removals",
    "writes",
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
                "runtime_cache.file_locks",  # a polled flock, shared with the crash guard
                "runtime_cache.fork_holds",  # a fork's wait and hold, shared with the OpenCL gate
                "runtime_cache.fork_locks",  # locks made anew in a forked child
                "runtime_cache.lazy_exports",  # the package's names, loaded on first use
                "runtime_cache.partial_reads",  # batch reads past a key that fails (contract)
                "runtime_cache.process_exit",  # flushed at a multiprocessing child's end too
                "runtime_cache.refusals",  # writes refused for size, shared with the front
                "runtime_cache.stored_sizes",  # a blob's size now, shared with listings
                "runtime_cache.units",  # sizes, durations, booleans
                "runtime_cache.urls",  # URL parsing and redaction
            }
            if id(node) not in top_level:
                allowed.add("runtime_cache.registry")  # a composite opens its tiers lazily
            assert node.module in allowed, (path, node.module)


# The import graph: every module of runtime_cache/ and backends/ (as runtime_cache.backends),
# with every import counted, function-level ones too, and relative imports resolved. Imports
# under ``if TYPE_CHECKING:`` never run, so they are left out.


def _module_files() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package, folder in (
        ("runtime_cache", ROOT / "runtime_cache"),
        ("runtime_cache.backends", ROOT / "backends"),
    ):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


MODULES = _module_files()


def _package_of(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = _package_of(module)
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def _edges(module: str) -> list[tuple[str, str | None]]:
    """``(imported module, imported name or None)`` for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((submodule, None) if submodule in MODULES else (target, alias.name))
    return [(target, name) for target, name in found if target in MODULES]


def _graph() -> dict[str, set[str]]:
    return {module: {target for target, _ in _edges(module)} - {module} for module in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in ``graph``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_another_modules_private_names() -> None:
    private = [
        f"{module} imports {name} from {target}"
        for module in MODULES
        for target, name in _edges(module)
        if name and name.startswith("_") and not name.startswith("__") and target != module
    ]
    assert not private, private
