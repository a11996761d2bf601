"""What the blocks keep for the backward pass of mlx-lm-lora's full fine-tune of a base
quantized at load (--train-type full with --load-in-Nbits, or a base stored quantized).

nn.quantize's layers freeze their weights, so only the norms (and any bias) train
(estimate/preference.py unquantized_trainable), yet every block's backward runs to reach
them. What a block keeps is then set by the VJPs that run, not by the adapters a LoRA
run has: a frozen quantized matmul's VJP needs only its weight (mlx's QuantizedMatmul::vjp
takes the input's gradient from the weight), so no projection keeps its input. Traced
with malloc on the CPU (the step of mlx_lm_lora's sft_trainer on llama of 4, 8 and 12
blocks, bfloat16 and float32, intermediate 512 and 1024: per trained block, to the
buffer), a block keeps:

- the two norms' inputs, the residual stream (2 x hidden, the model's dtype), and a
  float32 copy of each (2 x hidden x 4 bytes; the same buffers in a float32 model), which
  the trained weight's VJP reduces over the tokens in;
- q, k and v after RoPE (qkv) and the softmax probabilities (heads x T): attention's VJP;
- the MLP's gate and up and the SiLU's two of the gate (4 x intermediate): SwiGLU's VJP.

A LoRA run keeps more (each adapted projection's input, and the adapters' own outputs in
float32), which is why sizing this run as a LoRA run with the adapters' outputs taken out
read it 21% low: the fitted activation coefficients are a LoRA run's, with part of what
every run keeps in its adapter term.
"""

from __future__ import annotations

from ..model.resolve import ModelInfo
from .detailed import _widths, dtype_bytes

NORM_INPUTS = 2  # input_layernorm, post_attention_layernorm: each keeps its input
MLP_KEPT = 4  # gate, up, sigmoid(gate), silu(gate)
# The working set of the block being differentiated, per token, on top of what every block
# keeps: float32 and model-dtype buffers of the hidden width, model-dtype buffers of the
# intermediate width, and one float32 buffer of the attention probabilities (heads x T).
# Measured, not traced: the step's peak less this estimate on llama quantized at load
# (SFT step, Adam) moves with the hidden width, the intermediate width, the heads, the
# length and the dtype as these counts say, and not with the depth (4 and 8 blocks: 2.35
# and 2.49 MB at 128 tokens, hidden 256, bfloat16; 1.03 at 64 tokens, 5.87 at 256; 4.1 in
# float32; 2.86 with intermediate 1024; 4.53 at hidden 512, intermediate 1024).
WORKING_H_F32 = 8
WORKING_H = 4
WORKING_INTER = 4


def kept_bytes(model: ModelInfo, batch: int, tokens: int, checkpointed: bool) -> tuple[int, int]:
    """(activations, attention probabilities) the trained blocks keep for the backward pass,
    in bytes, for `batch` sequences of `tokens` positions. Checkpointed, one block's
    (mlx_lm's grad_checkpoint: each block keeps its input, counted apart, and is recomputed
    whole in the backward pass)."""
    arch, s = model.architecture, dtype_bytes(model)
    per_block = []
    for b in arch.blocks:
        w = _widths(b, arch.hidden_size)
        acts = NORM_INPUTS * w["h"] * (s + 4) + b.qkv * s + MLP_KEPT * w["inter"] * s
        if b.qk_norm:  # qwen3, gemma3: per-head norms on q and k, trained too: their inputs kept
            acts += (b.heads + b.kv_heads) * b.head_dim * (s + 4)
        probs = b.heads * tokens * s
        per_block.append((batch * tokens * acts, batch * tokens * probs))
    if not per_block:
        return 0, 0
    if checkpointed:
        return max(a for a, _ in per_block), max(p for _, p in per_block)
    return sum(a for a, _ in per_block), sum(p for _, p in per_block)


def working_bytes(model: ModelInfo, batch: int, tokens: int) -> int:
    """The working set of the block being differentiated (one block at a time, the largest),
    in bytes: what the step's peak holds beyond what every block keeps (kept_bytes)."""
    arch, s = model.architecture, dtype_bytes(model)
    each = [tokens * (WORKING_H_F32 * arch.hidden_size * 4 + WORKING_H * arch.hidden_size * s
                      + WORKING_INTER * _widths(b, arch.hidden_size)["inter"] * s + b.heads * tokens * 4)
            for b in arch.blocks]
    return batch * max(each, default=0)
