"""bench --train-mode dpo, cpo, orpo, grpo: the sweep of mlx-lm-lora runs.

The counterpart of sweep.py for mlx-lm-lora's modes: every combination of the swept
settings resolved as mlx_lm_lora.train resolves its flags (mlxfit/model/preference.py),
each with the preference estimate (estimate_run: the peak and its phase) and, when
measuring, mlx-lm-lora's own trainer in a child process (mlxfit/measure/preference.py).
Such a run cannot be measured by slice: one this machine cannot hold is not measured
at all (the caller's `refuse`, mlxfit.answer_preference's rule, says which), even with
--force. Nothing is stored for calibration (probe --measure stores none for these modes).

Rows are `PreferenceRow`s: a Row with the run's mode and knobs as more CSV columns, so
an SFT log keeps exactly its old columns and a preference log is a file of its own.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterator

from ...errors import MlxfitError
from ...estimate.preference import PreferenceEstimate, estimate_run
from ...estimate.uncertainty import preference_range
from ...model.preference import PreferenceRun, resolve_run
from ...model.resolve import ModelInfo
from ...units import format_size
from .log import _ON, COLUMNS, ESTIMATED, FAILED, MEASURED, SKIPPED, UNKNOWN, Row, config_key
from .once import attempt
from .sweep import walk

# What the preference modes sweep, outermost first (no --method: mlx-lm-lora takes
# --train-type and --load-in-4bits); the completion length is GRPO's alone.
PREFERENCE_SWEEPS = ("fine_tune_type", "num_layers", "batch_size", "max_seq_length", "rank", "grad_checkpoint",
                     "max_completion_length")
# The run's own settings, after the SFT configuration columns in the key.
RUN_COLUMNS = ("train_mode", "beta", "reference_model_path", "grpo_group_size", "max_completion_length",
               "efficient_long_context", "prompt_length")
PREFERENCE_COLUMNS = COLUMNS + RUN_COLUMNS + ("peak_phase",)
# Steps measured, as probe --measure measures these modes (mlxfit/answer_preference.py).
MOST_STEPS = 4


def _run_config(run: PreferenceRun) -> dict:
    return {
        "train_mode": run.mode,
        "beta": run.beta,
        "reference_model_path": run.reference_model_path,
        "grpo_group_size": run.group_size,
        "max_completion_length": run.max_completion_length,
        "efficient_long_context": run.efficient_long_context,
        "prompt_length": run.prompt_length,
    }


def preference_key(model_id: str, run: PreferenceRun) -> tuple:
    return config_key(model_id, run.training) + tuple(_run_config(run).values())


@dataclass(frozen=True)
class PreferenceRow(Row):
    """A Row of an mlx-lm-lora run: `training` is the run's TrainingConfig, `run` the
    whole run; `predicted_bytes` is the estimate's peak, `peak_phase` its phase."""

    columns = PREFERENCE_COLUMNS

    run: PreferenceRun | None = None
    peak_phase: str = ""
    counted: bool = False  # the estimate's logits buffers counted on a miniature (not a CSV column)

    @property
    def key(self) -> tuple:
        return preference_key(self.model, self.run)

    @property
    def predicted_range_bytes(self) -> tuple[int, int]:
        """The estimate's range on its mode's evidence (what its verdict is judged on)."""
        return preference_range(self.predicted_bytes, self.run.mode, self.backend, counted=self.counted)

    def to_dict(self) -> dict:
        data = super().to_dict()
        data.update(_run_config(self.run))
        data["peak_phase"] = self.peak_phase
        data["predicted_range_bytes"] = list(self.predicted_range_bytes)
        data["run"] = self.run.to_dict()
        return data

    @classmethod
    def from_csv(cls, record: dict) -> "PreferenceRow":
        """Read back as mlx_lm_lora.train would resolve the same flags."""
        base = Row.from_csv(record)
        bits = int(record["bits"])
        flags = {
            "fine_tune_type": record["fine_tune_type"],
            "num_layers": int(record["num_layers"]),
            "batch_size": int(record["batch_size"]),
            "max_seq_length": int(record["max_seq_length"]),
            "rank": int(record["rank"]),
            "grad_checkpoint": _ON[record["grad_checkpoint"].strip().lower()],
            "optimizer": record["optimizer"],
            "beta": float(record["beta"]),
            "reference_model_path": record["reference_model_path"] or None,
            "rl_group_size": int(record["grpo_group_size"]),
            "max_completion_length": int(record["max_completion_length"]),
            "efficient_long_context": _ON[record["efficient_long_context"].strip().lower()],
        }
        if record["method"] == "qlora":
            flags[f"load_in_{bits}bits"] = True
        run = resolve_run(record["train_mode"], flags, {})
        prompt = (record.get("prompt_length") or "").strip()
        run = replace(run, prompt_length=int(prompt) if prompt else None)
        kept = {f.name: getattr(base, f.name) for f in fields(Row)}
        return cls(**{**kept, "training": run.training}, run=run, peak_phase=record.get("peak_phase") or "")


