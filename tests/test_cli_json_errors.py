"""``--json`` on a command that fails: one JSON object on stdout, ``{"error", "exit_code"}``,
besides the line on stderr, with the exit code unchanged (operator review, session 40: only
``import`` printed a report; ls, stats, verify, prune and export printed nothing to parse
against a Redis that was down, or into ``/dev/full``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import runtime_cache as rc
from runtime_cache.cli import main

pytest_plugins = ["redis_servers"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main(list(argv))
    got = capsys.readouterr()
    return code, json.loads(got.out) if got.out.strip() else None, got.err


def _filled(tmp_path: Path) -> str:
    url = f"dir://{tmp_path / 'c'}"
    cache = rc.Cache(rc.open_backend(url))
    cache.put(rc.make_key(module_id="m", runtime="opencl", purpose="tuning", device={}), b"v")
    cache.close()
    return url


@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["stats"],
        ["verify"],
        ["prune", "--max-size", "1MB"],
        ["export", "EXPORT"],
        ["show", "abc"],
        ["rm", "abc"],
        ["clear", "--yes"],
    ],
)
def test_a_command_against_a_server_that_is_down_says_so_in_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: list[str]
) -> None:
    from redis_servers import free_port, require_redis

    require_redis("redis-server")
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=500ms&connect_timeout=200ms"
    argv = [str(tmp_path / "out.rcb") if part == "EXPORT" else part for part in command]
    code, report, err = _run(capsys, "--cache", url, "--secret", "s" * 32, *argv, "--json")
    assert code == 1, err
    assert report == {"error": report["error"], "exit_code": 1}
    assert "BackendUnavailableError" in report["error"] and report["error"] in err
    assert not (tmp_path / "out.rcb").exists()


def test_an_import_that_fails_prints_one_report_with_its_exit_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The store failure is said once: import's own report, not a second object after it."""
    from redis_servers import free_port, require_redis

    require_redis("redis-server")
    source = rc.Cache(rc.open_backend("memory://"), secret="s" * 32)
    source.put(rc.make_key(module_id="m", runtime="opencl", purpose="tuning", device={}), b"v")
    bundle = tmp_path / "b.rcb"
    bundle.write_bytes(source.dumps())
    url = f"redis://127.0.0.1:{free_port()}/0?timeout=500ms&connect_timeout=200ms"
    argv = ["--cache", url, "--secret", "s" * 32, "import", str(bundle), "--json"]
    code, report, _ = _run(capsys, *argv)
    assert code == 1 and report["exit_code"] == 1 and report["error"]
    assert report["accepted"] == 0 and report["in_bundle"] == 1
    code, report, _ = _run(capsys, "import", str(tmp_path / "missing.rcb"), "--json")
    assert code == 1 and report["exit_code"] == 1 and "cannot read" in report["error"]


@pytest.mark.parametrize("target", ["/dev/full", "MISSING/x.rcb"])
def test_an_export_that_cannot_write_its_file_says_so_in_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, target: str
) -> None:
    if target == "/dev/full" and not os.path.exists(target):
        pytest.skip("no /dev/full here")
    target = target.replace("MISSING", str(tmp_path / "missing"))
    url = _filled(tmp_path)
    code, report, err = _run(capsys, "--cache", url, "export", target, "--json")
    assert code == 1
    assert set(report) == {"error", "exit_code"} and report["exit_code"] == 1
    assert report["error"].startswith(f"cannot write {target}: ") and report["error"] in err


def test_failures_before_and_inside_a_command_say_so_in_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = _filled(tmp_path)
    code, report, _ = _run(capsys, "--cache", url, "show", "nosuchkey", "--json")
    assert (code, report) == (1, {"error": "no entry nosuchkey", "exit_code": 1})
    code, report, _ = _run(capsys, "--cache", url, "export", "x.rcb", "--runtime", "no", "--json")
    assert code == 1 and report["error"].startswith("no entry matches --runtime no")
    missing = tmp_path / "nothere"
    code, report, _ = _run(capsys, "--cache", f"dir://{missing}", "ls", "--json")
    assert code == 1 and report["error"].startswith(f"no cache at {missing}")
    # A usage error found after parsing: exit 2, in JSON too.
    code, report, _ = _run(capsys, "--cache", url, "prune", "--json")
    assert (code, report["exit_code"]) == (2, 2) and "--max-size" in report["error"]
    code, report, _ = _run(capsys, "--cache", "", "ls", "--json")
    assert (code, report["exit_code"]) == (2, 2)


