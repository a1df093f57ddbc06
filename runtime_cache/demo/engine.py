"""Runs the demo model on an OpenCL device: tune or load each layer, then infer.

For each layer (subgraph) the engine asks the :class:`~runtime_cache.tuning.TuningCache`
for its record. On a miss it tunes the layer on the device
(:func:`runtime_cache.demo.tuner.tune`), building one program per tile size;
on a hit it builds only the program of the recorded tile size. Every program
goes through the OpenCL consumer, so on a warm start the binaries come from
the cache too. The time of each step is charged to a phase of
:class:`~runtime_cache.demo.phases.Phases`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..cache import Cache
from ..opencl.driver_cache import DriverCaches, driver_cache_enabled
from ..tuning import TuningCache
from . import device as devices
from .model import Layer, Model, make_input, make_weights
from .phases import Phases, Progress
from .tuner import tune

if TYPE_CHECKING:
    import numpy as np

__all__ = ["RUNTIME", "Engine", "Prepared"]

#: The runtime name of the demo's tuning records.
RUNTIME = "opencl"


@dataclass
class Prepared:
    """One layer ready to run: its kernel, record, and whether it was tuned in this process."""

    layer: Layer
    program: Any
    kernel: Any
    record: dict[str, Any]
    tuned: bool


class Engine:
    """The model on one device: buffers, tuned kernels, and a forward pass.

    Args:
        model: the model to run.
        device: a ``pyopencl.Device``.
        cache: where program binaries and tuning records live.
        phases: the clock to charge time to.
        progress: a progress line to advance per layer (optional).
    """

    def __init__(
        self,
        model: Model,
        device: Any,
        *,
        cache: Cache,
        phases: Phases,
        progress: Progress | None = None,
    ) -> None:
        import numpy as np
        import pyopencl as cl

        self.model = model
        self.cache = cache
        self.phases = phases
        self.progress = progress
        self._cl = cl
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context)
        self.max_work_group = int(device.max_work_group_size)
        self.tuning = TuningCache(
            model.module_id, RUNTIME, devices.fingerprint(device), cache=cache
        )
        flags = cl.mem_flags
        self.input = make_input(model)
        self._activations = [cl.Buffer(self.context, flags.READ_WRITE, self.input.nbytes)]
        for layer in model.layers:
            size = int(np.prod(layer.out_shape)) * 4
            self._activations.append(cl.Buffer(self.context, flags.READ_WRITE, size))
        self._weights: dict[str, tuple[Any, Any]] = {}
        for symbol, (w, b) in make_weights(model).items():
            self._weights[symbol] = (
                cl.Buffer(self.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=w),
                cl.Buffer(self.context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=b),
            )
        self.prepared: list[Prepared] = []
        # The driver's own JIT cache travels through the cache too (RUNTIME_CACHE_DRIVER_CACHE=1),
        # in folders the demo made for this run: their files are the model's, also NVIDIA's
        # (one set per device elsewhere), so the demo lists and removes them with its own.
        self.driver: DriverCaches | None = None
        if driver_cache_enabled():
            self.driver = DriverCaches(self.context, model.module_id, own_folder=True)
        self._driver_stored = 0

    # ------------------------------------------------------------------ programs
    def build_kernel(self, layer: Layer, tile: int) -> tuple[Any, Any]:
        """Build ``layer``'s program for ``tile`` through the cache; return (program, kernel).

        The time counts as ``load`` when the binaries came from the cache and
        as ``compile`` when the driver compiled the source.
        """
        before = self.cache.stats()
        with self.phases.open("compile") as phase:
            program = devices.build(
                self.context,
                layer.source,
                [f"-DTILE={tile}"],
                module_id=self.model.module_id,
                cache=self.cache,
            )
            after = self.cache.stats()
            compiled = after.misses > before.misses or after.stores > before.stores
            phase.name = "compile" if compiled else "load"
            return program, self._cl.Kernel(program, layer.kernel_name)

    def _args(self, index: int) -> list[Any]:
        layer = self.model.layers[index]
        args = [self._activations[index]]
        if layer.symbol in self._weights:
            args.extend(self._weights[layer.symbol])
        args.append(self._activations[index + 1])
        return args

    def _launch(self, index: int, kernel: Any, tile: int, local: tuple[int, ...]) -> Any:
        layer = self.model.layers[index]
        return kernel(self.queue, layer.global_size(tile), local, *self._args(index))

    # ------------------------------------------------------------------ tuning
    def _tune(self, index: int, kernels: dict[int, Any]) -> dict[str, Any]:
        layer = self.model.layers[index]
        candidates = layer.candidates(self.max_work_group)
        done = [0]

        def trial_done() -> None:
            done[0] += 1
            if self.progress is not None:
                self.progress.show(f"tune {layer.symbol} {done[0]}/{len(candidates)}")

        with self.phases.open("tune"):
            result = tune(
                lambda tile: self.build_kernel(layer, tile),
                lambda built, tile, local: self._launch(index, built[1], tile, local).wait(),
                candidates,
                on_trial=trial_done,
            )
        kernels.update(result.kernels)
        return result.record

    def _valid(self, layer: Layer, record: dict[str, Any]) -> bool:
        tile, local = record.get("tile"), record.get("local_size")
        if not isinstance(tile, int) or not isinstance(local, list):
            return False
        return (tile, tuple(local)) in layer.candidates(self.max_work_group)

    def prepare(self) -> list[Prepared]:
        """Get every layer's tuning record (tuning on a miss) and its kernel."""
        self.prepared = []
        if self.driver is not None:
            with self.phases.open("load"):
                self.driver.restore(self.cache)
        for index, layer in enumerate(self.model.layers):
            kernels: dict[int, Any] = {}
            if self.progress is not None:
                self.progress.show(f"load {layer.symbol}")
            retune = functools.partial(self._tune, index, kernels)
            with self.phases.open("load"):
                record = self.tuning.get_or_tune(layer.symbol, retune)
            if not self._valid(layer, record):
                # A record this layer cannot use (edited, or from an older model): re-tune.
                with self.phases.open("load"):
                    self.tuning.delete(layer.symbol)
                    record = self.tuning.get_or_tune(layer.symbol, retune)
            tile = int(record["tile"])
            built = kernels.get(tile)
            tuned = bool(kernels)
            if built is None:
                built = self.build_kernel(layer, tile)
            self.prepared.append(Prepared(layer, built[0], built[1], record, tuned))
            if self.progress is not None:
                self.progress.step(f"{'tuned' if tuned else 'loaded'} {layer.symbol}")
        return self.prepared

    # ------------------------------------------------------------------ inference
    def infer(self) -> np.ndarray:
        """Run the model once on its seeded input; return the output on the host."""
        import numpy as np

        cl = self._cl
        with self.phases.open("run"):
            cl.enqueue_copy(self.queue, self._activations[0], self.input)
            for index, item in enumerate(self.prepared):
                local = tuple(int(n) for n in item.record["local_size"])
                self._launch(index, item.kernel, int(item.record["tile"]), local)
            out = np.empty(self.model.output_shape, dtype=np.float32)
            cl.enqueue_copy(self.queue, out, self._activations[-1])
            self.queue.finish()
        return out

    def recapture(self) -> int:
        """Store again the binaries the driver completed at first launch; how many changed.

        Some drivers finish a program only at its first launch and return the
        final code in its binary from then on; storing it again lets the next
        process skip that step too. PoCL's binaries do not change (its
        per-work-group-size code is not part of them), so there this is 0.
        """
        from ..opencl import recapture_binaries

        if self.driver is not None:  # PoCL's code for each work-group size exists by now
            self._driver_stored += self.driver.capture(settle=True)
        return sum(recapture_binaries(item.program) for item in self.prepared)

    def driver_cache_report(self) -> dict[str, Any] | None:
        """Files restored into the driver's folder and sets stored, or None when not carried."""
        if self.driver is None:
            return None
        sessions = self.driver.sessions or []
        return {
            "restored_files": sum(s.restored for s in sessions),
            "stored": self._driver_stored,
            "carried": any(s.active for s in sessions),
        }
