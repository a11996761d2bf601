"""Quick measured rates of this machine, on MLX's default device, in a model's dtype:
how many operations per second a matrix product runs at (a quantized product for a
quantized base), how many bytes per second a large elementwise operation moves, how
many exps and square roots per second it computes, how many logits per second mlx-lm's
training loss runs through, and what one tiny operation costs.
Each takes a fraction of a second and a few MB; `machine_rates` measures them once per machine
(CPU, backend, MLX version, dtype) and keeps them in mlxfit's cache. What an operation
of mlx-lm's decoding loop costs is measured apart, for GRPO alone (decode_rate.py)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

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
            # One timing caught a busy moment of a shared machine 4 times slow; the best of three does not.
            return 2 * n**3 / min(seconds, _best_seconds(run))
        if n >= MAX_SIZE:  # a fast device: repeat the largest product until it takes long enough
            repeats = max(1, int(MIN_SECONDS / max(seconds, 1e-6)))
            tic = time.perf_counter()
            for _ in range(repeats):
                mx.eval(run())
            return 2 * n**3 * repeats / max(time.perf_counter() - tic, 1e-9)
        n *= 2


ELEMENTS = 1 << 22  # of the elementwise and exp runs: 16 MB in float32, past the caches
CHAIN = 200  # tiny operations in a chain


def _kind(dtype: str):
    import mlx.core as mx

    return {"float32": mx.float32, "float16": mx.float16}.get(dtype, mx.bfloat16)


def _best_seconds(run, repeats: int = 3) -> float:
    import mlx.core as mx

    mx.eval(run())  # warm-up
    best = float("inf")
    for _ in range(repeats):
        tic = time.perf_counter()
        mx.eval(run())
        best = min(best, time.perf_counter() - tic)
    return max(best, 1e-9)


def elementwise_rate(dtype: str = "bfloat16") -> float:
    """Bytes per second an elementwise add moves (reads one array, writes one)."""
    import mlx.core as mx

    x = mx.random.normal((ELEMENTS,)).astype(_kind(dtype))
    mx.eval(x)
    return 2 * ELEMENTS * x.itemsize / _best_seconds(lambda: x + 1)


def transcendental_rate(dtype: str = "bfloat16", elements: int = ELEMENTS // 8) -> float:
    """Elements per second mx.exp computes."""
    import mlx.core as mx

    x = mx.random.normal((elements,)).astype(_kind(dtype))
    mx.eval(x)
    return elements / _best_seconds(lambda: mx.exp(x))


def root_rate(dtype: str = "bfloat16", elements: int = ELEMENTS // 2) -> float:
    """Square roots per second (Adam's, one per trainable element): on MLX's CPU some 15
    times an exp's rate, so not timed as one."""
    import mlx.core as mx

    x = mx.random.uniform(shape=(elements,)).astype(_kind(dtype))
    mx.eval(x)
    return elements / _best_seconds(lambda: mx.sqrt(x))


LOSS_SHAPE = (4, 256, 4096)  # rows, tokens, vocabulary: 4M logits, past the caches as a step's are


def loss_rate(dtype: str = "bfloat16") -> float:
    """Logits per second of mlx-lm's training loss (mlx_lm.tuner.trainer.default_loss: the
    cross-entropy's log-sum-exp, its gather, the mask) forward and backward, over logits in
    the model's dtype. Counted as two exps and eight passes a logit it reads 20-60% fast on
    MLX's CPU (the max, the shift, the softmax of the backward and the scattered target are
    passes of their own); on tiny models with a large vocabulary it is most of a step."""
    import mlx.core as mx

    rows, tokens, vocab = LOSS_SHAPE
    logits = mx.random.normal(LOSS_SHAPE).astype(_kind(dtype))
    targets = mx.random.randint(0, vocab, (rows, tokens))
    lengths = mx.array([[0, tokens]] * rows)
    mx.eval(logits, targets, lengths)
    step = mx.value_and_grad(lambda x: training_loss(x, targets, lengths))
    return logits.size / _best_seconds(lambda: step(logits))


def training_loss(logits, targets, lengths):
    """mlx_lm.tuner.trainer.default_loss past its model call, over given logits (importing
    mlx-lm's trainer imports transformers, which an estimate never loads; a test pins this
    copy's value and gradient to the real function's)."""
    import mlx.core as mx
    import mlx.nn as nn

    steps = mx.arange(1, targets.shape[1] + 1)
    mask = mx.logical_and(steps >= lengths[:, 0:1], steps <= lengths[:, 1:])
    ce = nn.losses.cross_entropy(logits, targets) * mask
    return ce.astype(mx.float32).sum() / mask.sum()


SOFTMAX_ROW = 256  # a row of attention scores


def softmax_rate(dtype: str = "bfloat16", elements: int = ELEMENTS // 8) -> float:
    """Elements per second of a precise softmax over rows of scores, as the attention of
    MLX's CPU fallback (mx.fast.scaled_dot_product_attention) runs it: in half precision
    each element is converted to float32 and back around its exp, about twice an exp's
    time here; in float32 about one exp."""
    import mlx.core as mx

    x = mx.random.normal((elements // SOFTMAX_ROW, SOFTMAX_ROW)).astype(_kind(dtype))
    mx.eval(x)
    return elements // SOFTMAX_ROW * SOFTMAX_ROW / _best_seconds(lambda: mx.softmax(x, axis=-1, precise=True))


def operation_seconds() -> float:
    """Seconds one tiny operation costs in a chain evaluated at once (dispatch, not work)."""
    import mlx.core as mx

    x = mx.ones((8,))
    mx.eval(x)

    def chain():
        y = x
        for _ in range(CHAIN):
            y = y + 1
        return y

    return _best_seconds(chain) / CHAIN


@dataclass(frozen=True)
class MachineRates:
    """This machine's rates for one dtype (and bits, for a quantized product)."""

    matmul: float  # operations per second
    elementwise: float  # bytes per second
    transcendental: float  # exps per second
    operation: float  # seconds per tiny operation
    softmax: float | None = None  # attention scores per second (None: measured before it was, at the exp rate)
    decode_op: float | None = None  # seconds per operation of a decoding step (None: not asked, decode_rate.py)
    root: float | None = None  # square roots per second (None: measured before it was, in the traffic)
    loss: float | None = None  # logits per second of the training loss (None: measured before it was, counted)

    def to_dict(self) -> dict:
        return asdict(self)


def measure_rates(dtype: str = "bfloat16", bits: int | None = None, group_size: int = 64) -> MachineRates:
    """All seven, measured now (the decoding loop's apart: measure/decode_rate.py, for GRPO alone)."""
    return MachineRates(matmul_rate(dtype, bits, group_size), elementwise_rate(dtype), transcendental_rate(dtype),
                        operation_seconds(), softmax_rate(dtype), root=root_rate(dtype), loss=loss_rate(dtype))


def machine_key(dtype: str, bits: int | None = None, group_size: int = 64) -> str:
    """What the rates depend on: the processor, MLX's device and version, the dtype."""
    import platform

    import mlx.core as mx

    return "|".join([_processor() or platform.machine(), str(mx.default_device()), mx.__version__, dtype,
                     f"{bits}-bit/{group_size}" if bits else "float", "loss"])  # rates stored before the loss's: again


def _processor() -> str:
    import platform
    import subprocess

    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=2).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor()


def machine_rates(dtype: str = "bfloat16", bits: int | None = None, group_size: int = 64) -> MachineRates:
    """This machine's rates, measured the first time and read from mlxfit's cache after."""
    from ..cache import remembered

    stored = remembered("machine_rates", machine_key(dtype, bits, group_size),
                        lambda: measure_rates(dtype, bits, group_size).to_dict())
    return MachineRates(**stored)
