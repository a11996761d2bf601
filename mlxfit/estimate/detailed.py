"""The detailed estimate: the peak mlx-lm's trainer reaches, as named parts in bytes.

The exact parts (weights, adapters, gradients, optimizer state) are counted from
the architecture the way mlx-lm builds and trains it. The parts that depend on
how MLX schedules the step (activations kept for the backward pass, attention
scores, logits and their gradient, DoRA's temporaries, what the optimizer update
has in flight) are byte counts times coefficients measured per backend
(mlxfit/data/coefficients.json: the cpu section written by `benchmarks/accuracy.py
--fit` from measurements here, the metal and cuda sections by
`benchmarks/mac_evidence.py --fit` from public Mac runs). They
are not all alive at once: the peak is the largest of three moments of a step
(see TERMS and estimate).

Notation: B batch, T tokens per example fed to the model (a padded batch of
length N gives T = N - 1: mlx-lm's default_loss drops the last token), h hidden,
H/KV heads, d head_dim, I intermediate, V vocabulary, s bytes per element.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from .. import data_text
from ..model import facts, lazy_model
from ..model.architecture import Architecture, Block
from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from ..runtime import Runtime
from .uncertainty import run_kind

BACKENDS = ("cpu", "metal", "cuda")
ACT_H, ACT_QKV, ACT_I = 6, 2, 4  # tensors kept per block, by width (see features)


@lru_cache(maxsize=1)
def coefficients() -> dict:
    return json.loads(data_text("coefficients.json"))


@dataclass(frozen=True)
class Breakdown:
    parts: dict  # name -> bytes, in drawing order
    backend: str
    features: dict  # the element counts behind the fitted parts (for fitting and tests)

    @property
    def peak_bytes(self) -> int:
        return sum(self.parts.values())

    def to_dict(self) -> dict:
        return {
            "predicted_peak_bytes": self.peak_bytes,
            "backend": self.backend,
            "peak_phase": self.features.get("phase"),
            "breakdown": dict(self.parts),
        }

    def with_part(self, name: str, n_bytes: int) -> "Breakdown":
        return Breakdown(parts={**self.parts, name: n_bytes}, backend=self.backend, features=self.features)


def dtype_bytes(model: ModelInfo) -> int:
    """Bytes per element of the activations: the checkpoint's float dtype."""
    return lazy_model.checkpoint_dtype(model.config or {}).size


def _qlora_bits(model: ModelInfo, training: TrainingConfig) -> tuple[int | None, int | None]:
    """QLoRA on a base that is not quantized yet: quantize it as `mlx_lm.convert -q`."""
    if training.quantize and not model.quantized:
        return training.bits, training.group_size
    return None, None


@lru_cache(maxsize=256)
def _counted(config_key: str, bits, group_size, fine_tune_type: str, num_layers: int, rank: int, keys, keep=None):
    """Remembered across runs (mlxfit/model/facts.py): the model is built only the first time."""
    args = (bits, group_size, fine_tune_type, num_layers, rank, keys, keep)
    return facts.recall(config_key, ("counted", *args), lambda: _count(config_key, *args))


def _count(config_key: str, bits, group_size, fine_tune_type: str, num_layers: int, rank: int, keys, keep):
    base = lazy_model.model_for_key(config_key, bits, group_size)
    if fine_tune_type == "full":
        trainable = lazy_model.full_parameters(base, num_layers)
    else:
        trainable = lazy_model.adapter_parameters(base, num_layers, rank, fine_tune_type == "dora", keys)
    base_bytes = lazy_model.nbytes(base)
    if keep is not None:  # a slice: the leading blocks are not there
        base_bytes -= sum(lazy_model.block_nbytes(base, i) for i in range(len(base.layers))[: len(base.layers) - keep])
    return base_bytes, tuple((tuple(v.shape), v.dtype.size) for _, v in trainable)


def counted(model: ModelInfo, training: TrainingConfig) -> tuple[int, tuple]:
    """(bytes of the base weights as stored for training, ((shape, itemsize), ...)
    of every trainable array), from mlx-lm's own model built lazily."""
    keys = tuple(sorted(training.lora_keys)) if training.lora_keys is not None else None
    return _counted(
        model.config_key, *_qlora_bits(model, training),
        training.fine_tune_type, training.num_layers, training.rank, keys, model.slice_blocks,
    )


