"""Importing the packages loads little; every exported name still resolves, on first use.

A program that drops privileges after importing should resolve the names it uses
first (``from runtime_cache import Cache, ...``): they load their modules then.

Each check runs in a fresh ``python -I`` interpreter started in a temporary folder,
with the parent's ``sys.path`` less the current folder (as every child process of
runtime-cache gets it), so what it sees is what an application's process sees.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
import runtime_cache.opencl as ocl
from conftest import need
from runtime_cache.opencl.child import child_path

#: What an import of the packages (and ``install()``) must leave for a process's first build.
HEAVY = [
    "runtime_cache.api",
    "runtime_cache.bundles",
    "runtime_cache.cache",
    "runtime_cache.check",
    "runtime_cache.cli",
    "runtime_cache.codec",
    "runtime_cache.fleet",
    "runtime_cache.inventory",
    "runtime_cache.keys",
    "runtime_cache.listing",
    "runtime_cache.provider",
    "runtime_cache.registry",
    "runtime_cache.stats",
    "runtime_cache.backends.directory",
    "runtime_cache.opencl.capture",
    "runtime_cache.opencl.detached_store",
    "runtime_cache.opencl.devices",
    "runtime_cache.opencl.driver_cache",
    "runtime_cache.opencl.guard",
    "runtime_cache.opencl.module",
    "runtime_cache.opencl.program",
    "runtime_cache.opencl.write_behind",
]


def _child(tmp_path: Path, statement: str, **env: str) -> dict[str, Any]:
    """Run ``statement`` in a fresh interpreter; return its ``result`` (JSON) and modules."""
    code = (
        "import json, sys\n"
        f"sys.path[:] = {child_path()!r}\n"
        "result = None\n"
        f"{statement}\n"
        "mods = sorted(m for m in sys.modules if m.startswith('runtime_cache'))\n"
        "print(json.dumps({'modules': mods, 'result': result}))\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_CACHE")}
    done = subprocess.run(
        [sys.executable, "-I", "-c", code],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize(
    "statement",
    ["import runtime_cache", "import runtime_cache.opencl", "import runtime_cache.backends"],
)
def test_importing_a_package_loads_none_of_the_machinery(tmp_path: Path, statement: str) -> None:
    loaded = set(_child(tmp_path, statement)["modules"])
    assert statement.split()[-1] in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_install_without_a_build_loads_none_of_the_machinery(tmp_path: Path) -> None:
    if importlib.util.find_spec("pyopencl") is None:
        need("OpenCL", "RUNTIME_CACHE_REQUIRE_OPENCL", "pyopencl is not installed")
    statement = (
        "import runtime_cache.opencl as o\n"
        "o.install()\n"
        "result = [o.is_installed(), o.flush(), o.uninstall(), o.is_installed()]"
    )
    out = _child(tmp_path, statement)
    assert out["result"] == [True, True, True, False]
    loaded = set(out["modules"]) - {"runtime_cache.opencl.write_behind"}  # flush() asked for it
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_every_exported_name_resolves_in_a_fresh_process(tmp_path: Path) -> None:
    statement = (
        "import importlib\n"
        "result = {}\n"
        "for name in ('runtime_cache', 'runtime_cache.opencl', 'runtime_cache.backends'):\n"
        "    package = importlib.import_module(name)\n"
        "    missing = [n for n in package.__all__ if not hasattr(package, n)]\n"
        "    listed = [n for n in package.__all__ if n not in dir(package)]\n"
        "    namespace = {}\n"
        "    exec(f'from {name} import *', namespace)\n"
        "    starred = sorted(set(package.__all__) - set(namespace))\n"
        "    result[name] = [missing, listed, starred]\n"
    )
    assert _child(tmp_path, statement)["result"] == {
        name: [[], [], []]
        for name in ("runtime_cache", "runtime_cache.opencl", "runtime_cache.backends")
    }


def test_exported_names_are_the_defining_modules_objects() -> None:
    from runtime_cache.opencl import counters, driver_cache, program

    install = importlib.import_module("runtime_cache.opencl.install")

    for name in rc.__all__:
        assert getattr(rc, name) is not None
    assert rc.Cache is importlib.import_module("runtime_cache.cache").Cache
    assert rc.get_cache is importlib.import_module("runtime_cache.provider").get_cache
    assert ocl.DRIVER_CACHE_PURPOSE == driver_cache.PURPOSE
    assert ocl.prepare_driver_cache is driver_cache.prepare
    assert ocl.PURPOSE == program.PURPOSE and ocl.build_program is program.build_program
    assert ocl.opencl_stats is counters.opencl_stats
    # The submodule ``install`` never hides the function of the same name.
    assert callable(ocl.install) and ocl.install is install.install
    with pytest.raises(AttributeError, match="no_such_name"):
        ocl.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_name"):
        rc.no_such_name  # noqa: B018


def test_the_driver_cache_switch_is_read_where_it_is_defined() -> None:
    from runtime_cache.opencl import driver_cache
    from runtime_cache.opencl.install import driver_cache_wanted

    # install.py reads the switch by name before it imports driver_cache.py.
    assert driver_cache.ENV_SWITCH == "RUNTIME_CACHE_DRIVER_CACHE"
    for value in ("", " ", "1", "on", "yes", "true", "0", "off", "nonsense"):
        os.environ[driver_cache.ENV_SWITCH] = value
        try:
            assert driver_cache_wanted() == driver_cache.driver_cache_enabled()
        finally:
            del os.environ[driver_cache.ENV_SWITCH]
    assert driver_cache_wanted() is driver_cache.driver_cache_enabled() is False
    assert driver_cache_wanted(True) and not driver_cache_wanted(False)


def test_the_driver_cache_switch_still_prepares_on_import(tmp_path: Path) -> None:
    statement = (
        "import os\n"
        "import runtime_cache.opencl\n"
        "result = [os.environ.get('POCL_CACHE_DIR', ''), os.environ.get('CUDA_CACHE_PATH', '')]"
    )
    folder = tmp_path / "driver"
    env = {"RUNTIME_CACHE_DRIVER_CACHE": "1", "RUNTIME_CACHE_DRIVER_DIR": str(folder)}
    clean = {k: "" for k in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH")}
    on = _child(tmp_path, statement, **env, **clean)["result"]
    assert all(path.startswith(str(folder)) for path in on), on
    off = _child(tmp_path, statement, RUNTIME_CACHE_DRIVER_DIR=str(folder), **clean)["result"]
    assert not any(path.startswith(str(folder)) for path in off), off


def test_the_source_tree_is_not_what_the_children_import(tmp_path: Path) -> None:
    # The checks above would pass vacuously if the child imported another copy.
    spec = importlib.util.find_spec("runtime_cache")
    assert spec is not None and spec.origin is not None
    statement = "import runtime_cache\nresult = runtime_cache.__file__"
    assert _child(tmp_path, statement)["result"] == spec.origin
