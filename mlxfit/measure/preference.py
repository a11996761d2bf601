"""Measure a DPO, CPO, ORPO or GRPO run with mlx-lm-lora's trainer, in a child
process (mlxfit/measure/preference_child.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import MlxfitError
from ..model.preference import PreferenceRun, require_extra
from ..model.resolve import ModelInfo


@dataclass(frozen=True)
class PreferenceMeasurement:
    peak_bytes: int
    step_peaks_bytes: tuple
    load_peak_bytes: int
    steps: int
    seconds: float
    compiled: bool
    completion_lengths: tuple  # GRPO: the longest completion of each step (trainer's metric)
    trainer_peaks_gb: tuple  # the trainer's own peak_memory per report (mx.get_peak_memory / 1e9)

    def to_dict(self) -> dict:
        return asdict(self)


def request_for(model: ModelInfo, run: PreferenceRun, length: int, prompt_length: int | None, steps: int) -> dict:
    if model.config is None:
        raise MlxfitError(f"{model.id} is a bare size with no architecture to build: measure a catalog id or a folder")
    return {
        "config": model.config,
        "training": run.training.to_dict(),
        "run": run.to_dict(),
        "reference": run.has_reference,
        "length": length,
        "prompt_length": prompt_length,
        "vocab_size": model.architecture.vocab_size,
        "steps": steps,
    }


def measure(model: ModelInfo, run: PreferenceRun, length: int, prompt_length: int | None = None, steps: int = 3,
            timeout: float | None = None, on_event=lambda e: None) -> PreferenceMeasurement:
    require_extra(f"--measure with --train-mode {run.mode}")
    from .parent import run_child

    done = run_child(request_for(model, run, length, prompt_length, steps), timeout, on_event,
                     module="mlxfit.measure.preference_child")
    m = done["measured"]
    return PreferenceMeasurement(**{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()})
