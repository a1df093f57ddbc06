"""The demo's cold and warm runs, each in a child process of its own.

:func:`child_env` builds a run's environment (the cache URL with its folders made
absolute, the secret as a file, the driver's caches off or carried in a folder made for
the run), and :func:`run_child` starts the run and reads the report it prints last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

from .. import environment
from .errors import DemoError

__all__ = ["CHILD_TIMEOUT_S", "child_env", "run_child", "write_secret_file"]

#: Seconds one run may take before the demo gives up on it.
CHILD_TIMEOUT_S = 900


def run_child(
    label: str, model: str, device: str, env: dict[str, str], progress: bool
) -> dict[str, Any]:
    """Run the ``label`` run (``"cold"`` or ``"warm"``) of ``model`` on ``device`` in a
    child with environment ``env``; its report, with ``wall_s`` added. ``progress``: the
    child shows its phases on this process's stderr. Raises :class:`DemoError` (``code=1``)
    for a run that fails, times out or prints no report, and ``KeyboardInterrupt`` where
    Ctrl-C reached the child first."""
    from ..opencl.child import child_folder, python_command

    argv = ["--model", model, "--device", device]
    if progress:
        argv += ["--progress", label]
    command = python_command("runtime_cache.demo.run", argv)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=child_folder(),
            stdout=subprocess.PIPE,
            stderr=None if progress else subprocess.PIPE,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise DemoError(f"the {label} run took over {CHILD_TIMEOUT_S} s", code=1) from None
    wall = time.perf_counter() - started
    if done.returncode in (-signal.SIGINT, 130):  # Ctrl-C reached the child first
        raise KeyboardInterrupt
    if done.returncode != 0:
        tail = (done.stderr or b"").decode("utf-8", "replace").strip().splitlines()[-15:]
        detail = ("\n" + "\n".join(tail)) if tail else " (see above)"
        raise DemoError(f"the {label} run failed with exit code {done.returncode}{detail}", code=1)
    try:
        report: dict[str, Any] = json.loads(done.stdout.decode("utf-8").strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DemoError(f"the {label} run printed no report", code=1) from None
    report["wall_s"] = round(wall, 6)
    return report


def _absolute(url: str) -> str:
    """``url`` with each relative ``dir://`` folder made absolute: the runs start elsewhere."""
    parts = []
    for part in url.split(","):
        scheme, sep, rest = part.strip().partition("://")
        if sep and scheme.lower() == "dir" and rest and not rest.startswith(("/", "?")):
            path, query, args = rest.partition("?")
            rest = os.path.abspath(path) + query + args
        parts.append(f"{scheme}{sep}{rest}")
    return ",".join(parts)


def write_secret_file(keys: list[str], folder: str) -> str:
    """A file of ``keys``, one a line, readable by this user only, in ``folder`` (private,
    removed when the runs end); its path. A key with a line break in it cannot be passed
    so: :class:`DemoError`."""
    if any("\n" in key or "\r" in key for key in keys):
        raise DemoError("a secret key holds a line break: the demo's runs cannot be given it")
    path = os.path.join(folder, "secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{key}\n" for key in keys))
    return path


def child_env(
    url: str, driver_cache: bool, driver_dir: str | None = None, secret_file: str | None = None
) -> dict[str, str]:
    """The runs' environment; ``driver_dir``: carry the driver's cache, kept there;
    ``secret_file``: the keys, one a line (:func:`write_secret_file`: never on a command
    line, and never joined at commas: a key may hold one, and each key of a comma list
    needs 16 characters)."""
    env = dict(os.environ)
    env[environment.ENV_CACHE] = _absolute(url)
    if secret_file is not None:
        env.pop(environment.ENV_SECRET, None)
        env[environment.ENV_SECRET_FILE] = secret_file
    if not driver_cache:
        env["POCL_KERNEL_CACHE"] = "0"
        env["CUDA_CACHE_DISABLE"] = "1"
    from ..opencl.driver_cache import ENV_DIR, ENV_SWITCH

    env.pop(ENV_SWITCH, None)  # the runs carry only in folders made for them (the engine's)
    if driver_dir is not None:
        # The drivers' folders are ours for these runs: a new one for the cold run.
        for name in ("POCL_CACHE_DIR", "CUDA_CACHE_PATH"):
            env.pop(name, None)
        env.update({ENV_SWITCH: "1", ENV_DIR: driver_dir})
    return env