def counted_totals(model: ModelInfo, training: TrainingConfig) -> tuple[int, int, int, int]:
    """(base bytes, trainable elements, trainable bytes, optimizer state bytes)."""
    keys = tuple(sorted(training.lora_keys)) if training.lora_keys is not None else None
    return _totals(
        model.config_key, *_qlora_bits(model, training),
        training.fine_tune_type, training.num_layers, training.rank, keys, model.slice_blocks, training.optimizer,
    )


@lru_cache(maxsize=1024)
def _totals(config_key: str, bits, group_size, fine_tune_type: str, num_layers: int, rank: int, keys, keep,
            optimizer: str) -> tuple[int, int, int, int]:
    base_bytes, trainable = _counted(config_key, bits, group_size, fine_tune_type, num_layers, rank, keys, keep)
    shapes = [shape for shape, _ in trainable]
    param_bytes = trainable[0][1] if trainable else None
    return (
        base_bytes,
        sum(math.prod(shape) for shape in shapes),
        sum(math.prod(shape) * size for shape, size in trainable),
        optimizer_state_elements(optimizer, shapes) * param_bytes if trainable else 0,
    )


def weight_bytes(model: ModelInfo, training: TrainingConfig) -> int:
    return counted(model, training)[0]


def optimizer_state_elements(name: str, shapes: list[tuple[int, ...]]) -> int:
    """mlx/optimizers/optimizers.py init_single, per optimizer, in the parameter's dtype."""
    total = 0
    for shape in shapes:
        n = math.prod(shape)
        if name in ("adam", "adamw"):
            total += 2 * n  # m and v
        elif name in ("sgd", "muon"):
            total += n  # v (SGD allocates it even without momentum)
        elif name == "adafactor":
            if len(shape) >= 2:
                total += n // shape[-1] + n // shape[-2]  # row and column factors
            else:
                total += n
    return total


# What is in flight at the optimizer update, beyond the resident weights and
# optimizer state: gradients, new parameters and new state not yet swapped in.
# MLX frees each old parameter once its update has run, so what is in flight
# is a number of blocks' worth of trainable weights, capped at a multiple of all
# of them: (blocks, blocks per trained block, cap) per optimizer. Measured on the
# CPU with full fine-tunes of 16-token sequences, where activations are negligible,
# at 4, 8 and 16 blocks (tests/test_measure_steps.py, benchmarks/accuracy.py llama-wide-1k):
# adam 8.2-8.6 / 9.7-10.2 / 10.7 blocks (2.04-2.16 / 1.22-1.28 / 0.67 of all),
# adafactor 7.3 / 10.8-11.3 / 18.7 blocks (1.83 / 1.35-1.41 / 1.17), sgd - / 2.9 /
# 3.2 blocks (- / 0.37 / 0.2), muon - / 15.5 / - blocks (- / 1.94 / -). Adafactor's
# grows with depth (3.7 + 0.93 per block fits all three); the others' does not.
UPDATE_IN_FLIGHT = {"sgd": (3.5, 0.0, 1.0), "adam": (11.0, 0.0, 2.2), "adamw": (11.0, 0.0, 2.2),
                    "adafactor": (3.7, 0.93, 2.0), "muon": (16.0, 0.0, 2.0)}


def update_in_flight_bytes(optimizer: str, trainable_bytes: int, trained_blocks: int) -> int:
    blocks, per_trained_block, cap = UPDATE_IN_FLIGHT[optimizer]
    n = max(trained_blocks, 1)
    return int(min(cap * trainable_bytes, (blocks + per_trained_block * n) * trainable_bytes / n))


FUSED = ("qkv_proj", "gate_up_proj")  # phi3's fused projections, split after the matmul


def _widths(block: Block, h: int) -> dict:
    """Per-token widths of a block's activations."""
    inter = block.intermediate
    if block.is_moe:
        # mlx_lm/models/switch_layers.py SwitchGLU: each token is copied to its k
        # experts (_gather_sort), runs k expert MLPs, and k outputs are combined;
        # plus the router's scores.
        k = block.experts_per_token
        inter += k * block.expert_intermediate + 2 * k * h + block.experts
    return {"h": h, "qkv": block.qkv, "inter": inter}


