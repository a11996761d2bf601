"""How far an estimate can be off, per backend.

Every estimate carries a range [low, high]: the point estimate times the spread of
measured / predicted peaks on the evidence for that backend
(mlxfit/data/ranges.json, written by benchmarks/mac_evidence.py):

- cpu: the accuracy grid measured here (benchmarks/results/accuracy.csv);
- metal: the public Mac runs, each predicted by a fit that left its source out, its
  form chosen without it (a nested leave-one-source-out, benchmarks/results/mac_evidence.md),
  never narrower than the CPU's, the high side never narrower than the low, per kind of
  run (run_kind) where a kind has enough runs;
- on a GPU, stretched over what the estimate counts unverified there
  (mlxfit/estimate/unverified.py: the fused cross-entropy, gated delta's loop);
- cuda: one public run only, so the Metal range widened by a stated margin;
- rule: the rule of thumb against the public Mac runs (it has no backend);
- preference and RL modes (DPO, CPO, ORPO, GRPO with mlx-lm-lora): their own spread
  per mode on the CPU runs against mlx-lm-lora's trainer
  (mlxfit/data/preference_ranges.json, written by benchmarks/preference.py --ranges);
  on another backend, compounded with that backend's SFT spread, since no public
  run of these modes was found there.

The verdict on a range is mlxfit/estimate/verdict.py's judge.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache

from .. import data_text


@lru_cache(maxsize=1)
def ranges() -> dict:
    return json.loads(data_text("ranges.json"))


def run_kind(fine_tune_type: str, grad_checkpoint: bool) -> str:
    """The kinds of run whose errors differ on the Mac evidence: full, dora, and LoRA /
    QLoRA with or without gradient checkpointing."""
    if fine_tune_type != "lora":
        return fine_tune_type
    return "lora-ckpt" if grad_checkpoint else "lora"


def range_factors(backend: str, basis: str = "detailed", kind: str | None = None) -> tuple[float, float]:
    entry = ranges()["rule" if basis == "rule" else backend]
    if basis != "rule" and kind is not None and kind in entry.get("kinds", {}):
        entry = entry["kinds"][kind]
    return entry["low"], entry["high"]


def range_basis(backend: str) -> str:
    return ranges()[backend]["basis"]


def predicted_range(n_bytes: int, backend: str, basis: str = "detailed", kind: str | None = None) -> tuple[int, int]:
    low, high = range_factors(backend, basis, kind)
    return int(math.floor(n_bytes * low)), int(math.ceil(n_bytes * high))


@lru_cache(maxsize=1)
def preference_ranges() -> dict:
    return json.loads(data_text("preference_ranges.json"))


def preference_range(n_bytes: int, mode: str, backend: str, counted: bool = False) -> tuple[int, int]:
    """`counted`: the estimate's logits buffers were counted on a miniature
    (mlxfit/measure/miniature.py), which has its own, narrower range."""
    ranges = preference_ranges()
    entry = ranges["counted"][mode] if counted and mode in ranges.get("counted", {}) else ranges["modes"][mode]
    low, high = entry["low"], entry["high"]
    if backend != "cpu":
        backend_low, backend_high = range_factors(backend)
        low, high = low * backend_low, high * backend_high
    return int(math.floor(n_bytes * low)), int(math.ceil(n_bytes * high))


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    at = (len(xs) - 1) * q
    lo = math.floor(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)
