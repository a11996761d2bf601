"""`bench --max`: the largest batch size or sequence length whose peak stays within the
budget, answered by the estimate and confirmed by as few measured runs as it can."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from ...errors import BadInput, MlxfitError
from ...estimate.lengths import SEARCH_LIMIT_UNITS, largest
from ...estimate.plan import predict
from ...estimate.sizing import judged
from ...estimate.verdict import Verdict
from ...model.resolve import ModelInfo
from ...model.runconfig import hard_context
from ...model.training import TrainingConfig
from .. import parent as measuring
from ..slicing import slice_needed
from .once import measure_once, speed

# --max: search units and how far the doubling may go before giving up.
SEARCH_UNITS = {"batch_size": 1, "max_seq_length": 32}
MAX_RUNS = 8


@dataclass(frozen=True)
class SearchRun:
    """One measured run of the search."""

    value: int
    predicted_bytes: int
    fits: bool | None  # None: unknown (the measurement timed out)
    measured_peak_bytes: int | None = None
    process_peak_bytes: int | None = None
    tokens_per_second: float | None = None
    reason: str = ""
    measured_by: str | None = None  # "full" or "slice"

    def to_dict(self) -> dict:
        return {
            "value": self.value, "predicted_bytes": self.predicted_bytes, "fits": self.fits,
            "measured_peak_bytes": self.measured_peak_bytes, "process_peak_bytes": self.process_peak_bytes,
            "tokens_per_second": self.tokens_per_second, "measured_by": self.measured_by, "reason": self.reason,
        }


@dataclass(frozen=True)
class MaxResult:
    setting: str  # batch_size | max_seq_length
    training: TrainingConfig  # the other settings (the searched one at its default)
    backend: str
    usable_bytes: int
    margin: float
    target_bytes: int  # usable less the margin: what "fits" means here
    estimate_value: int | None  # the estimate's answer
    estimate_bytes: int | None
    value: int | None  # the answer: confirmed by measurement unless estimate-only
    measured: bool
    settled: bool = False  # the measured runs found the limit (not cut off after max_runs)
    runs: tuple[SearchRun, ...] = field(default=())
    # probe's verdict on the estimate's answer: its range against the whole budget, margin aside
    estimate_verdict: Verdict | None = None

    @property
    def unknown(self) -> bool:
        """A timed-out run left the limit unknown: the answer is a lower bound."""
        return any(r.fits is None for r in self.runs) and not self.settled

    @property
    def answer_run(self) -> SearchRun | None:
        return next((r for r in self.runs if r.value == self.value and r.fits), None)

    def to_dict(self) -> dict:
        run = self.answer_run
        return {
            "setting": self.setting,
            "value": self.value,
            "measured": self.measured,
            "settled": self.settled,
            "unknown": self.unknown,
            "measured_peak_bytes": run.measured_peak_bytes if run else None,
            "measured_runs": len(self.runs),
            "estimate_value": self.estimate_value,
            "estimate_bytes": self.estimate_bytes,
            "estimate_verdict": self.estimate_verdict and self.estimate_verdict.value,
            "target_bytes": self.target_bytes,
            "usable_bytes": self.usable_bytes,
            "margin": self.margin,
            "backend": self.backend,
            "training": replace(self.training, **{self.setting: self.value}).to_dict() if self.value else self.training.to_dict(),
            "runs": [r.to_dict() for r in self.runs],
        }


def _corrector(runs: list[SearchRun]) -> Callable[[int], float]:
    """Predicted bytes -> expected measured bytes, from the runs measured so far.

    One run: scale the estimate by its measured/predicted ratio. Two or more: the
    line through the last two distinct runs (a secant), which is exact when the
    estimate is off by a constant, a factor, or both. Needs one run with a figure.
    """
    points = [(r.predicted_bytes, r.measured_peak_bytes) for r in runs if r.measured_peak_bytes]
    p2, m2 = points[-1]
    earlier = [(p, m) for p, m in points[:-1] if p != p2]
    if earlier:
        p1, m1 = earlier[-1]
        slope = (m2 - m1) / (p2 - p1)
        if slope > 0:
            return lambda p: m2 + (p - p2) * slope
    return lambda p: p * m2 / p2


def find_max(
    model: ModelInfo,
    training: TrainingConfig,
    setting: str,
    usable_bytes: int,
    backend: str,
    margin: float = 0.1,
    calibration=None,
    measure_runs: bool = True,
    timeout: float | None = None,
    steps: int = measuring.DEFAULT_MAX_STEPS,
    on_event: Callable[[dict], None] = lambda e: None,
    max_runs: int = MAX_RUNS,
    local_usable_bytes: int | None = None,
) -> MaxResult:
    """The largest `setting` whose peak stays within the budget less `margin`.

    The estimate answers first (doubling then bisection; sequence lengths in
    multiples of 32). Measurement then confirms with as few runs as it can: the
    estimate's answer; if it does not fit, step down; if it fits and the
    estimate, corrected by what was measured, leaves room, go up. How far each
    step goes is that corrected estimate's answer (see `_corrector`), kept
    between the largest value measured to fit and the smallest measured not
    to, so a few runs settle it even when the estimate is off by several steps.
    A candidate predicted over what this machine can hold (`local_usable_bytes`:
    a budget larger than this machine's) is measured by slice.
    """
    if setting not in SEARCH_UNITS:
        raise BadInput(f"--max takes {' or '.join(SEARCH_UNITS)}, got {setting!r}")
    if model.architecture is None:
        raise MlxfitError(f"{model.id} is a bare size: its estimate does not depend on {setting}; give a model with an architecture")
    unit = SEARCH_UNITS[setting]
    target = int(usable_bytes * (1 - margin))

    def with_value(v: int) -> TrainingConfig:
        return replace(training, **{setting: v})

    cache: dict[int, tuple] = {}

    def predicted(v: int) -> int:
        if v not in cache:
            cache[v] = predict(model, with_value(v), backend, calibration)
        return cache[v][0]

    context = hard_context(model) if setting == "max_seq_length" else None  # probe refuses a longer one
    start = largest(lambda v: (context is None or v <= context) and predicted(v) <= target, unit)
    result = MaxResult(
        setting, training, backend, usable_bytes, margin, target, start,
        predicted(start) if start else None, start, measured=False,
        estimate_verdict=judged(cache[start][0], with_value(start), backend, usable_bytes, cache[start][1])
        if start else None,
    )
    if not measure_runs or start is None:
        return result

    runs: list[SearchRun] = []
    best, lowest_fail = None, None  # the largest value measured to fit, the smallest measured not to
    settled = False
    candidate = start
    while len(runs) < max_runs:
        on_event({"event": "search", "value": candidate, "run": len(runs) + 1, "predicted_bytes": predicted(candidate)})
        by_slice = slice_needed(predicted(candidate), local_usable_bytes)
        m, failure = measure_once(model, with_value(candidate), steps, timeout, on_event, by_slice)
        if m is None and failure.unknown:
            # Timed out: whether it fits is unknown, so it bounds nothing. Stop
            # here: the answer is the largest value measured to fit, unsettled.
            runs.append(SearchRun(candidate, predicted(candidate), None, reason=str(failure)))
            on_event({"event": "search_run", "run": runs[-1]})
            break
        if m is None:
            run = SearchRun(candidate, predicted(candidate), False, reason=str(failure))
        else:
            peak = m.peak_with_load_bytes
            run = SearchRun(candidate, predicted(candidate), peak <= target, peak, m.process_peak_bytes, speed(m),
                            measured_by=m.method)
        runs.append(run)
        on_event({"event": "search_run", "run": run})
        if run.fits:
            best = candidate if best is None else max(best, candidate)
        else:
            lowest_fail = candidate if lowest_fail is None else min(lowest_fail, candidate)
        if lowest_fail is not None and lowest_fail - (best or 0) == unit:
            settled = True  # measured on both sides of the limit
            break
        # The next guess: the largest value the estimate, corrected by what was measured, lets fit.
        if run.measured_peak_bytes is None:  # it died: no figure to correct by, so bisect
            guess = max(unit, ((best or 0) + candidate) // 2 // unit * unit)
        else:
            corrected = _corrector(runs)
            guess = largest(lambda v: corrected(predicted(v)) <= target, unit) or 0
        if run.fits:
            if guess < candidate + unit:
                settled = True  # no room for one more, by the corrected estimate
                break
            if lowest_fail is not None and guess >= lowest_fail:
                # The estimate is contradicted by a run that did not fit: bisect.
                guess = (best + lowest_fail) // 2 // unit * unit
            candidate = guess if lowest_fail is None else min(guess, lowest_fail - unit)
        else:
            candidate = max(min(guess, candidate - unit), (best or 0) + unit)
    return replace(result, value=best, measured=True, settled=settled, runs=tuple(runs))