def combinations(model: ModelInfo, mode: str, flags: dict, sweeps: dict) -> list[PreferenceRun]:
    """Every combination of the swept values, each resolved as mlx_lm_lora.train
    resolves its flags (`flags`: the others, None where not given, in the names of
    resolve_run); the number of layers checked against the model; duplicates dropped."""
    names = [n for n in PREFERENCE_SWEEPS if n in sweeps]
    out: list[PreferenceRun] = []
    for values in itertools.product(*(sweeps[n] for n in names)):
        run = resolve_run(mode, {**flags, **dict(zip(names, values))}, {})
        if run.spec.rollout:
            run = replace(run, prompt_length=flags.get("prompt_length"))
        run.training.layers_trained(model.architecture.num_layers)  # the error names both numbers
        if run not in out:
            out.append(run)
    return out


@dataclass(frozen=True)
class PlannedRun:
    run: PreferenceRun
    estimate: PreferenceEstimate
    action: str  # "measure" | "skip" | "estimate"
    reason: str = ""  # why it is skipped

    @property
    def training(self):
        return self.run.training

    @property
    def predicted_bytes(self) -> int:
        return self.estimate.peak_bytes


def miniature_shapes(model: ModelInfo, runs: list[PreferenceRun]) -> list:
    """(model, run, length) of each run, for mlxfit/measure/miniature.py to count."""
    return [(model, run, run.training.max_seq_length) for run in runs]


def plan(
    model: ModelInfo,
    runs: list[PreferenceRun],
    usable_bytes: int,
    backend: str,
    measure_runs: bool = True,
    force: bool = False,
    reference: ModelInfo | None = None,
    refuse: Callable[[PreferenceRun, PreferenceEstimate], None] = lambda run, estimate: None,
    miniatures: bool = False,
) -> list[PlannedRun]:
    """Every run with its estimate and what to do with it, by increasing estimate.

    As for SFT, a run predicted over `usable_bytes` is skipped unless `force`; and one
    that `refuse` rejects (it raises MlxfitError: this machine cannot hold it, so it
    could only be measured by slice, which these trainers cannot be) is skipped even
    with `force`, with the refusal as its reason. `miniatures`: as for
    mlxfit.estimate.preference.estimate_run."""
    from ..miniature import logits_buffers_many

    logits_buffers_many(miniature_shapes(model, runs), miniatures=miniatures)  # in one process (if not yet)
    planned = []
    for run in runs:
        e = estimate_run(model, run, backend, None, reference, run.prompt_length, miniatures=miniatures)
        action, reason = ("measure" if measure_runs else "estimate"), ""
        if measure_runs and e.peak_bytes > usable_bytes and not force:
            action = "skip"
            reason = f"predicted {format_size(e.peak_bytes)} exceeds the {format_size(usable_bytes)} budget"
        elif measure_runs:
            try:
                refuse(run, e)
            except MlxfitError as err:
                action, reason = "skip", str(err)
        planned.append(PlannedRun(run, e, action, reason))
    return sorted(planned, key=lambda p: p.predicted_bytes)


def measurement_row(model_id: str, p: PlannedRun, usable: int, m, wall: float) -> PreferenceRow:
    """The trainer's peak over its steps (what probe --measure reports); no speed: the
    child times the steps together, the first one's compilation included."""
    return PreferenceRow(
        model=model_id,
        training=p.training,
        status=MEASURED,
        backend=p.estimate.backend,
        predicted_bytes=p.predicted_bytes,
        usable_bytes=usable,
        measured_peak_bytes=m.peak_bytes,
        steps_peak_bytes=m.peak_bytes,
        steps=m.steps,
        wall_seconds=round(wall, 2),
        measured_by="full",
        reason="" if m.compiled else "measured with compilation off (CPO's compiled step fails on this MLX)",
        run=p.run,
        peak_phase=p.estimate.peak.name,
        counted=p.estimate.logits_buffers is not None,
    )


def run_sweep(
    model: ModelInfo,
    planned: list[PlannedRun],
    usable_bytes: int,
    backend: str,
    stored: dict | None = None,
    timeout: float | None = None,
    steps: int = MOST_STEPS,
    on_event: Callable[[dict], None] = lambda e: None,
) -> Iterator[tuple[PreferenceRow, bool]]:
    """Run the planned runs in order; yield (row, fresh) for each, as sweep.run_sweep
    does (stored rows reused, a run that dies a failed row, a timed-out one unknown,
    Ctrl-C a KeyboardInterrupt)."""
    from ..preference import measure

    stored = stored or {}

    def row_for(p: PlannedRun) -> PreferenceRow:
        common = dict(model=model.id, training=p.training, backend=backend, predicted_bytes=p.predicted_bytes,
                      usable_bytes=usable_bytes, run=p.run, peak_phase=p.estimate.peak.name,
                      counted=p.estimate.logits_buffers is not None)
        if p.action != "measure":
            return PreferenceRow(status=SKIPPED if p.action == "skip" else ESTIMATED, reason=p.reason, **common)
        tic = time.monotonic()
        m, failure = attempt(lambda: measure(model, p.run, p.estimate.length, prompt_length=p.estimate.prompt_length,
                                             steps=min(steps, MOST_STEPS), timeout=timeout, on_event=on_event))
        wall = time.monotonic() - tic
        if m is None:
            return PreferenceRow(status=UNKNOWN if failure.unknown else FAILED, wall_seconds=round(wall, 2),
                                 reason=str(failure), **common)
        return measurement_row(model.id, p, usable_bytes, m, wall)

    todo = [(p, stored.get(preference_key(model.id, p.run))) for p in planned]
    yield from walk(todo, row_for, on_event, training=lambda p: p.run)

