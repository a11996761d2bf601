"""How long a whole mlx_lm.lora run takes: its iterations, each the step time of
its batch's width, the validation passes, the saves, and compiling the step once
for each distinct batch width.

mlx_lm/tuner/trainer.py train() runs `iters` batches, drawn in a random order of
the batches iterate_batches cut (sorted, padded per batch), so with --data the
mean step is over the real widths of the batches (DataStats.batch_widths); without
it every batch is taken at the length planned for (the worst case). It evaluates
at iteration 1, every steps_per_eval and at the last: val_batches batches of
valid.jsonl (every batch at -1), a forward pass each. It saves the trainable
weights every save_every iterations. Pure functions: they return data.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from .step_time import Speed, StepTime, evaluation_seconds, step_time

# mlx_lm/lora.py CONFIG_DEFAULTS (pinned by tests/test_estimate_step_time.py against the installed source)
ITERS = 1000
VAL_BATCHES = 25
STEPS_PER_EVAL = 200
SAVE_EVERY = 100
# mlx_lm_lora/train.py: iters None (and no epochs) takes SFTTrainingArgs().iters
# (mlx_lm_lora/trainer/sft_trainer.py; pinned by tests/test_estimate_step_time.py).
PREFERENCE_ITERS = 100
# mlx_lm/tuner/trainer.py compiles its step with mx.compile, which traces and compiles it again
# for every new shape of its inputs: each distinct batch width compiles once, counted as this many
# steps of that width more. A guide, not measured on a Mac: on this CPU a new width's first step
# took 0.2-1.4 steady steps more (a Llama with every linear adapted, 2-32 blocks, widths 33-129),
# and a width seen before none (benchmarks/results/compile_cost.md).
COMPILE_STEPS = 1
SAVE_BYTES_PER_SECOND = 1e9  # an SSD writing the adapters: a guide, rarely a visible share


@dataclass(frozen=True)
class RunTime:
    iters: int
    step: StepTime  # at the widest batch (the step planned for)
    mean_step_seconds: float  # over the run's batches (their real widths with --data)
    validation_seconds: float
    evaluations: int
    save_seconds: float
    compile_seconds: float
    speed: Speed
    from_data: bool  # mean over --data's batch widths, not the worst case

    @property
    def train_seconds(self) -> float:
        return self.iters * self.mean_step_seconds

    @property
    def seconds(self) -> float:
        return self.train_seconds + self.validation_seconds + self.save_seconds + self.compile_seconds

    @property
    def range(self) -> tuple[float, float]:
        low, high = self.speed.range
        return self.seconds * low, self.seconds * high

    def to_dict(self) -> dict:
        return {
            "step_seconds": round(self.mean_step_seconds, 4),
            "run_seconds": round(self.seconds, 1),
            "range": [round(x, 1) for x in self.range],
            "basis": self.speed.basis,
            "iters": self.iters,
            "widest_step": self.step.to_dict(),
            "train_seconds": round(self.train_seconds, 1),
            "validation_seconds": round(self.validation_seconds, 1),
            "evaluations": self.evaluations,
            "save_seconds": round(self.save_seconds, 1),
            "compile_seconds": round(self.compile_seconds, 1),
            "from_data": self.from_data,
            **({"corrected_by": self.speed.correction} if self.speed.correction else {}),
        }


def evaluations(iters: int, steps_per_eval: int) -> int:
    """How many times train() evaluates: at 1, every steps_per_eval, and at the last."""
    multiples = iters // steps_per_eval  # counted, not listed: a plan may time 10^11 iterations
    return multiples + (steps_per_eval != 1) + (iters != 1 and iters % steps_per_eval != 0)


def width_steps(model: ModelInfo, training: TrainingConfig, speed: Speed, widths) -> tuple[dict, dict]:
    """({width: its step's seconds}, {width: batches of that width}), each distinct width timed once."""
    import numpy as np

    values, counts = np.unique(np.asarray(widths), return_counts=True)
    seconds = {int(w): step_time(model, training, speed, int(w)).seconds for w in values}
    return seconds, {int(w): int(n) for w, n in zip(values, counts)}


def run_time(model: ModelInfo, training: TrainingConfig, speed: Speed, *, iters: int = ITERS,
             length: int | None = None, widths=None, val_batches: int = VAL_BATCHES,
             steps_per_eval: int = STEPS_PER_EVAL, save_every: int = SAVE_EVERY, valid_width: int | None = None,
             valid_batches: int | None = None) -> RunTime:
    """The whole run. `length`: the widest batch (default max_seq_length); `widths`: every
    batch's width (--data); `valid_width`/`valid_batches`: valid.jsonl's widest batch and
    how many batches it makes (default: the training length, val_batches batches)."""
    from .detailed import counted_totals

    iters = max(int(iters), 1)
    step = step_time(model, training, speed, length)
    if widths is None or len(widths) == 0:
        mean, compiling = step.seconds, COMPILE_STEPS * step.seconds  # every batch at the planned width
    else:
        seconds, batches = width_steps(model, training, speed, widths)
        mean = sum(seconds[w] * n for w, n in batches.items()) / sum(batches.values())
        compiling = COMPILE_STEPS * sum(seconds.values())  # once for each distinct width
    n_eval = evaluations(iters, max(int(steps_per_eval), 1)) if val_batches else 0
    per_eval = val_batches if val_batches > 0 else (valid_batches or 0)
    if valid_batches is not None and val_batches > 0:
        per_eval = min(val_batches, valid_batches)
    eval_width = valid_width or length or training.max_seq_length
    validation = n_eval * per_eval * evaluation_seconds(model, training, speed, eval_width)
    saves = iters // max(int(save_every), 1) + 1  # and the final weights
    save = saves * counted_totals(model, training)[2] / SAVE_BYTES_PER_SECOND
    return RunTime(iters, step, mean, validation, n_eval, save, compiling, speed,
                   from_data=widths is not None and len(widths) > 0)


def preference_run_time(model: ModelInfo, training: TrainingConfig, step: StepTime, speed: Speed,
                        iters: int = PREFERENCE_ITERS, save_every: int = SAVE_EVERY) -> RunTime:
    """An mlx_lm_lora.train run: `iters` steps of `step` (step_time.preference_step_time,
    every batch at its widest), the saves and the first step's compiling; its validation
    passes are not counted."""
    from .detailed import counted_totals

    iters = max(int(iters), 1)
    saves = iters // max(int(save_every), 1) + 1
    save = saves * counted_totals(model, training)[2] / SAVE_BYTES_PER_SECOND
    return RunTime(iters, step, step.seconds, 0.0, 0, save, COMPILE_STEPS * step.seconds, speed, from_data=False)
