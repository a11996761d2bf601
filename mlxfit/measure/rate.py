"""Quick measured rates of this machine, on MLX's default device, in a model's dtype:
how many operations per second a matrix product runs at (a quantized product for a
quantized base), how many bytes per second a large elementwise operation moves, how
many exps per second it computes, what one tiny operation costs, and what one
operation of mlx-lm's decoding loop costs (GRPO's rollout). Each takes a fraction of a second and a few MB; `machine_rates` measures
them once per machine (CPU, backend, MLX version, dtype) and keeps them in mlxfit's
cache."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

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


# A minimal Llama for timing mlx-lm's decoding loop: its step is almost all dispatched operations.
DECODE_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": False}
DECODE_WARMUP = 4
DECODE_STEPS = 16
DECODE_RUNS = 5


def decode_config(dtype: str) -> dict:
    return {**DECODE_CONFIG, "torch_dtype": dtype}


def decode_step_seconds(dtype: str = "bfloat16") -> float:
    """Seconds one decoding step of mlx-lm's BatchGenerator takes, as GRPO's rollout
    runs it (mlx_lm_lora generate_grpo: GRPO's sampler; one row here), on the minimal
    Llama: the mean step of a run of DECODE_STEPS, the best of DECODE_RUNS runs (as a
    measured training step is the fastest of a few, each many decoding steps long)."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_sampler

    from ..model.preference import GRPO_SAMPLING
    from .build import materialize, random_model

    model = random_model(decode_config(dtype), _kind(dtype))
    materialize(model)
    model.eval()
    sampler = make_sampler(GRPO_SAMPLING["temperature"], top_p=GRPO_SAMPLING["top_p"], top_k=GRPO_SAMPLING["top_k"])
    best = float("inf")
    for _ in range(DECODE_RUNS):
        generator = BatchGenerator(model, stop_tokens=None, sampler=sampler, completion_batch_size=1,
                                   prefill_batch_size=1)
        try:
            generator.insert([[1]], [DECODE_WARMUP + DECODE_STEPS + 1])
            for _ in range(DECODE_WARMUP):
                generator.next_generated()
            tic = time.perf_counter()
            for _ in range(DECODE_STEPS):
                generator.next_generated()
            best = min(best, (time.perf_counter() - tic) / DECODE_STEPS)
        finally:
            generator.close()
    return best


def decode_op_seconds(step_seconds: float, work_seconds: float, operations: int) -> float:
    """Seconds one operation of a decoding step costs: the step's time less its products
    and passes, over its operations (mlx-lm's loop around them, next(), the wait for the
    token, its tolist, spread over them). Never below zero (a busy moment)."""
    return max(step_seconds - work_seconds, 0.0) / operations


def measured_decode_op(dtype: str, rates: "MachineRates") -> float:
    """decode_op_seconds measured now on the minimal Llama, its products and passes at
    `rates` (this machine's), its operations counted as step_work.decode_ops."""
    from ..estimate.step_time import decode_work_seconds, measured_speed
    from ..estimate.step_work import decode_ops
    from ..model.resolve import from_config

    model = from_config("decode step", decode_config(dtype))
    return decode_op_seconds(decode_step_seconds(dtype), decode_work_seconds(model, measured_speed(rates)),
                             decode_ops(model))


@dataclass(frozen=True)
class MachineRates:
    """This machine's rates for one dtype (and bits, for a quantized product)."""

    matmul: float  # operations per second
    elementwise: float  # bytes per second
    transcendental: float  # exps per second
    operation: float  # seconds per tiny operation
    softmax: float | None = None  # attention scores per second (None: measured before it was, at the exp rate)
    decode_op: float | None = None  # seconds per operation of a decoding step (None: not measured)

    def to_dict(self) -> dict:
        return asdict(self)


def measure_rates(dtype: str = "bfloat16", bits: int | None = None, group_size: int = 64) -> MachineRates:
    """All of them, measured now (the decoding loop's last: its counted work is taken at the others)."""
    rates = MachineRates(matmul_rate(dtype, bits, group_size), elementwise_rate(dtype), transcendental_rate(dtype),
                         operation_seconds(), softmax_rate(dtype))
    return replace(rates, decode_op=measured_decode_op(dtype, rates))


def machine_key(dtype: str, bits: int | None = None, group_size: int = 64) -> str:
    """What the rates depend on: the processor, MLX's device and version, the dtype."""
    import platform

    import mlx.core as mx

    return "|".join([_processor() or platform.machine(), str(mx.default_device()), mx.__version__, dtype,
                     f"{bits}-bit/{group_size}" if bits else "float", "decode"])  # rates stored before the decoding loop's: again


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
