"""A real on-device tuner: time every candidate (tile size, local size), keep the fastest.

For each tile size the kernel is built once (a tile size is a ``-DTILE=n``
build option, so another program); for each local size it is launched with
warm-up runs and then timed, and the median is kept. On PoCL the first launch
with a new local size compiles a work-group function, so tuning has a real
cost, as on a phone GPU.

Example::

    def make_kernel(tile):            # build the program for one tile size
        return build(ctx, src, [f"-DTILE={tile}"], ...).kernel_name

    def launch(kernel, tile, local):  # one launch, waited for
        kernel(queue, global_size(tile), local, *args).wait()

    result = tune(make_kernel, launch, [(1, (16, 1)), (2, (8, 4))])
    result.record  # {"tile": 2, "local_size": [8, 4], "ms": 0.41, ...}
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["DEFAULT_REPEATS", "DEFAULT_WARMUP", "TuneResult", "median_ms", "tune"]

K = TypeVar("K")
LocalSize = tuple[int, ...]

DEFAULT_WARMUP = 1
DEFAULT_REPEATS = 5


def median_ms(
    run: Callable[[], None], *, warmup: int = DEFAULT_WARMUP, repeats: int = DEFAULT_REPEATS
) -> float:
    """Call ``run`` ``warmup`` times untimed, then ``repeats`` times; the median in ms."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


@dataclass
class TuneResult(Generic[K]):
    """The best candidate as a tuning record, and the kernels built while tuning."""

    record: dict[str, Any]
    kernels: dict[int, K] = field(default_factory=dict)
    trials: list[tuple[int, LocalSize, float]] = field(default_factory=list)


def tune(
    make_kernel: Callable[[int], K],
    launch: Callable[[K, int, LocalSize], None],
    candidates: Sequence[tuple[int, LocalSize]],
    *,
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    on_trial: Callable[[], None] | None = None,
) -> TuneResult[K]:
    """Time every ``(tile, local_size)`` candidate and return the fastest as a record.

    ``make_kernel(tile)`` builds the kernel for one tile size (called once per
    tile); ``launch(kernel, tile, local_size)`` runs it once and waits. Ties go
    to the earlier candidate, so equal timings give a stable choice. The
    record holds ``tile``, ``local_size``, ``ms`` (the winner's median) and
    ``trials`` (how many candidates were timed).
    """
    if not candidates:
        raise ValueError("tune needs at least one candidate")
    result: TuneResult[K] = TuneResult(record={})
    best: tuple[float, int, LocalSize] | None = None
    for tile, local in candidates:
        kernel = result.kernels.get(tile)
        if kernel is None:
            kernel = result.kernels[tile] = make_kernel(tile)

        def run(kernel: K = kernel, tile: int = tile, local: LocalSize = local) -> None:
            launch(kernel, tile, local)

        ms = median_ms(run, warmup=warmup, repeats=repeats)
        result.trials.append((tile, tuple(local), ms))
        if best is None or ms < best[0]:
            best = (ms, tile, tuple(local))
        if on_trial is not None:
            on_trial()
    assert best is not None
    ms, tile, local = best
    result.record = {
        "tile": tile,
        "local_size": list(local),
        "ms": round(ms, 4),
        "trials": len(result.trials),
    }
    return result
