"""What compiling mlx-lm's training step costs, and when it happens again.

mlx_lm/tuner/trainer.py wraps its step in mx.compile (state in and out); mx.compile traces and
compiles again for every new shape of its inputs. This times, on this machine, a Llama with every
linear adapted (mlx-lm's own model, LoRA layers and default_loss, the step compiled as the trainer
compiles it): the first step at a width against the fastest of the steps after it, for widths seen
for the first time and once more. mlxfit/estimate/run_time.py counts one step of each distinct
batch width for compiling. Times are this machine's and noisy: read the ratios.

    PYTHONPATH=. python benchmarks/compile_cost.py
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx_lm.models import llama
from mlx_lm.tuner.trainer import default_loss
from mlx_lm.tuner.utils import linear_to_lora_layers

RESULT = Path(__file__).resolve().parent / "results" / "compile_cost.md"


def model(blocks: int, hidden: int = 256) -> nn.Module:
    args = llama.ModelArgs(model_type="llama", hidden_size=hidden, num_hidden_layers=blocks,
                           intermediate_size=2 * hidden, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-5, vocab_size=1024, tie_word_embeddings=True)
    m = llama.Model(args)
    m.freeze()
    linear_to_lora_layers(m, blocks, {"rank": 8, "scale": 20.0, "dropout": 0.0})  # no keys: every linear
    mx.eval(m.parameters())
    return m


def timings(blocks: int, widths, repeats: int = 5):
    m, opt = model(blocks), optim.Adam(1e-5)
    loss_and_grad = nn.value_and_grad(m, default_loss)
    state = [m.state, opt.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x, lengths):
        (loss, tokens), grad = loss_and_grad(m, x, lengths)
        opt.update(m, grad)
        return loss, tokens

    def timed(x, lengths) -> float:
        start = time.perf_counter()
        mx.eval(state, step(x, lengths))
        return time.perf_counter() - start

    seen = set()
    for w in widths:
        x, lengths = mx.random.randint(0, 1024, (4, w)), mx.array([[0, w - 1]] * 4)
        first = timed(x, lengths)
        steady = min(timed(x, lengths) for _ in range(repeats))
        yield w, w in seen, first, steady
        seen.add(w)


def main():
    lines = ["# Compiling mlx-lm's step: once per input shape", "",
             "Written by `PYTHONPATH=. python benchmarks/compile_cost.py` (this machine's CPU; the docstring says "
             "what is timed). Extra: the first step at a width over the fastest step after it, in steady steps.", "",
             "| blocks | width | seen before | first step ms | steady step ms | extra, in steps |", "|---|---|---|---|---|---|"]
    for blocks in (2, 8, 32):
        for w, seen, first, steady in timings(blocks, [33, 65, 33, 129]):
            lines.append(f"| {blocks} | {w} | {'yes' if seen else 'no'} | {first * 1e3:.1f} | {steady * 1e3:.1f} | "
                         f"{(first - steady) / steady:.2f} |")
    RESULT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
