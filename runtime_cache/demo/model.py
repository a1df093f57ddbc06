"""The demo model: a small CNN whose layers are subgraphs with their own OpenCL kernels.

The default model has 12 layers (five 3x3 convolutions with bias and ReLU,
three 2x2 max-poolings, three dense layers, softmax) on a batch of two 3x32x32
images. The tiny model, for tests, has 5 layers on one 3x8x8 image. Weights
and inputs come from a seeded numpy RNG, so every run computes the same thing;
:func:`reference` computes it again in numpy (float64) for checking.

This module describes the model; :mod:`runtime_cache.demo.engine` runs it.
Layer descriptions need no numpy; weights and the reference do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..keys import module_id_from_sources
from . import kernels

if TYPE_CHECKING:
    import numpy as np

__all__ = ["MODELS", "Layer", "Model", "build_model", "make_input", "make_weights", "reference"]

Shape = tuple[int, ...]
LocalSize = tuple[int, ...]


@dataclass(frozen=True)
class Layer:
    """One subgraph: one kernel, its shapes, and its tuning space.

    ``in_shape`` and ``out_shape`` include the batch. ``tiles`` are the tile
    sizes to try (outputs per work item); ``local_sizes`` the work-group shapes
    to try, filtered per tile so that each divides the global size.
    """

    symbol: str
    kind: str
    in_shape: Shape
    out_shape: Shape
    tiles: tuple[int, ...] = (1,)
    local_sizes: tuple[LocalSize, ...] = ((1,),)
    relu: bool = True

    @property
    def kernel_name(self) -> str:
        """The kernel function's name in :attr:`source`."""
        return self.kind

    @property
    def source(self) -> str:
        """This layer's OpenCL C program, specialised to its shapes."""
        if self.kind == "conv3x3":
            _, cin, h, w = self.in_shape
            return kernels.conv3x3_source(cin, self.out_shape[1], h, w)
        if self.kind == "maxpool2":
            return kernels.maxpool2_source(self.out_shape[2], self.out_shape[3])
        if self.kind == "dense":
            return kernels.dense_source(self.in_shape[1], self.out_shape[1], self.relu)
        if self.kind == "softmax":
            return kernels.softmax_source(self.in_shape[1])
        raise ValueError(f"unknown layer kind {self.kind!r}")

    @property
    def weight_shapes(self) -> tuple[Shape, Shape] | None:
        """The shapes of (weights, bias), or ``None`` for a layer without weights."""
        if self.kind == "conv3x3":
            cout, cin = self.out_shape[1], self.in_shape[1]
            return (cout, cin, 3, 3), (cout,)
        if self.kind == "dense":
            return (self.in_shape[1], self.out_shape[1]), (self.out_shape[1],)
        return None

    def global_size(self, tile: int) -> Shape:
        """The NDRange for ``tile`` outputs per work item."""
        batch = self.out_shape[0]
        if self.kind == "conv3x3":
            _, cout, h, w = self.out_shape
            return (batch * h * w, cout // tile)
        if self.kind == "dense":
            return (self.out_shape[1] // tile, batch)
        if self.kind == "maxpool2":
            return (math.prod(self.out_shape) // tile,)
        return (batch,)

    def candidates(self, max_work_group_size: int) -> list[tuple[int, LocalSize]]:
        """Every (tile, local size) pair to try on a device."""
        found: list[tuple[int, LocalSize]] = []
        for tile in self.tiles:
            units = (
                self.out_shape[1] if self.weight_shapes is not None else math.prod(self.out_shape)
            )
            if units % tile:
                continue
            size = self.global_size(tile)
            for local in self.local_sizes:
                fits = len(local) == len(size) and all(
                    g % n == 0 for g, n in zip(size, local, strict=False)
                )
                if fits and math.prod(local) <= max_work_group_size:
                    found.append((tile, local))
        return found or [(1, tuple(1 for _ in self.global_size(1)))]


@dataclass(frozen=True)
class Model:
    """A named stack of layers with its input shape and RNG seed."""

    name: str
    input_shape: Shape
    layers: tuple[Layer, ...]
    seed: int = 0
    module_id: str = field(default="", compare=False)

    @property
    def output_shape(self) -> Shape:
        """The shape of the model's output."""
        return self.layers[-1].out_shape


_CONV_LOCALS: tuple[LocalSize, ...] = ((16, 1), (64, 1), (8, 4), (32, 2))
_DENSE_LOCALS: tuple[LocalSize, ...] = ((2, 1), (5, 1), (8, 1), (32, 1))
_POOL_LOCALS: tuple[LocalSize, ...] = ((16,), (64,), (128,))


def _stack(
    batch: int, channels: int, size: int, plan: Sequence[Any], tiles: tuple[int, ...]
) -> list[Layer]:
    """Lay out layers from a plan of steps.

    A step is ``("conv", cout)``, ``("pool",)``, ``("dense", n, relu)`` or ``("softmax",)``.
    """
    layers: list[Layer] = []
    shape: Shape = (batch, channels, size, size)
    for index, step in enumerate(plan, 1):
        kind = step[0]
        if kind == "conv":
            out: Shape = (batch, step[1], shape[2], shape[3])
            layer = Layer(f"{index:02d}_conv3x3", "conv3x3", shape, out, tiles, _CONV_LOCALS)
        elif kind == "pool":
            out = (batch, shape[1], shape[2] // 2, shape[3] // 2)
            layer = Layer(f"{index:02d}_maxpool2", "maxpool2", shape, out, tiles[:2], _POOL_LOCALS)
        elif kind == "dense":
            flat: Shape = (batch, math.prod(shape[1:]))
            out = (batch, step[1])
            layer = Layer(f"{index:02d}_dense", "dense", flat, out, tiles, _DENSE_LOCALS, step[2])
        elif kind == "softmax":
            out = shape
            layer = Layer(f"{index:02d}_softmax", "softmax", shape, out, (1,), ((1,), (2,)))
        else:
            raise ValueError(f"unknown plan step {step!r}")
        layers.append(layer)
        shape = out
    return layers


#: The models the demo offers: name -> (batch, channels, size, plan, tiles).
MODELS: dict[str, tuple[int, int, int, tuple[Any, ...], tuple[int, ...]]] = {
    "cnn": (
        2,
        3,
        32,
        (
            ("conv", 16),
            ("conv", 16),
            ("pool",),
            ("conv", 32),
            ("conv", 32),
            ("pool",),
            ("conv", 64),
            ("pool",),
            ("dense", 128, True),
            ("dense", 64, True),
            ("dense", 10, False),
            ("softmax",),
        ),
        (1, 2, 4, 8),
    ),
    "tiny": (
        1,
        3,
        8,
        (("conv", 4), ("pool",), ("dense", 16, True), ("dense", 10, False), ("softmax",)),
        (1, 2),
    ),
}


def build_model(name: str = "cnn", seed: int = 0) -> Model:
    """Describe the model ``name`` (one of :data:`MODELS`); its module id hashes its sources."""
    if name not in MODELS:
        raise ValueError(f"unknown demo model {name!r}; choose one of {', '.join(MODELS)}")
    batch, channels, size, plan, tiles = MODELS[name]
    layers = tuple(_stack(batch, channels, size, plan, tiles))
    sources = {layer.symbol: layer.source for layer in layers}
    # The input shape too: the batch is not in the sources, but launch shapes depend on it.
    sources["input_shape"] = "x".join(map(str, (batch, channels, size, size)))
    module_id = module_id_from_sources(sources, name=f"demo-{name}")
    return Model(name, (batch, channels, size, size), layers, seed, module_id)


def make_weights(model: Model) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded He-scaled weights and small biases, float32, per layer symbol."""
    import numpy as np

    rng = np.random.default_rng(model.seed)
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for layer in model.layers:
        shapes = layer.weight_shapes
        if shapes is None:
            continue
        w_shape, b_shape = shapes
        fan_in = math.prod(w_shape[1:]) if layer.kind == "conv3x3" else w_shape[0]
        w = rng.standard_normal(w_shape) * math.sqrt(2.0 / fan_in)
        b = rng.standard_normal(b_shape) * 0.05
        weights[layer.symbol] = (w.astype(np.float32), b.astype(np.float32))
    return weights


def make_input(model: Model) -> np.ndarray:
    """The seeded input batch, float32 in [0, 1)."""
    import numpy as np

    rng = np.random.default_rng(model.seed + 1)
    return rng.random(model.input_shape, dtype=np.float32)


def _conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    import numpy as np

    batch, cin, h, wd = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((batch, cin, 3, 3, h, wd), dtype=x.dtype)
    for ky in range(3):
        for kx in range(3):
            cols[:, :, ky, kx] = padded[:, :, ky : ky + h, kx : kx + wd]
    out = np.einsum("bckluv,ockl->bouv", cols, w, optimize=True)
    return np.asarray(np.maximum(out + b[None, :, None, None], 0.0))


def reference(
    model: Model, x: np.ndarray, weights: dict[str, tuple[np.ndarray, np.ndarray]]
) -> np.ndarray:
    """The model's output computed in numpy, in float64."""
    import numpy as np

    a = x.astype(np.float64)
    for layer in model.layers:
        if layer.kind == "conv3x3":
            w, b = weights[layer.symbol]
            a = _conv3x3(a, w.astype(np.float64), b.astype(np.float64))
        elif layer.kind == "maxpool2":
            n, c, h, wd = a.shape
            a = a.reshape(n, c, h // 2, 2, wd // 2, 2).max(axis=(3, 5))
        elif layer.kind == "dense":
            w, b = weights[layer.symbol]
            a = a.reshape(a.shape[0], -1) @ w.astype(np.float64) + b.astype(np.float64)
            if layer.relu:
                a = np.maximum(a, 0.0)
        elif layer.kind == "softmax":
            e = np.exp(a - a.max(axis=1, keepdims=True))
            a = e / e.sum(axis=1, keepdims=True)
    return a
