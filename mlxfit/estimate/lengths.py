"""The longest examples that fit: the first answer without data.

mlx-lm pads each batch to its longest example (mlx_lm/tuner/trainer.py
iterate_batches), not to --max-seq-length, so a run without --data sized at
max_seq_length is the worst case: every batch full length. What a user can act
on first is how long their examples may be, per method, at the run's batch.
Pure functions over a Plan: they return data and never print.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..errors import MlxfitError
from .plan import Plan
from .sizing import sized, training_for

LENGTH_UNIT = 32  # lengths are answered in multiples of this (as bench --max max_seq_length)
SEARCH_LIMIT_UNITS = 1 << 20  # how far the doubling may go before giving up


@dataclass(frozen=True)
class LongestFit:
    method: str
    tokens: int | None  # the longest examples that fit; None: not even LENGTH_UNIT tokens
    max_seq_length: int
    batch_size: int

    @property
    def every_length(self) -> bool:
        """The worst case itself fits: every example up to max_seq_length."""
        return self.tokens is not None and self.tokens >= self.max_seq_length

    def to_dict(self) -> dict:
        return {"method": self.method, "tokens": self.tokens, "max_seq_length": self.max_seq_length,
                "batch_size": self.batch_size, "every_length": self.every_length}


def largest(fits: Callable[[int], bool], unit: int, limit_units: int = SEARCH_LIMIT_UNITS) -> int | None:
    """The largest multiple of `unit` for which `fits` holds, assuming it holds up
    to some point and never after: doubling, then bisection. None if not even `unit`."""
    if not fits(unit):
        return None
    k = 1
    while fits(2 * k * unit):
        k *= 2
        if k >= limit_units:
            raise MlxfitError(
                f"the estimate still fits at {k * unit:,}: no limit found (is the budget right?)"
            )
    lo, hi = k, 2 * k  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * unit):
            lo = mid
        else:
            hi = mid
    return lo * unit


def longest_examples(plan: Plan) -> tuple[LongestFit, ...]:
    """Per method of the plan's rows, the longest examples (a multiple of LENGTH_UNIT,
    at most max_seq_length) whose batch fits the budget by the same promise as a
    row's "fits": the high end of the estimate's range within the budget. Empty
    without an architecture (the rule of thumb does not count lengths)."""
    if plan.model.architecture is None:
        return ()
    return tuple(_longest(plan, e.method) for e in plan.estimates if not e.cannot)


def _longest(plan: Plan, method: str) -> LongestFit:
    training = training_for(method, plan.training)
    usable, top = plan.machine.usable_bytes, training.max_seq_length

    def fits(length: int) -> bool:
        _, verdict = sized(plan.model, replace(training, max_seq_length=length), plan.backend, usable, plan.calibration)
        return verdict.fits

    found = LongestFit(method, None, top, training.batch_size)
    if fits(top):
        return replace(found, tokens=top)
    return replace(found, tokens=largest(lambda length: length < top and fits(length), LENGTH_UNIT))
