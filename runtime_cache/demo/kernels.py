"""OpenCL C sources of the demo model's layers, one program per layer.

Each source is specialised to its layer's shapes with ``#define`` lines, as
model compilers do, so every layer is its own program with its own compile.
``TILE`` (outputs per work item) comes in through the build options
(``-DTILE=n``), so each tile size is another build of the same source.

Every output sums its terms in one fixed order in the source whatever ``TILE`` and
the local size are. A driver may still compile each tile size's arithmetic its own way
(Intel's CPU runtime gave other last bits for other tiles), so only runs with the same tiles (a cold
run and the warm run that reads its records) are sure to match bit for bit.
"""

from __future__ import annotations

__all__ = ["conv3x3_source", "dense_source", "maxpool2_source", "softmax_source"]

_CONV3X3 = """
/* 3x3 convolution, stride 1, zero padding 1, NCHW, then bias and ReLU.
   Work item (p, g): pixel p of the batch, output channels g*TILE .. g*TILE+TILE-1. */
__kernel void conv3x3(__global const float *restrict x,
                      __global const float *restrict w,
                      __global const float *restrict bias,
                      __global float *restrict y)
{
    const int p = get_global_id(0);
    const int g = get_global_id(1);
    const int b = p / (H * W);
    const int oy = (p % (H * W)) / W;
    const int ox = p % W;
    float acc[TILE];
    for (int t = 0; t < TILE; ++t)
        acc[t] = bias[g * TILE + t];
    for (int ci = 0; ci < CIN; ++ci) {
        for (int ky = 0; ky < 3; ++ky) {
            const int iy = oy + ky - 1;
            if (iy < 0 || iy >= H)
                continue;
            for (int kx = 0; kx < 3; ++kx) {
                const int ix = ox + kx - 1;
                if (ix < 0 || ix >= W)
                    continue;
                const float v = x[((b * CIN + ci) * H + iy) * W + ix];
                for (int t = 0; t < TILE; ++t)
                    acc[t] += v * w[(((g * TILE + t) * CIN + ci) * 3 + ky) * 3 + kx];
            }
        }
    }
    for (int t = 0; t < TILE; ++t)
        y[((b * COUT + g * TILE + t) * H + oy) * W + ox] = fmax(acc[t], 0.0f);
}
"""

_MAXPOOL2 = """
/* 2x2 max pooling, stride 2, NCHW. Work item g: output elements g*TILE .. g*TILE+TILE-1. */
__kernel void maxpool2(__global const float *restrict x, __global float *restrict y)
{
    const int g = get_global_id(0);
    for (int t = 0; t < TILE; ++t) {
        const int i = g * TILE + t;
        const int ox = i % OW;
        const int oy = (i / OW) % OH;
        const int bc = i / (OW * OH);
        const int base = (bc * (2 * OH) + 2 * oy) * (2 * OW) + 2 * ox;
        const float a = fmax(x[base], x[base + 1]);
        const float c = fmax(x[base + 2 * OW], x[base + 2 * OW + 1]);
        y[i] = fmax(a, c);
    }
}
"""

_DENSE = """
/* Dense layer y = x W + bias, then ReLU when RELU is 1.
   Work item (j, b): outputs j*TILE .. j*TILE+TILE-1 of batch row b. */
__kernel void dense(__global const float *restrict x,
                    __global const float *restrict w,
                    __global const float *restrict bias,
                    __global float *restrict y)
{
    const int j = get_global_id(0);
    const int b = get_global_id(1);
    float acc[TILE];
    for (int t = 0; t < TILE; ++t)
        acc[t] = bias[j * TILE + t];
    for (int k = 0; k < K; ++k) {
        const float v = x[b * K + k];
        for (int t = 0; t < TILE; ++t)
            acc[t] += v * w[k * N + j * TILE + t];
    }
    for (int t = 0; t < TILE; ++t)
        y[b * N + j * TILE + t] = RELU ? fmax(acc[t], 0.0f) : acc[t];
}
"""

_SOFTMAX = """
/* Softmax over each row of N values. Work item b: row b. */
__kernel void softmax(__global const float *restrict x, __global float *restrict y)
{
    const int b = get_global_id(0);
    float m = x[b * N];
    for (int k = 1; k < N; ++k)
        m = fmax(m, x[b * N + k]);
    float s = 0.0f;
    for (int k = 0; k < N; ++k)
        s += exp(x[b * N + k] - m);
    for (int k = 0; k < N; ++k)
        y[b * N + k] = exp(x[b * N + k] - m) / s;
}
"""


def _defines(**values: int) -> str:
    return "".join(f"#define {name} {value}\n" for name, value in values.items())


def conv3x3_source(cin: int, cout: int, height: int, width: int) -> str:
    """The conv3x3 + bias + ReLU program for one layer's shapes."""
    return _defines(CIN=cin, COUT=cout, H=height, W=width) + _CONV3X3


def maxpool2_source(out_height: int, out_width: int) -> str:
    """The 2x2 max-pooling program for one layer's output shape."""
    return _defines(OH=out_height, OW=out_width) + _MAXPOOL2


def dense_source(k: int, n: int, relu: bool) -> str:
    """The dense (+ ReLU) program for a ``k`` to ``n`` layer."""
    return _defines(K=k, N=n, RELU=int(relu)) + _DENSE


def softmax_source(n: int) -> str:
    """The row-wise softmax program for rows of ``n`` values."""
    return _defines(N=n) + _SOFTMAX
