"""Mechanisms the estimate counts on a GPU that no measurement there has verified, and the
peak without each: an estimate's range spans both (mlxfit/estimate/plan.py), so that a
promise of "fits" holds whichever way the mechanism turns out.

- The fused cross-entropy: from mlx 0.32.3 mlx/nn/losses.py runs mx.fast.cross_entropy on
  the GPU (mlxfit/runtime.py), read from MLX's source; of the public Mac runs with a logged
  peak (benchmarks/evidence/) two use it, of rough length, which fit either count, so its
  saving is not measured. Without it: the unfused loss of earlier MLX.
- Gated delta's per-token loop (Qwen3.5, qwen3_next): training runs gated_delta_ops, whose
  kept states and T^2 backward are measured on the CPU only; a public Mac report (mlx#3539,
  Qwen3.5-4B at 512 tokens in about 11 GB) logged far less than they count. Without it:
  the estimate with neither term.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.training import TrainingConfig
from .detailed import Breakdown, coefficients, combine
from .uncertainty import predicted_range

GPU = ("metal", "cuda")
FUSED_CROSS_ENTROPY = "fused cross-entropy"
GATED_DELTA = "gated delta's per-token loop"
WHY = {
    FUSED_CROSS_ENTROPY: "MLX from 0.32.3 runs mx.fast.cross_entropy on the GPU, read from its source; the two "
                         "public Mac runs of it with a logged peak, of rough length, do not tell it from the unfused "
                         "loss of earlier MLX, so the range also covers that",
    GATED_DELTA: "training runs gated delta's per-token loop, counted from mlx-lm's source and measured on the CPU "
                 "only; a public Mac report (mlx#3539) logged far less, so the range also covers the estimate "
                 "without it",
}


@dataclass(frozen=True)
class Unverified:
    mechanism: str
    peak_without_bytes: int

    @property
    def why(self) -> str:
        return WHY[self.mechanism]

    def to_dict(self) -> dict:
        return {"mechanism": self.mechanism, "why": self.why, "peak_without_bytes": self.peak_without_bytes}


def unverified(breakdown: Breakdown, training: TrainingConfig) -> tuple[Unverified, ...]:
    """The unverified mechanisms of an estimate, each with the estimate's peak without it."""
    if breakdown.backend not in GPU:
        return ()
    f = breakdown.features
    out = []
    if f.get("logits_fused_bytes"):
        out.append((FUSED_CROSS_ENTROPY, {**f, "logits_bytes": f["logits_fused_bytes"], "logits_fused_bytes": 0}))
    if f.get("recurrent_state_bytes") or f.get("recurrent_once_bytes"):
        out.append((GATED_DELTA, {**f, "recurrent_state_bytes": 0, "recurrent_once_bytes": 0}))
    if not out:
        return ()
    c = coefficients()[breakdown.backend]
    counted = combine(f, c, training, breakdown.backend).peak_bytes
    found = (Unverified(name, breakdown.peak_bytes + combine(alt, c, training, breakdown.backend).peak_bytes - counted)
             for name, alt in out)
    return tuple(u for u in found if u.peak_without_bytes != breakdown.peak_bytes)  # one that moves the peak


def with_unverified(breakdown: Breakdown, training: TrainingConfig) -> Breakdown:
    """The breakdown, carrying its unverified mechanisms in its features ("unverified")."""
    found = unverified(breakdown, training)
    if not found:
        return breakdown
    return Breakdown(parts=breakdown.parts, backend=breakdown.backend, features={**breakdown.features, "unverified": found})


def spanned(n_bytes: int, breakdown: Breakdown | None) -> tuple[int, int]:
    """(lowest, highest) peak of an estimate over its unverified mechanisms' presence and absence."""
    peaks = [n_bytes] + [u.peak_without_bytes for u in (breakdown.features.get("unverified", ()) if breakdown else ())]
    return min(peaks), max(peaks)


def spanned_range(n_bytes: int, breakdown: Breakdown | None, backend: str, kind: str | None = None) -> tuple[int, int]:
    """The estimate's range (mlxfit/estimate/uncertainty.py) stretched over its unverified
    mechanisms: the low end from the lowest peak, the high end from the highest."""
    lowest, highest = spanned(n_bytes, breakdown)
    return predicted_range(lowest, backend, kind=kind)[0], predicted_range(highest, backend, kind=kind)[1]
