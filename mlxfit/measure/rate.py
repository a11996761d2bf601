"""A quick measured rate of this machine: how many operations per second a matrix
product runs at in a model's dtype (a quantized product for a quantized base),
on MLX's default device. Takes a fraction of a second, allocates a few MB."""

from __future__ import annotations

import time

SIZE = 256  # rows and columns of the first product; grown until one run takes long enough
MIN_SECONDS = 0.05
MAX_SIZE = 2048


def matmul_rate(dtype: str = "bfloat16", bits: int | None = None, group_size: int = 64) -> float:
    """Operations per second (2 n^3 per n x n product) measured now."""
    import mlx.core as mx

    kind = {"float32": mx.float32, "float16": mx.float16}.get(dtype, mx.bfloat16)
    n = SIZE
    while True:
        x = mx.random.normal((n, n)).astype(kind)
        w = mx.random.normal((n, n)).astype(kind)
        if bits:
            packed = mx.quantize(w, group_size=group_size, bits=bits)

            def run():
                return mx.quantized_matmul(x, *packed, transpose=True, group_size=group_size, bits=bits)
        else:
            def run():
                return x @ w
        mx.eval(x, w, run())  # warm-up
        tic = time.perf_counter()
        mx.eval(run())
        seconds = time.perf_counter() - tic
        if seconds >= MIN_SECONDS:
            return 2 * n**3 / seconds
        if n >= MAX_SIZE:  # a fast device: repeat the largest product until it takes long enough
            repeats = max(1, int(MIN_SECONDS / max(seconds, 1e-6)))
            tic = time.perf_counter()
            for _ in range(repeats):
                mx.eval(run())
            return 2 * n**3 * repeats / max(time.perf_counter() - tic, 1e-9)
        n *= 2