def _recurrent_width(block: Block) -> int:
    """Per token, the sliced inputs of a gated-delta step: q and k (repeated to the
    value heads), v, and the gate and beta per head."""
    heads, dk, dv = block.recurrent
    return heads * (2 * dk + dv + 2)


def _adapted(block: Block, keys) -> list:
    return [lin for lin in block.linears if keys is None or lin.path in keys]


def _figures(b: Block, h: int, keys) -> dict[str, int]:
    """One block's per-token widths and counts, which features scales by batch,
    length and dtype."""
    w = _widths(b, h)
    # Full fine-tuning also differentiates every linear's weight and the norms'.
    # In the grid, MoE full fine-tunes show no extra for their experts' MLP, so
    # only the dense widths count.
    dense = {**w, "inter": 0 if b.is_moe else w["inter"]}
    adapted = _adapted(b, keys)
    return {
        **w,
        **{f"full_{k}": v for k, v in dense.items()},
        # One block's activations, per token: the two norms' inputs and outputs and
        # the residual stream (~6 h), q/k/v before and after RoPE (~2 qkv), the MLP's
        # gate, up, activation and product (~4 I). What the blocks keep is fitted per
        # width (act_*); this weighting serves the working set of the block being
        # differentiated.
        "one_block": ACT_H * w["h"] + ACT_QKV * w["qkv"] + ACT_I * w["inter"],
        "one_block_full": ACT_H * dense["h"] + ACT_QKV * dense["qkv"] + ACT_I * dense["inter"],
        # The softmax probabilities of one block are B x H x T x T (none for linear
        # attention or state-space blocks).
        "heads": b.heads,
        "adapter_out": sum(l.out_features for l in adapted),
        "adapter_in": sum(l.in_features for l in adapted),
        "dora_weight": max((l.in_features * l.out_features for l in adapted), default=0),
        "adapted_weights": sum(l.in_features * l.out_features for l in adapted),
        "qk_norm": (b.heads + b.kv_heads) * b.head_dim if b.qk_norm else 0,
        "fused": sum(l.out_features for l in b.linears if l.path.endswith(FUSED)),
        "block": 1,
        "recurrent_state": math.prod(b.recurrent),
        "recurrent_width": _recurrent_width(b),
    }


def _per_block(arch: Architecture, keys: frozenset | None) -> dict[str, list[int]]:
    """_figures of every block, one list per figure, indexed as arch.blocks. They
    depend only on the architecture and the LoRA keys, so they are worked out once
    (a plan sizes a few hundred runs of one model)."""
    key = ("per_block", keys)
    if key not in arch.memo:
        rows = [_figures(b, arch.hidden_size, keys) for b in arch.blocks]
        arch.memo[key] = {name: [row[name] for row in rows] for name in (rows[0] if rows else ())}
    return arch.memo[key]


def ahead_of_loss(blocks, keys, training: TrainingConfig) -> bool:
    """Does the last trained block's attention backward run ahead into the loss's
    backward? Traced with malloc on the CPU (benchmarks/trace_peak.py): Qwen3 full
    fine-tunes (1 x 2048 with 2, 4 and 6 of 6 blocks trained, 4 x 512) peak at the kept
    tensors + 4 logits + 2 scores (1336 MB with 2 blocks; 866 MB with mx.eval made
    synchronous): between the two, a trained linear adds one primitive (its weight's
    gradient) to a frozen one's. LoRA adapters add many more: Qwen3 LoRA with o, gate,
    up and down adapted after the attention, or only o, gate and down, frees the
    cross-entropy's buffers first; Phi-3 LoRA and DoRA (o and its fused gate_up and
    down) overlap. With no adapter after the attention (LoRA on q and v) the path is
    the frozen one, shorter than a full fine-tune's. With checkpointing the block's
    recomputed forward pass comes first, and the peak falls inside the block (traced:
    Mixtral, 4 blocks)."""
    if not blocks or training.grad_checkpoint:
        return False
    if training.fine_tune_type == "full":
        return True
    last = blocks[-1]
    after = [lin for lin in _adapted(last, keys) if lin.path not in last.mixer_inputs]
    return not after or any(lin.path.endswith(FUSED) for lin in last.linears)


