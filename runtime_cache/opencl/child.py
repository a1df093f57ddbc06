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

A child that serves this process (a build worker, a vetting child) ends with it
(:func:`follow_parent`): killed (``kill -9``), the app would otherwise leave a
child that hangs in a trial launch running for good, at parent 1.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

from ..fork_locks import renew_in_child

__all__ = ["PARENT_ENV", "child_folder", "child_path", "follow_parent", "python_command"]

#: The environment variable that tells a child its parent's process id (see
#: :func:`follow_parent`).
PARENT_ENV = "RUNTIME_CACHE_PARENT_PID"
#: ``prctl``'s option that has the kernel signal a process when its parent ends (Linux).
_PR_SET_PDEATHSIG = 1

# Run as ``python -I -c BOOT MODULE PATH ARGS...``; PATH holds os.pathsep-joined entries.
_BOOT = (
    "import os, runpy, sys\n"
    "module, path = sys.argv[1], sys.argv[2]\n"
    "sys.path[:] = [p for p in path.split(os.pathsep) if p]\n"
    "sys.argv[:] = [module, *sys.argv[3:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n"
)

_lock = threading.Lock()
renew_in_child(sys.modules[__name__], "_lock")  # (held at a fork: free in the child)
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
            from .scratch import CHILD, Scratch

            try:
                made = Scratch(CHILD)  # (locked while this process lives: see .scratch)
            except OSError:
                return os.path.abspath(os.sep)
            _folder = made.path
            atexit.register(made.remove)
        return _folder


def follow_parent() -> None:
    """In a child started with :data:`PARENT_ENV` set to its parent's pid: end this
    process when that parent ends, even while the child is stuck in a driver call.

    On Linux the kernel kills it (``PR_SET_PDEATHSIG``: the parent's thread that started
    the child must live as long as the child does, as a build worker's and a vetting
    child's do); elsewhere a thread looks every second. A parent gone before this call
    (the child is then another's, pid 1's) ends it at once.
    """
    parent = os.environ.pop(PARENT_ENV, "")  # (not passed on to the child's own children)
    if not parent.isdigit():
        return
    pid = int(parent)
    if sys.platform.startswith("linux") and _kill_with_parent():
        if os.getppid() != pid:
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="runtime-cache-parent-watch", daemon=True).start()


def _kill_with_parent() -> bool:
    """Have the kernel send ``SIGKILL`` to this process when its parent ends; whether it will."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
