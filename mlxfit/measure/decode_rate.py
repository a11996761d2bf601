"""What one operation of mlx-lm's decoding loop costs on this machine: GRPO's rollout
(mlx_lm_lora generate_grpo) decodes with mlx-lm's BatchGenerator, whose steps wait on
the loop around their operations (the next token sampled, evaluated and read back)
more than on their work. Measured only where a GRPO run is timed, once per machine and
dtype, and kept in mlxfit's cache beside the other rates (rate.py).

The loop is timed with the pieces mlx-lm's GenerationBatch._step runs (mlx-lm's model,
its BatchKVCache, its sampler, the same evaluation order), not through mlx_lm.generate,
which imports transformers: an estimate never loads it (tests/test_decode_rate.py pins
the step against mlx-lm's, operation for operation)."""

from __future__ import annotations

import time

# A minimal Llama: its decoding step is almost all dispatched operations.
DECODE_CONFIG = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 256, "rms_norm_eps": 1e-5,
                 "tie_word_embeddings": False}
DECODE_WARMUP = 4
DECODE_STEPS = 16
DECODE_RUNS = 5


def decode_config(dtype: str) -> dict:
    return {**DECODE_CONFIG, "torch_dtype": dtype}


def grpo_sampler():
    """mlx-lm's sampler with GRPO's sampling settings (mlx_lm_lora generate_grpo's make_sampler call)."""
    from ..model.mlx_lm_modules import import_module
    from ..model.preference import GRPO_SAMPLING

    make_sampler = import_module("sample_utils").make_sampler
    return make_sampler(GRPO_SAMPLING["temperature"], top_p=GRPO_SAMPLING["top_p"], top_k=GRPO_SAMPLING["top_k"])


def batch_cache(model) -> list:
    """The cache a BatchGenerator's rows decode into: each layer's KVCache merged into a
    BatchKVCache (mlx_lm/generate.py _merge_caches), one row here."""
    from ..model.mlx_lm_modules import import_module

    return [layer.merge([layer]) for layer in import_module("models.cache").make_prompt_cache(model)]


def decoding_step(model, cache, sampler, tokens):
    """The arrays one decoding step computes, as GenerationBatch._step: the model over
    the rows' last tokens into the cache, the log-probabilities, the sampled tokens."""
    import mlx.core as mx

    logits = model(tokens[:, None], cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return sampler(logprobs), logprobs


class DecodingLoop:
    """GenerationBatch's loop (one shared sampler, no logits processors, as GRPO's): each
    step starts the next token's computation, then waits for the current one and reads it."""

    def __init__(self, model, sampler, first_tokens):
        self.model, self.sampler, self.cache = model, sampler, batch_cache(model)
        self.next_tokens, self.next_logprobs = first_tokens, []
        self.step()  # GenerationBatch steps once as it starts

    def step(self) -> list:
        import mlx.core as mx

        inputs, logprobs = self.next_tokens, self.next_logprobs
        sampled, new_logprobs = decoding_step(self.model, self.cache, self.sampler, inputs)
        self.next_tokens, self.next_logprobs = sampled, list(new_logprobs)
        mx.async_eval(self.next_tokens, self.next_logprobs, [])
        mx.eval(inputs, logprobs)
        return inputs.tolist()


def minimal_model(dtype: str):
    """The minimal Llama, built as mlx-lm's loader builds it (model/lazy_model.py), evaluated."""
    import mlx.core as mx

    from ..model.lazy_model import build

    model = build(decode_config(dtype))
    mx.eval(model.parameters())
    model.eval()
    return model


def decode_step_seconds(dtype: str = "bfloat16") -> float:
    """Seconds one decoding step takes on the minimal Llama, one row, on a stream of its
    own as BatchGenerator's: the mean step of a run of DECODE_STEPS after DECODE_WARMUP,
    the best of DECODE_RUNS runs (as a measured training step is the fastest of a few)."""
    import mlx.core as mx

    model, sampler = minimal_model(dtype), grpo_sampler()
    best = float("inf")
    with mx.stream(mx.new_stream(mx.default_device())):
        for _ in range(DECODE_RUNS):
            loop = DecodingLoop(model, sampler, mx.array([1]))
            for _ in range(DECODE_WARMUP):
                loop.step()
            tic = time.perf_counter()
            for _ in range(DECODE_STEPS):
                loop.step()
            best = min(best, (time.perf_counter() - tic) / DECODE_STEPS)
    return best


def decode_op_seconds(step_seconds: float, work_seconds: float, operations: int) -> float:
    """Seconds one operation of a decoding step costs: the step's time less its products
    and passes, over its operations (the loop around them, the wait for the token and its
    tolist, spread over them). Never below zero (a busy moment)."""
    return max(step_seconds - work_seconds, 0.0) / operations


def measured_decode_op(dtype: str, rates) -> float:
    """decode_op_seconds measured now on the minimal Llama, its products and passes at
    `rates` (this machine's, rate.MachineRates), its operations counted as step_work.decode_ops."""
    from ..estimate.step_time import decode_work_seconds, measured_speed
    from ..estimate.step_work import decode_ops
    from ..model.resolve import from_config

    model = from_config("decode step", decode_config(dtype))
    return decode_op_seconds(decode_step_seconds(dtype), decode_work_seconds(model, measured_speed(rates)),
                             decode_ops(model))


def decode_key(dtype: str) -> str:
    """What the loop's rate depends on: the machine's rates' key (rate.machine_key), the dtype's products unquantized."""
    from .rate import machine_key

    return machine_key(dtype) + "|decoding loop"


def decode_rate(dtype: str, rates) -> float:
    """This machine's cost of one operation of mlx-lm's decoding loop, measured the first
    time (against `rates`, the run's) and read from mlxfit's cache after."""
    from ..cache import remembered

    return remembered("decode_loop_rate", decode_key(dtype), lambda: measured_decode_op(dtype, rates))