def features(model: ModelInfo, training: TrainingConfig, length: int | None = None) -> dict:
    """Element and byte counts of one configuration; the fitted parts scale these."""
    arch, s = model.architecture, dtype_bytes(model)
    batch_len = training.batch_width(length)
    B, T = training.batch_size // training.hosts, max(batch_len - 1, 1)
    keys = frozenset(training.lora_keys) if training.lora_keys is not None else None
    every = _per_block(arch, keys)
    first = arch.num_layers - training.layers_trained(arch.num_layers)
    trained = {name: values[first:] for name, values in every.items()}  # the trained blocks
    n = len(arch.blocks[first:])
    frozen_blocks = arch.num_layers - n
    h, V = arch.hidden_size, arch.vocab_size
    full = training.fine_tune_type == "full"

    def over_blocks(name: str) -> int:
        # mlx_lm/tuner/trainer.py grad_checkpoint: each block keeps only its input;
        # one block at a time is recomputed with its full activations.
        values = trained.get(name, ())
        return max(values, default=0) if training.grad_checkpoint else sum(values)

    def largest(name: str) -> int:
        return max(trained.get(name, ()), default=0)

    block_act = B * T * largest("one_block") * s
    dense_act = B * T * largest("one_block_full") * s
    block_scores = B * largest("heads") * T * T * s
    scores = B * over_blocks("heads") * T * T * s
    fused = max(every.get("fused", ()), default=0)
    base_bytes, trainable_elements, trainable_bytes, optimizer_bytes = counted_totals(model, training)
    adapter_outputs = dora_weights = 0
    if not full:
        # lora.py / dora.py __call__: every adapted layer keeps the base output y and
        # the adapter's z (DoRA also the rescaled output), each B x T x out. y is in the
        # model's dtype; z = (x @ lora_a) @ lora_b in the adapter's (float32: lora.py
        # creates lora_a and lora_b so), which MLX's type promotion keeps over a half-
        # precision x (traced on the CPU: a bf16 Qwen2 DoRA holds float32 hidden-sized
        # outputs). Counted per output as the mean of the two, so a float32 model's is s.
        z_bytes = max(s, trainable_bytes // max(trainable_elements, 1))
        adapter_outputs = B * T * (s + z_bytes) // 2 * over_blocks("adapter_out")
    dropout = dropout_once = 0
    if not full and training.dropout > 0:
        # mlx/nn/layers/dropout.py: each adapter draws a mask over its input and scales it;
        # the adapter's first product keeps the dropped-out input (model dtype) for lora_a's
        # gradient, and the mask (one byte an element) for the input's: B x T x in of each,
        # per adapted layer, even where layers share an input (q, k, v). With dropout 0 the
        # layer returns its input untouched. Counted, not fitted (measured on the CPU over
        # dropout 0, every linear adapted: a float32 Qwen3 of 6 blocks at 4 x 257, 144.7 MB
        # against 141.6 counted; a bfloat16 one of 3 blocks at 4 x 129, 10.2 against 10.6).
        # Checkpointed, one recomputed block holds them (measured 31 MB against 24 MB).
        per_block = B * T * (s + 1)
        if training.grad_checkpoint:
            dropout_once = per_block * largest("adapter_in")
        else:
            dropout = per_block * sum(trained.get("adapter_in", ()))
    dora_half = 0
    if training.fine_tune_type == "dora":
        # dora.py __call__: the adapted weight w + scale * B^T A^T (float32) of a layer, for the
        # norm that rescales its output: one is alive at the peak, the one being built (traced
        # on float32 Phi-3 and Qwen2 DoRA at 2 x 64, checkpointed or not).
        dora_weights = largest("dora_weight") * 4
        if s < 4 and training.grad_checkpoint:
            # Checkpointed on a half-precision model, every trained block's are (traced:
            # benchmarks/trace_peak.py 41, a bf16 Gemma 2 DoRA of 4 blocks at 1 x 256, holds 22 of
            # its 28 adapted weights in float32 at the peak, with mx.eval synchronous too; the same
            # run in float32 holds one, and a bf16 Qwen2 DoRA not checkpointed 9 of 42).
            dora_half = sum(trained.get("adapted_weights", ())) * 4
    # dora.py __call__ on a quantized base: y = x @ mx.dequantize(...).T keeps every adapted
    # layer's dequantized weight for its VJP, checkpointed or not, beside the one float32 adapted
    # weight being built; so qdora_weights replaces the two DoRA terms (traced: accuracy-notes.md).
    qdora = training.fine_tune_type == "dora" and (training.quantize or model.quantized)
    qdora_weights = sum(trained.get("adapted_weights", ())) * s + dora_weights if qdora else 0
    if qdora:
        dora_weights = dora_half = 0
    by_width = {}
    for k in ("h", "qkv", "inter"):
        by_width[f"act_{k}_bytes"] = B * T * s * over_blocks(k)
        by_width[f"act_full_{k}_bytes"] = B * T * s * over_blocks(f"full_{k}") if full else 0
    return {
        **by_width,
        "s": s,
        "base_bytes": base_bytes,
        "trainable_elements": trainable_elements,
        "trainable_bytes": trainable_bytes,
        "optimizer_bytes": optimizer_bytes,
        "checkpoint_bytes": B * T * h * (n + 1) * s if training.grad_checkpoint and n else 0,
        # The same run's hidden-state-sized buffers that do not grow with depth (on the CPU,
        # what mx.eval allocates ahead while a checkpointed block is recomputed).
        "checkpoint_ahead_bytes": B * T * h * s if training.grad_checkpoint and n else 0,
        "scores_bytes": scores,
        # The backward pass of the block being differentiated: its attention's
        # softmax gradient and its activations' gradients, once whatever the depth.
        "scores_once_bytes": block_scores,
        "act_once_bytes": block_act,
        "act_full_once_bytes": dense_act if full else 0,
        # With checkpointing, the block being differentiated first recomputes its
        # forward pass, scores included, inside the backward pass.
        "scores_recompute_bytes": block_scores if training.grad_checkpoint else 0,
        # On the CPU backend mx.eval runs ahead of the computation: the main thread
        # allocates the outputs of up to ~50 primitives (MAX_ACTIVE_TASKS = 10 tasks of
        # DISPATCHES_PER_TASK = 10 dispatches, two per primitive: mlx/transforms.cpp,
        # mlx/backend/cpu/encoder.h, eval.cpp) before the worker thread has run them and
        # freed their inputs. When few primitives stand between the cross-entropy's
        # backward and the last block's attention backward, that backward's softmax
        # gradient (dP, dS: 2 x B x H x T x T) is allocated while the cross-entropy's
        # buffers are still alive (see ahead_of_loss).
        "scores_ahead_bytes": B * trained["heads"][-1] * T * T * s if ahead_of_loss(arch.blocks[first:], keys, training) else 0,
        # Per-head RMSNorms on q and k (qwen3, gemma3): with their weights trained,
        # their VJP builds q- and k-sized temporaries.
        "qk_norm_full_bytes": B * T * s * over_blocks("qk_norm") if full else 0,
        "logits_bytes": B * T * V * s,
        "dora_bytes": dora_weights,
        "dora_half_bytes": dora_half,
        "qdora_weights_bytes": qdora_weights,
        "adapter_act_bytes": adapter_outputs,
        "dropout_bytes": dropout,
        "dropout_once_bytes": dropout_once,
        # Measured: a model with fused projections (phi3) keeps each split output's
        # gradient, and its frozen leading blocks' activations stay alive too (those
        # of the last block, the typical one, times the frozen blocks).
        "split_bytes": B * T * fused * s * over_blocks("block"),
        "frozen_fused_bytes": (B * T * every["one_block"][-1] * s + B * every["heads"][-1] * T * T * s) * frozen_blocks
        if fused and n else 0,
        "dora_act_bytes": adapter_outputs if training.fine_tune_type == "dora" else 0,
        # Tanh capping: of the scores only in gemma2's manual attention (attn_logit_softcapping),
        # of the logits wherever final_logit_softcapping is set (gemma2, gemma3n, gemma4).
        "softcap_scores_bytes": scores if arch.attn_softcap else 0,
        "softcap_logits_bytes": B * T * V * s if arch.softcap else 0,
        "attn_softcap": arch.attn_softcap,
        # Gated delta (mlx_lm/models/gated_delta.py gated_delta_ops, the Python loop over the
        # tokens that training runs on every backend): a float32 state kept per token, and per
        # token a zero-filled gradient of the whole sequence: quadratic in T (accuracy-notes.md).
        "recurrent_state_bytes": B * T * 4 * over_blocks("recurrent_state"),
        "recurrent_once_bytes": B * T * T * 4 * largest("recurrent_width"),
        "tokens": T,
        "trained_blocks": n,
        "range_kind": run_kind(training.fine_tune_type, training.grad_checkpoint),
        "unmeasured_kinds": arch.unmeasured_kinds(),
    }


# The fitted terms: (coefficient, feature, part it is drawn as, moments it is
# alive at). A backward pass peaks either at the loss (the logits' gradient on
# top of everything kept for the backward pass) or inside the block being
# differentiated (its attention's softmax gradient and activation gradients).
KEPT, LOSS, BLOCK = ("loss", "block"), ("loss",), ("block",)
TERMS = (
    ("act_h", "act_h_bytes", "activations", KEPT),
    ("act_qkv", "act_qkv_bytes", "activations", KEPT),
    ("act_inter", "act_inter_bytes", "activations", KEPT),
    ("act_full_h", "act_full_h_bytes", "activations", KEPT),
    ("act_full_qkv", "act_full_qkv_bytes", "activations", KEPT),
    ("act_full_inter", "act_full_inter_bytes", "activations", KEPT),
    ("qk_norm_full", "qk_norm_full_bytes", "activations", KEPT),
    ("checkpoint", "checkpoint_bytes", "activations", KEPT),
    ("checkpoint_ahead", "checkpoint_ahead_bytes", "activations", KEPT),
    ("split", "split_bytes", "activations", KEPT),
    ("frozen_fused", "frozen_fused_bytes", "activations", KEPT),
    ("scores", "scores_bytes", "attention scores", KEPT),
    ("scores_softcap", "softcap_scores_bytes", "attention scores", KEPT),
    ("adapter_act", "adapter_act_bytes", "adapter outputs", KEPT),
    ("dropout", "dropout_bytes", "adapter outputs", KEPT),
    ("dropout_once", "dropout_once_bytes", "adapter outputs", BLOCK),
    ("dora", "dora_bytes", "dora temporaries", KEPT),
    ("dora_half", "dora_half_bytes", "dora temporaries", KEPT),
    ("dora_act", "dora_act_bytes", "dora temporaries", KEPT),
    ("qdora_weights", "qdora_weights_bytes", "dora temporaries", KEPT),
    ("logits", "logits_bytes", "logits and gradient", LOSS),
    ("scores_ahead", "scores_ahead_bytes", "attention scores", LOSS),
    ("logits_softcap", "softcap_logits_bytes", "logits and gradient", LOSS),
    ("act_once", "act_once_bytes", "activations", BLOCK),
    ("act_full_once", "act_full_once_bytes", "activations", BLOCK),
    ("scores_once", "scores_once_bytes", "attention scores", BLOCK),
    ("logits_block", "logits_bytes", "logits and gradient", BLOCK),
    ("scores_recompute", "scores_recompute_bytes", "attention scores", BLOCK),
    ("recurrent_state", "recurrent_state_bytes", "activations", KEPT),
    ("recurrent_once", "recurrent_once_bytes", "activations", BLOCK),
    # Backend and version terms (backend_features fills them; 0 elsewhere).
    ("logits_fused", "logits_fused_bytes", "logits and gradient", LOSS),
    ("uncompiled", "uncompiled_bytes", "activations", KEPT),
)
MOMENTS = ("loss", "block")
# Terms counted from what MLX keeps, at their bytes (a coefficient of 1), not fitted.
COUNTED = frozenset({"dropout", "dropout_once"})


def weight(name: str, c: dict) -> float:
    """A term's coefficient: 1 for a counted term, else the fitted one in `c` (0 if none)."""
    return 1.0 if name in COUNTED else c.get(name, 0.0)


def backend_features(f: dict, backend: str, runtime: Runtime | None = None, head_dim: int | None = None) -> dict:
    """The features as the backend and MLX version run them (mlxfit/runtime.py).

    Metal trains attention unfused and keeps one B x H x T x T probability tensor
    per trained block in the model dtype, like the CPU: the features are the same,
    the coefficients (metal section of coefficients.json) are fitted on Mac runs."""
    runtime = runtime or Runtime.current(backend)
    f = {**f, "logits_fused_bytes": 0, "uncompiled_bytes": 0}
    if runtime.fused_cross_entropy:
        # mlx/nn/losses.py: mx.fast.cross_entropy on the GPU, no B x T x V
        # intermediates; its VJP writes the logits' gradient into the logits buffer.
        f["logits_fused_bytes"], f["logits_bytes"] = f["logits_bytes"], 0
    if not runtime.compiled_step:
        # Without mx.compile every elementwise intermediate of the kept activations
        # is its own buffer (mlx-lm PR #53: 47.3 GB uncompiled vs 40.5 GB compiled).
        f["uncompiled_bytes"] = sum(f[k] for k in ("act_h_bytes", "act_qkv_bytes", "act_inter_bytes", "adapter_act_bytes"))
    cudnn = f["s"] == 2 and (head_dim is None or (head_dim <= 128 and head_dim % 8 == 0))
    if backend == "cuda" and cudnn and not f["attn_softcap"]:
        if f["tokens"] % 128 == 0:
            # mlx/backend/cuda/scaled_dot_product_attention.cpp: cuDNN's fused attention
            # and its VJP run when the query length is a multiple of 128; only a float32
            # logsumexp per query row is kept instead of the B x H x T x T scores.
            per_row = 4 / f["s"] / f["tokens"]
            return {**f, "scores_bytes": int(f["scores_bytes"] * per_row), "scores_once_bytes": 0, "scores_ahead_bytes": 0}
        # Fused forward, unfused backward: the VJP recomputes the probabilities of one
        # block at a time; none are kept across blocks.
        return {**f, "scores_bytes": 0, "scores_recompute_bytes": f["scores_once_bytes"]}
    return f


def moment_parts(f: dict, c: dict) -> dict:
    """moment -> {part: bytes} of the backward pass's working memory."""
    moments = {m: {} for m in MOMENTS}
    for name, feature, part, alive in TERMS:
        for m in alive:
            moments[m][part] = moments[m].get(part, 0) + weight(name, c) * f[feature]
    return {m: {part: int(v) for part, v in parts.items()} for m, parts in moments.items()}


def estimate(model: ModelInfo, training: TrainingConfig, backend: str = "cpu", length: int | None = None,
             runtime: Runtime | None = None) -> Breakdown:
    """The peak is whichever moment of a step needs most on top of what stays
    resident (weights and optimizer state): the loss's backward, a block's backward,
    or the optimizer update with every gradient and the update's temporaries.

    `runtime` (mlxfit/runtime.py) is what the MLX / mlx-lm versions do; None: the
    installed versions. benchmarks/mac_runs.py passes the versions of a past run."""
    f = backend_features(features(model, training, length), backend, runtime, model.architecture.head_dim)
    return combine(f, coefficients()[backend], training, backend)


def combine(f: dict, c: dict, training: TrainingConfig, backend: str) -> Breakdown:
    """The breakdown of features `f` under coefficients `c` (estimate's second half,
    apart so that benchmarks/mac_evidence.py can refit the coefficients on features)."""
    frozen = f["base_bytes"]
    if training.fine_tune_type == "full":
        # The unfrozen block weights are counted as trainable, not frozen.
        frozen -= f["trainable_bytes"]
    resident = {
        "weights (frozen)": max(frozen, 0),
        "weights (trainable)": f["trainable_bytes"],
        "optimizer state": f["optimizer_bytes"],
    }
    in_flight = update_in_flight_bytes(training.optimizer, f["trainable_bytes"], f["trained_blocks"])
    update = {}
    if training.hosts > 1:
        # mlx/nn/utils.py average_gradients: every gradient exists before any update
        # runs; they are concatenated into all-reduce buffers and summed into
        # another, both alive until split back (upper bound).
        in_flight = max(in_flight, f["trainable_bytes"])
        update["all-reduce buffers"] = 2 * f["trainable_bytes"]
    update["gradients"] = min(in_flight, f["trainable_bytes"])
    update["update temporaries"] = max(in_flight - f["trainable_bytes"], 0)
    candidates = {**moment_parts(f, c), "update": update}
    phase = max(candidates, key=lambda m: sum(candidates[m].values()))
    names = [part for _, _, part, _ in TERMS] + ["gradients", "update temporaries", "all-reduce buffers"]
    parts = {**resident, **dict.fromkeys(names, 0), **candidates[phase]}
    parts["framework"] = int(c["fixed"])
    return Breakdown(parts=parts, backend=backend, features={**f, "phase": phase})
