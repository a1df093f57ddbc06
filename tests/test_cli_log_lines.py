"""What the command's log lines show: never a store's control characters raw.

The attacker review of session 40 planted a value over the cap under a Redis name that
held a terminal's escape sequences (a window title, a screen clear, a fake line);
``runtime-cache -v verify`` printed the name raw in its warning.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis_servers import RedisProcess

pytest_plugins = ["redis_servers"]

SECRET = ("--secret", "a-fleet-secret-of-32-characters!")
NAME = "demo/bin/\x1b]0;owned\x07\x1b[2J\u202eFAKE: all entries verified"


def test_a_name_with_escape_sequences_is_escaped_in_warnings(
    redis_server: RedisProcess, unique_prefix: str, tmp_path: Path
) -> None:
    import redis

    direct = redis.Redis(port=redis_server.port)
    direct.set(f"{unique_prefix}{NAME}".encode(), b"x" * 2048)
    url = f"{redis_server.url}?prefix={unique_prefix}&max_entry_size=1KiB"
    for verbose in ([], ["-v"]):
        done = subprocess.run(
            [sys.executable, "-m", "runtime_cache", *verbose, "--cache", url, *SECRET, "verify"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        said = done.stdout + done.stderr
        assert done.returncode == 1 and "Traceback" not in said, said
        assert not any(c in said for c in "\x1b\x07\u202e"), said
    assert "\\x1b]0;owned" in done.stderr  # the -v warning names it, escaped
    direct.delete(f"{unique_prefix}{NAME}".encode())
    direct.close()
