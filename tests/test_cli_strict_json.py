"""What ``--json`` prints is strict JSON, whatever an entry's metadata holds.

The re-attack review of session 40: one planted entry whose extras held a bytes key made
``ls --json`` die with a traceback and print nothing, and one with NaN in a key part made
``ls --json`` and ``show --json`` print ``NaN``, which JSON parsers refuse (a strict one
fails, jq turns it into null). Such metadata decodes (msgpack holds it), so the output
side takes care of it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache.backends.directory import DirectoryBackend
from runtime_cache.cli import main
from runtime_cache.codec import encode_entry


def _strict(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "planted",
    [
        {"extra": {b"\x00k": 1, b"00": 2, "3030": 3, "b'00'": 4}},
        {"extra": {"v": float("nan"), "w": [float("inf"), -float("inf")]}},
        {"parts": {"opt": float("nan")}},
    ],
    ids=["bytes-key", "nan-extra", "nan-part"],
)
def test_every_json_output_is_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], planted: dict[str, Any]
) -> None:
    root = tmp_path / "c"
    backend = DirectoryBackend(root)
    good = rc.make_key(module_id="good", runtime="opencl", purpose="p")
    rc.Cache(backend).put(good, b"G")
    evil = rc.make_key(module_id="evil", runtime="opencl", purpose="p", **planted.get("parts", {}))
    backend.set(
        str(evil),
        encode_entry(
            str(evil), evil.parts, b"x", created_at=time.time(), extra=planted.get("extra")
        ),
    )
    url = f"dir://{root}"
    for argv in (
        ["ls"],
        ["show", str(evil)],
        ["stats"],
        ["verify"],
        ["prune", "--older-than", "1d"],
    ):
        capsys.readouterr()
        code = main(["--cache", url, *argv, "--json"])
        out = capsys.readouterr().out
        found = _strict(out)
        assert code in (0, 1) and isinstance(found, dict), (argv, out)
    capsys.readouterr()
    assert main(["--cache", url, "ls", "--json"]) == 0
    entries = {entry["key"]: entry for entry in _strict(capsys.readouterr().out)["entries"]}
    assert entries.keys() == {str(good), str(evil)}
    extra = planted.get("extra", {})
    assert len(entries[str(evil)]["extra"]) == len(extra)  # none lost to another's name
