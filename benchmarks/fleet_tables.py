"""Markdown tables of a fleet's cold starts: ``bench_fleet.py`` and ``bench_unstored.py``."""

from __future__ import annotations

from collections.abc import Sequence

from tables import Run, grid


def fleet(runs: Sequence[Run]) -> str:
    """``bench_fleet.py``: wall time, source builds, compile and process CPU per scenario."""
    out = []
    for run in runs:
        meta = run["meta"]
        rows = [
            [
                name,
                row.get("procs"),
                row.get("workers"),
                f"{float(row.get('wall_seconds') or 0):.2f}",
                row.get("source_builds"),
                row.get("binary_loads"),
                f"{float(row.get('compile_seconds') or 0):.1f}",
                f"{float(row.get('cpu_seconds') or 0):.1f}",
                row.get("driver_files_restored", "-"),
                row.get("takeovers"),
            ]
            for name, row in dict(run["results"]).items()
        ]
        head = [
            "scenario",
            "processes",
            "workers or cores",
            "wall until all ready (s)",
            "source builds",
            "binary loads",
            "compile CPU (s, summed)",
            "process CPU (s, summed)",
            "driver files restored",
            "takeovers",
        ]
        title = f"`{run['_file']}`: {meta.get('n')} kernels on {meta.get('device')}"
        out.append(title + "\n\n" + grid(head, rows))
    return "\n\n".join(out)


def unstored(runs: Sequence[Run]) -> str:
    """``bench_unstored.py``: when the last of N processes returned, with the holder's note
    and without it, on an entry the store refuses."""
    out = []
    for run in runs:
        rows = [
            [
                side,
                f"{float(row['wall_seconds_median']):.2f}",
                len(row["rounds"]),
                row["rounds"][0]["builds"],
                row["rounds"][0]["unshared_builds"],
            ]
            for side, row in dict(run["sides"]).items()
        ]
        head = [
            "store, holder's note",
            "last process returned (s, median)",
            "rounds",
            "builds",
            "builds without the lease",
        ]
        what = f"{run['procs']} processes, one {run['build_seconds']:g} s build of a value"
        title = (
            f"`{run['_file']}`: {what} the store refuses. With the holder's note (on) the"
            " waiters build side by side once the first build is done; off makes the note"
            " run out at once, so they take the lease over one after another."
        )
        out.append(title + "\n\n" + grid(head, rows))
    return "\n\n".join(out)
