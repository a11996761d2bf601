"""What each of the plan's runs costs in time: the plan, its alternatives and every
single change timed as a whole run, beside the run as given.

The remedies are searched on memory (remedies.py); their time is added here, where a
speed is known, by a function the caller passes in: `run_seconds(model, training,
iters)`, the whole run's seconds (answer.py times it as it times the run itself).
Every run is timed over the same data: a smaller batch with more accumulation steps
keeps the effective batch, and mlx-lm's `iters` counts batches (mlx_lm/tuner/trainer.py
train(): one batch an iteration, the update every grad_accumulation_steps), so it is
timed for the iterations that see the same examples (batch 4 for 1,000 iterations:
batch 1 for 4,000). Pure functions: they return data and never print.
"""

from __future__ import annotations

from dataclasses import replace

from ..model.training import TrainingConfig


def same_examples_iters(given: TrainingConfig, changed: TrainingConfig, iters: int) -> int:
    """The iterations of `changed` that see the examples `iters` iterations of `given` see."""
    return max(1, round(iters * given.batch_size / changed.batch_size))


def batch_widths_for(stats, training: TrainingConfig) -> tuple | None:
    """--data's batch widths for a changed run: the same batches cut at a shorter
    --max-seq-length, or the examples batched anew (sorted by length) at another
    --batch-size; None without --data."""
    if stats is None or not len(stats.batch_widths):
        return None
    if training.batch_size == stats.batch_size:
        return tuple(min(w, training.max_seq_length) for w in stats.batch_widths)
    from ..model.dataset import batch_widths

    return batch_widths(stats.lengths, training.batch_size, training.max_seq_length) or None


def timed_plan(plan, run_seconds, iters: int, seconds_now: float):
    """The plan with each option's and each sized remedy's run time, and the run's own
    (`seconds_now`): `run_seconds(model, training, iters)` times one run."""
    def timed(option):
        n = same_examples_iters(plan.training, option.training, iters)
        return replace(option, run_seconds=run_seconds(option.model, option.training, n), iters=n)

    options = tuple(timed(o) for o in plan.options)
    found = []
    for remedy in plan.remedies:
        if remedy.option is not None:
            option = timed(remedy.option)
            remedy = replace(remedy, option=option, run_seconds=option.run_seconds, iters=option.iters)
        found.append(remedy)
    return replace(plan, options=options, remedies=tuple(found), run_seconds=seconds_now, run_iters=iters)
