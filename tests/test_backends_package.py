"""The backends package's lazy exports, install hints, entry-point conflicts and logger names."""

from __future__ import annotations

import ast
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_cache import registry as reg
from runtime_cache.backends.memory import MemoryBackend
from runtime_cache.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["CallbackBackend", "DirectoryBackend", "MemoryBackend", "RedisBackend", "TieredBackend"]
MODULES = {"callback", "directory", "memory", "redis", "tiered"}


def _imported_after(statement: str) -> dict[str, list[str]]:
    """Run ``statement`` in a fresh interpreter; which backend modules did it import?"""
    script = (
        "import json, sys\n"
        f"{statement}\n"
        "mods = sorted(m.rsplit('.', 1)[1] for m in sys.modules "
        "if m.startswith('runtime_cache.backends.'))\n"
        "print(json.dumps({'modules': mods}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",  # not the source tree: the installed package must be what is imported
        check=True,
    )
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


def test_importing_the_package_imports_no_backend() -> None:
    assert _imported_after("import runtime_cache.backends") == {"modules": []}
    assert _imported_after("import runtime_cache") == {"modules": []}


@pytest.mark.parametrize(
    ("name", "module"),
    [(name, name.removesuffix("Backend").lower()) for name in BACKENDS],
)
def test_each_export_imports_only_its_module(name: str, module: str) -> None:
    loaded = set(_imported_after(f"from runtime_cache.backends import {name}")["modules"])
    assert module in loaded
    assert not (loaded & MODULES) - {module}, loaded  # no other backend came along


def test_exports_are_the_classes() -> None:
    import runtime_cache.backends as backends

    assert backends.MemoryBackend is MemoryBackend
    assert set(backends.__all__) == set(BACKENDS)
    assert set(BACKENDS) <= set(dir(backends))
    with pytest.raises(AttributeError, match="NoSuchBackend"):
        backends.NoSuchBackend  # noqa: B018


def test_hint_is_shown_when_the_module_is_missing() -> None:
    fresh = reg.Registry()
    fresh.register("s3x", "no_such_s3_module_xyz:S3Backend", hint="pip install 'mypkg[s3]'")
    with pytest.raises(MissingDependencyError, match=r"install it with: pip install 'mypkg\[s3\]'"):
        fresh.open_url("s3x://bucket/prefix")
    fresh.register("plain", "no_such_plain_module_xyz:Backend")
    with pytest.raises(MissingDependencyError) as info:
        fresh.open_url("plain://x")
    assert "install it with" not in str(info.value)
    with pytest.raises(ValueError):
        fresh.register("s3y", "mod:Cls", hint="  ")


def _distribution(site: Path, name: str, entries: dict[str, str]) -> None:
    """Install the metadata of a distribution that declares ``entries`` (no code needed)."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = ["[runtime_cache.backends]", *(f"{k} = {v}" for k, v in entries.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_entry_point_conflicts_warn_and_builtins_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Put the squatters first on sys.path, so they are found before the project itself.
    _distribution(tmp_path, "squatter-one", {"memory": "squat.one:Memory", "s3": "squat.one:S3"})
    _distribution(tmp_path, "squatter-two", {"s3": "squat.two:S3"})
    monkeypatch.syspath_prepend(str(tmp_path))
    caplog.set_level(logging.WARNING, logger="runtime_cache.registry")
    fresh = reg.Registry()
    # The project keeps its built-in name; resolving it reads only the project's own entry
    # points, so the squatters are found (and warned about) when everything is discovered.
    assert fresh.resolve("memory") is MemoryBackend
    assert fresh.names().count("s3") == 1
    assert fresh.resolve("memory") is MemoryBackend
    warnings = [r.getMessage() for r in caplog.records if r.name == "runtime_cache.registry"]
    assert any("'memory'" in w and "squat.one:Memory" in w for w in warnings), warnings
    assert any("'s3'" in w and "squat.one:S3" in w and "squat.two:S3" in w for w in warnings)


def test_every_logger_is_named_after_its_module() -> None:
    """``logging.getLogger(...)`` at module level takes ``__name__``, so the name says where."""
    sources = sorted((ROOT / "runtime_cache").rglob("*.py")) + sorted(
        (ROOT / "backends").rglob("*.py")
    )
    for path in sources:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "getLogger":
                args = node.value.args
                assert args and isinstance(args[0], ast.Name) and args[0].id == "__name__", path


def test_install_hints_name_the_packages_of_each_extra() -> None:
    """The hints said ``pip install 'runtime-cache[redis]'``: runtime-cache is not on PyPI, so
    that failed, or would install whatever took the name there. They name each extra's
    packages, as pyproject.toml declares them (none on a platform the extra leaves out)."""
    import shlex

    from runtime_cache.errors import INSTALL_INTEL, INSTALL_OPENCL, INSTALL_REDIS

    tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11 and later")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for hint, extra in (
        (INSTALL_REDIS, "redis"),
        (INSTALL_OPENCL, "opencl"),
        (INSTALL_INTEL, "intel"),
    ):
        named = shlex.split(hint)[2:]
        assert hint.startswith("pip install ") and "runtime-cache" not in hint
        assert named == [spec.split(";")[0].strip() for spec in extras[extra]], (hint, extra)