def test_a_usage_error_the_parser_finds_is_text_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """As docs/cli.md says: argparse's own errors (exit 2) are said on stderr only."""
    code, report, err = _run(capsys, "ls", "--json", "--no-such-option")
    assert code == 2 and report is None and "unrecognized arguments" in err


def test_a_failing_export_to_standard_output_keeps_json_off_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Standard output holds the bundle there: the failure is said on stderr only."""
    url = _filled(tmp_path)
    code, report, err = _run(capsys, "--cache", url, "export", "-", "--runtime", "no", "--json")
    assert code == 1 and report is None and "no entry matches" in err


def test_a_failure_before_an_export_to_dev_stdout_keeps_json_out_of_the_bundle(
    tmp_path: Path,
) -> None:
    """The re-attack review of session 40: ``export /dev/stdout --json > FILE`` that
    failed before the command ran (no cache there) wrote its JSON error into FILE."""
    import subprocess
    import sys

    bundle = tmp_path / "out.rcb"
    for target in ("/dev/stdout", "-"):
        with bundle.open("wb") as out:
            done = subprocess.run(
                [
                    *(sys.executable, "-m", "runtime_cache"),
                    *("--cache", f"dir://{tmp_path / 'none'}", "export", target, "--json"),
                ],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )
        assert done.returncode == 1 and "no cache at" in done.stderr
        assert bundle.read_bytes() == b"", target


def test_a_value_or_bundle_sent_to_standard_output_is_alone_there(tmp_path: Path) -> None:
    """The re-attack review of session 40: `show KEY --raw /dev/stdout` printed show's table
    (or its JSON) after the value, `--raw v.out > v.out` truncated the file and wrote the
    table over the value, and `export F --json > F` sent its report into the file the
    bundle replaced (lost, exit 0)."""
    import subprocess
    import sys

    url = _filled(tmp_path)
    cache = rc.Cache(rc.open_backend(url))
    key = next(iter(cache.backend.keys()))
    value = cache.get(key)
    cache.close()

    def run(*argv: str, into: Path) -> subprocess.CompletedProcess[str]:
        with into.open("wb") as out:
            return subprocess.run(
                [sys.executable, "-m", "runtime_cache", "--cache", url, *argv],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                cwd=tmp_path,
            )

    out = tmp_path / "v.out"
    for argv in (["--raw", "/dev/stdout"], ["--raw", str(out)]):
        done = run("show", key, *argv, into=out)
        assert done.returncode == 0 and out.read_bytes() == value, (argv, done.stderr)
        done = run("show", key, *argv, "--json", into=out)
        assert done.returncode == 2 and "give one" in done.stderr, argv
    bundle = tmp_path / "same.rcb"
    done = run("export", str(bundle), "--json", into=bundle)
    assert done.returncode == 0 and '"entries"' in done.stderr  # the report, on stderr
    assert bundle.read_bytes()[:4] == rc.codec.BUNDLE_MAGIC[:4]


def test_a_successful_command_prints_its_report_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = _filled(tmp_path)
    code, report, _ = _run(capsys, "--cache", url, "stats", "--json")
    assert code == 0 and "error" not in report and report["overall"]["entries"] == 1


def test_the_demo_says_its_failure_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--tiny", "--fresh-driver-cache", "--driver-cache", "--json"]
    code, report, err = _run(capsys, *argv, "--cache", "dir:///nonexistent/x")
    assert code == 2 and report["exit_code"] == 2
    assert report["error"].startswith("--fresh-driver-cache needs") and report["error"] in err
