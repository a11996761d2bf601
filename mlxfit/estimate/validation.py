"""The validation pass: the other moment mlx-lm's logged peak covers.

mlx_lm/tuner/trainer.py train() calls evaluate() at iteration 1, every steps_per_eval
iterations and at the last one: `val_batches` batches of valid.jsonl (all of them at -1),
each through default_loss with no gradient (forward only, dropout off), from
iterate_batches, which draws the batches in random order, so with fewer batches than the
set has the widest valid batch may or may not be among them. Its rows can be wider than any
training batch. mx.get_peak_memory() is never reset, so the run's logged peak is the larger
of the training step's and this pass's.

What a forward pass holds, counted from the ops (nothing here is fitted): the resident
weights, adapters and optimizer state (present from the first update on: the passes after
iteration 1 see them), one block's working set at a time (its inputs, q/k/v, the MLP's gate,
up and product: the per-token widths detailed.py counts for one block) beside the residual
stream, and at the end the logits with the loss's forward, whose reductions (logsumexp,
take_along_axis) are B x T, not B x T x V; a softcapped model keeps its capped logits beside
the raw ones. Attention: Metal and CUDA run the fused kernel without a gradient (no
B x H x T x T tensor); the CPU runs the unfused graph, one block's probabilities at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig

VAL_BATCHES = 25  # mlx_lm/lora.py CONFIG_DEFAULTS["val_batches"]


@dataclass(frozen=True)
class Validation:
    width: int  # the widest valid batch (padded), as iterate_batches builds it
    batches: int  # val_batches (-1: every batch)
    valid_batches: int  # how many batches valid.jsonl makes
    peak_bytes: int
    step_peak_bytes: int  # the training step's estimate, beside it
    parts: dict

    @property
    def certain(self) -> bool:
        """Whether every valid batch, so the widest, is evaluated."""
        return self.batches == -1 or self.batches >= self.valid_batches

    @property
    def peaks(self) -> str:
        return "validation" if self.peak_bytes > self.step_peak_bytes else "training step"

    def to_dict(self) -> dict:
        return {
            "widest_batch_tokens": self.width,
            "val_batches": self.batches,
            "valid_batches": self.valid_batches,
            "widest_batch_certain": self.certain,
            "predicted_peak_bytes": self.peak_bytes,
            "training_step_peak_bytes": self.step_peak_bytes,
            "peaks": self.peaks,
            "breakdown": dict(self.parts),
        }


def forward_parts(model: ModelInfo, training: TrainingConfig, width: int, backend: str) -> dict:
    """What one validation batch of `width` tokens holds beyond the resident weights."""
    from .detailed import _per_block, dtype_bytes

    arch, s = model.architecture, dtype_bytes(model)
    B, T = training.batch_size // training.hosts, max(width - 1, 1)
    keys = frozenset(training.lora_keys) if training.lora_keys is not None else None
    every = _per_block(arch, keys)
    parts = {
        "activations": B * T * s * (max(every["one_block"], default=0) + arch.hidden_size),
        "logits": B * T * arch.vocab_size * s * (2 if arch.softcap else 1),
        "attention scores": B * max(every["heads"], default=0) * T * T * s if backend == "cpu" else 0,
    }
    return parts


def validation(model: ModelInfo, training: TrainingConfig, width: int, valid_examples: int, step_peak_bytes: int,
               backend: str, val_batches: int = VAL_BATCHES) -> Validation:
    from .detailed import counted_totals, coefficients

    base, _, trainable, optimizer = counted_totals(model, training)
    frozen = base - (trainable if training.fine_tune_type == "full" else 0)
    parts = {
        "weights (frozen)": max(frozen, 0),
        "weights (trainable)": trainable,
        "optimizer state": optimizer,
        **forward_parts(model, training, width, backend),
        "framework": int(coefficients()[backend]["fixed"]),
    }
    batch = training.batch_size // training.hosts
    return Validation(width=width, batches=val_batches, valid_batches=max(valid_examples // max(batch, 1), 0),
                      peak_bytes=sum(parts.values()), step_peak_bytes=step_peak_bytes, parts=parts)
