"""Sizing one candidate run: the detailed estimate of a model at some settings and
the verdict probe gives it, and the catalog's models to size.

Below both the plan (mlxfit/estimate/plan.py) and its remedies
(mlxfit/estimate/remedies.py): both import this module, it imports neither. Pure
functions: they return data and never print.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import MlxfitError
from ..model.resolve import ModelInfo, original_weights
from ..model.training import TrainingConfig
from .detailed import Breakdown, estimate
from .rule import rule_bytes
from .uncertainty import run_kind
from .unverified import spanned_range, with_unverified
from .verdict import Verdict, judge

CALIBRATION_PART = "calibration"
# mlx_lm/lora.py train_model, fine_tune_type full: `l.unfreeze()` on each trained block
# unfreezes a QuantizedLinear's packed weight, scales and biases too, and MLX has no
# gradient for quantized weights (tests/test_probe_no_dead_end.py runs it).
FULL_ON_QUANTIZED = ("mlx-lm cannot fully fine-tune a quantized base: its blocks' quantized weights are unfrozen "
                     "too, and MLX has no gradient for them ([QuantizedMatmul::vjp] no gradient wrt the quantized "
                     "weights)")


@dataclass(frozen=True)
class CatalogSize:
    id: str
    params: int
    model_type: str
    moe: bool
    family: str = ""

    @property
    def maker(self) -> str:
        """The hub organisation: Qwen, meta-llama, google, ..."""
        return self.id.split("/")[0]


@lru_cache(maxsize=1)
def catalog_sizes() -> tuple[CatalogSize, ...]:
    """Every catalog model's size, from the catalog's data (nothing built)."""
    from ..model.resolve import catalog_entries, family, text_config

    return tuple(
        CatalogSize(e["id"], e["params"], text_config(e["config"]).get("model_type") or e["config"]["model_type"],
                    e["moe"], e.get("family") or family(e["id"]))
        for e in catalog_entries()
    )


@lru_cache(maxsize=None)
def catalog_model(hub_id: str) -> ModelInfo:
    """A catalog model with its architecture, built once per process, when asked."""
    from ..model.resolve import from_catalog

    return from_catalog(hub_id)


def training_for(method: str, training: TrainingConfig) -> TrainingConfig:
    """The user's run, switched to another method (all other settings kept)."""
    if method == "full":
        return replace(training, fine_tune_type="full", quantize=False)
    fine_tune_type = "lora" if training.fine_tune_type == "full" else training.fine_tune_type
    return replace(training, fine_tune_type=fine_tune_type, quantize=(method == "qlora"))


def predict(model: ModelInfo, training: TrainingConfig, backend: str, calibration=None, length: int | None = None,
            runtime=None) -> tuple[int, Breakdown | None]:
    """The detailed estimate where the architecture is known, else the rule.

    `calibration` (from mlxfit.estimate.calibration) adds this machine's measured gap;
    `length` is the widest batch of the user's data (capped by max_seq_length);
    `runtime` the MLX versions' behaviour (mlxfit/runtime.py; None: installed)."""
    if model.architecture is None:
        return rule_bytes(training.method, model.params), None
    if training.fine_tune_type == "full" and model.quantized:
        # mlx-lm's full fine-tuning cannot run on a quantized base (FULL_ON_QUANTIZED):
        # what a full fine-tune needs is sized on the original weights.
        original = original_weights(model)
        if original is None:
            raise MlxfitError(FULL_ON_QUANTIZED)
        model = original
    breakdown = estimate(model, training, backend, length, runtime)
    offset = calibration.offset_for(model, training, length) if calibration is not None else None
    if offset is not None:
        breakdown = breakdown.with_part(CALIBRATION_PART, offset)
    breakdown = with_unverified(breakdown, training)
    return breakdown.peak_bytes, breakdown


def sized(model: ModelInfo, training: TrainingConfig, backend: str, usable_bytes: int, calibration=None,
          length: int | None = None) -> tuple[int, Verdict]:
    """(predicted peak bytes, verdict) of one candidate run, judged as probe judges
    the run itself: by the estimate's range on this backend against the budget."""
    need, breakdown = predict(model, training, backend, calibration, length)
    return need, judged(need, training, backend, usable_bytes, breakdown)


def run_range(need: int, training: TrainingConfig, backend: str, breakdown: Breakdown | None = None) -> tuple[int, int]:
    """The range of an estimate already made: its spread on this backend, for this kind of run,
    over the presence and absence of what it counts unverified (`breakdown`'s, when given)."""
    return spanned_range(need, breakdown, backend, run_kind(training.fine_tune_type, training.grad_checkpoint))


def judged(need: int, training: TrainingConfig, backend: str, usable_bytes: int, breakdown: Breakdown | None = None) -> Verdict:
    """probe's verdict on an estimate already made: its range against the budget."""
    return judge(*run_range(need, training, backend, breakdown), usable_bytes)
