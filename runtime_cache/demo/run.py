"""One first inference, in its own process; prints one JSON object on stdout.

``python -m runtime_cache.demo.run --model cnn [--device SPEC] [--progress LABEL]``

The demo runs this twice in fresh processes (cold, then warm). The cache is
the process-wide one, so ``RUNTIME_CACHE`` chooses it. The clock starts when
this module is imported, before numpy and pyopencl are; time to first
inference ends when the output is in host memory. What follows (the numpy
check, saving binaries that the driver completed at launch) is not counted.

The JSON holds ``time_to_first_inference_s``, ``phases`` (seconds of setup,
compile, tune, load and run, which add up to it), ``output_sha256``, the
output itself, ``max_abs_error`` against the numpy reference, the layer
records and the cache counters (hits and misses of the first inference; stores, errors
and corrupt entries of the whole run, the stores after it included).
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import argparse  # noqa: E402 - the clock above starts first, on purpose
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

__all__ = ["first_inference", "main"]


def first_inference(
    model_name: str, device_spec: str | None, progress_label: str | None, started: float = _STARTED
) -> dict[str, Any]:
    """Prepare the model and run it once; return the report as a dict."""
    import numpy as np

    from .. import provider
    from ..opencl.driver_cache import driver_cache_enabled
    from ..opencl.driver_cache import prepare as prepare_driver_cache
    from .device import select_device
    from .engine import Engine
    from .model import build_model, make_weights, reference
    from .phases import Phases, Progress

    if driver_cache_enabled():
        prepare_driver_cache()  # before the driver starts, which select_device does
    phases = Phases(start=started)
    model = build_model(model_name)
    cache = provider.get_cache()
    device = select_device(device_spec)
    progress = Progress(len(model.layers), progress_label or "", enabled=bool(progress_label))
    engine = Engine(model, device, cache=cache, phases=phases, progress=progress)
    engine.prepare()
    output = engine.infer()
    seconds = phases.total()
    progress.close()
    stats = cache.stats()  # the first inference's hits and misses
    recapture_started = time.perf_counter()
    recaptured = engine.recapture()
    recapture_seconds = time.perf_counter() - recapture_started
    # Stores and failures to the end: the recapture stores the driver cache's entry, and a
    # store that failed there (a full disk) was left out of the errors the report gives.
    done = cache.stats()
    expected = reference(model, engine.input, make_weights(model))
    return {
        "model": model.name,
        "module_id": model.module_id,
        "layers": len(model.layers),
        "device": str(device.name).strip(),
        "time_to_first_inference_s": round(seconds, 6),
        "phases": {name: round(value, 6) for name, value in phases.seconds.items()},
        "tuned_layers": sum(item.tuned for item in engine.prepared),
        "records": {item.layer.symbol: item.record for item in engine.prepared},
        "output_sha256": hashlib.sha256(output.tobytes()).hexdigest(),
        "output": [[float(v) for v in row] for row in output.reshape(output.shape[0], -1)],
        "max_abs_error": float(np.max(np.abs(output.astype(np.float64) - expected))),
        "cache_stats": {
            "hits": stats.hits,
            "misses": stats.misses,
            "stores": done.stores,
            "errors": done.errors,
            "corrupt": done.corrupt,
            "last_error": cache.last_error,
        },
        "recaptured_programs": recaptured,
        "driver_cache": engine.driver_cache_report(),
        "recapture_s": round(recapture_seconds, 6),
    }


def _end_with_parent() -> None:
    """Be killed with the ``runtime-cache demo`` that started this run (Linux): killed with
    ``kill -9``, it left its run going on to the end, re-parented to init."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the run goes on to its end, as before
    if os.getppid() != parent:  # the parent died before the call: nobody is left to ask
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one first inference and print its report as JSON; the exit code."""
    _end_with_parent()
    parser = argparse.ArgumentParser(prog="python -m runtime_cache.demo.run")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--device", default=None)
    parser.add_argument("--progress", default=None, help="show a progress line with this label")
    args = parser.parse_args(argv)
    report = first_inference(args.model, args.device, args.progress)
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
