"""How runtime-cache starts Python child processes: never from the current folder.

Build workers, vetting children and the demo's runs are Python processes of
their own. Started as ``python -m module``, a child puts the current folder
first on ``sys.path``: a ``msgpack.py`` planted in the folder an app was
started from would run in every child, and a source checkout's
``runtime_cache/`` would shadow the installed package. So every child starts
through :func:`python_command`:

* ``python -I`` (isolated: no current folder, no ``PYTHON*`` variables, no
  user site folder), which exists on every supported Python, 3.10 included
  (``-P`` came only in 3.11);
* a short bootstrap that sets the child's ``sys.path`` to the parent's, less
  the current folder, and runs the module as ``__main__``;
* a private working folder (:func:`child_folder`), so nothing the child
  resolves against its working folder comes from the app's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence

__all__ = ["child_folder", "child_path", "python_command"]

# Run as ``python -I -c BOOT MODULE PATH ARGS...``; PATH holds os.pathsep-joined entries.
_BOOT = (
    "import os, runpy, sys\n"
    "module, path = sys.argv[1], sys.argv[2]\n"
    "sys.path[:] = [p for p in path.split(os.pathsep) if p]\n"
    "sys.argv[:] = [module, *sys.argv[3:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)

_lock = threading.Lock()
_folder: str | None = None


def _package_root() -> str:
    """The folder holding the ``runtime_cache`` package this process imported."""
    here = os.path.dirname(os.path.abspath(__file__))  # .../runtime_cache/opencl
    return os.path.dirname(os.path.dirname(here))


def child_path() -> list[str]:
    """The parent's ``sys.path`` as absolute folders, less the current folder.

    The folder this process imported ``runtime_cache`` from always stays, so a
    child runs the same code as its parent.
    """
    cwd = os.path.realpath(os.getcwd()) if _cwd_exists() else None
    root = _package_root()
    paths: list[str] = []
    for entry in sys.path:
        if not entry:
            continue  # "" is the current folder
        full = os.path.abspath(entry)
        if cwd is not None and os.path.realpath(full) == cwd and full != root:
            continue
        if full not in paths:
            paths.append(full)
    if root not in paths:
        paths.insert(0, root)
    return paths


def _cwd_exists() -> bool:
    try:
        os.getcwd()
    except OSError:
        return False
    return True


def python_command(module: str, args: Sequence[str] = ()) -> list[str]:
    """The command line that runs ``python -m module args`` isolated from the current folder.

    Pass :func:`child_folder` as the child's working folder.

    Example::

        subprocess.run(python_command("runtime_cache.demo.run", ["--model", "tiny"]),
                       cwd=child_folder())
    """
    path = os.pathsep.join(child_path())
    return [sys.executable, "-I", "-c", _BOOT, module, path, *args]


def child_folder() -> str:
    """A private, empty working folder for child processes (one per process, removed at exit).

    Falls back to the filesystem root when no temporary folder can be made.
    """
    global _folder
    with _lock:
        if _folder is None or not os.path.isdir(_folder):
            try:
                _folder = tempfile.mkdtemp(prefix="runtime-cache-child-")
            except OSError:
                return os.path.abspath(os.sep)
            atexit.register(shutil.rmtree, _folder, True)
        return _folder
