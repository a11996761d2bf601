"""`mlxfit bench`: sweeps over training settings, and the search for the largest
batch size or sequence length that fits.

Pure logic over `plan.predict` and `parent.measure`: results come back as rows,
progress goes out through a callback, nothing is printed. The CSV log lives here
too (a file of results, not terminal output); mlxfit/render/bench.py draws.

Which measured figure is judged against the budget: `peak_with_load_bytes`, MLX's
own peak including the model load. It is what mlx-lm's trainer reports and what
the estimate predicts, so a search on the estimate and its measured confirmation
speak about the same quantity. The process's resident peak is reported beside it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

from ...errors import BadInput, MlxfitError
from ...estimate.plan import predict, training_for
from ...model.resolve import ModelInfo
from ...model.training import FINE_TUNE_TYPES, TrainingConfig
from ...units import format_size
from .. import parent as measuring
from .log import _ON, ESTIMATED, FAILED, FINAL, MEASURED, SKIPPED, UNKNOWN, Row, config_key
from .once import measure_once, speed

# Sweepable settings, outermost first: the order combinations are built in
# before they are sorted by predicted memory.
SWEEPS = ("method", "fine_tune_type", "num_layers", "batch_size", "max_seq_length", "rank", "grad_checkpoint")
METHODS = ("lora", "qlora", "full")

# --max: search units and how far the doubling may go before giving up.
SEARCH_UNITS = {"batch_size": 1, "max_seq_length": 32}
SEARCH_LIMIT_UNITS = 1 << 20
MAX_RUNS = 8


# --- combinations -----------------------------------------------------------


def parse_sweep(name: str, text) -> tuple:
    """'1,2,4' -> (1, 2, 4) for one sweepable setting; duplicates dropped, order kept."""
    flag = "--" + name.replace("_", "-")
    items = [t.strip().lower() for t in str(text).split(",")]
    if not items or any(not t for t in items):
        raise BadInput(f"{flag}: empty value in {text!r} (give values separated by commas, e.g. 1,2,4)")
    values = []
    for item in items:
        if name == "grad_checkpoint":
            if item not in _ON:
                raise BadInput(f"{flag} takes on,off, got {item!r}")
            value = _ON[item]
        elif name == "method":
            if item not in METHODS:
                raise BadInput(f"{flag} takes {','.join(METHODS)}, got {item!r}")
            value = item
        elif name == "fine_tune_type":
            if item not in FINE_TUNE_TYPES:
                raise BadInput(f"{flag} takes {','.join(FINE_TUNE_TYPES)}, got {item!r}")
            value = item
        else:
            try:
                value = int(item)
            except ValueError:
                raise BadInput(f"{flag} takes whole numbers separated by commas, got {item!r}") from None
        if value not in values:
            values.append(value)
    return tuple(values)


def combinations(model: ModelInfo, base: TrainingConfig, sweeps: dict) -> list[TrainingConfig]:
    """Every combination of the swept values over `base`, checked and deduplicated.

    `sweeps` maps names from SWEEPS to tuples of values. `method` works as in
    `mlxfit probe`: full sets the fine-tune type, qlora quantizes the base; LoRA
    on an already quantized model is QLoRA. Combinations that come out the same
    (method full with fine-tune types lora and dora) are kept once.
    """
    names = [n for n in SWEEPS if n in sweeps]
    out: list[TrainingConfig] = []
    for values in itertools.product(*(sweeps[n] for n in names)):
        chosen = dict(zip(names, values))
        method = chosen.pop("method", None)
        training = replace(base, **chosen)
        if method is not None:
            training = training_for(method, training)
        if model.quantized and training.fine_tune_type != "full":
            training = replace(training, quantize=True)
        if model.architecture is not None:
            training.layers_trained(model.architecture.num_layers)  # the error names both numbers
        if training not in out:
            out.append(training)
    return out


# --- the sweep --------------------------------------------------------------


@dataclass(frozen=True)
class Planned:
    training: TrainingConfig
    predicted_bytes: int  # with this machine's calibration, if any
    raw_predicted_bytes: int  # without: what a stored calibration measurement compares against
    action: str  # "measure" | "skip" | "estimate"


def plan_sweep(
    model: ModelInfo,
    trainings: list[TrainingConfig],
    usable_bytes: int,
    backend: str,
    calibration=None,
    measure_runs: bool = True,
    force: bool = False,
) -> list[Planned]:
    """Every combination with its prediction and what to do with it, by increasing prediction."""
    planned = []
    for training in trainings:
        predicted, _ = predict(model, training, backend, calibration)
        raw = predict(model, training, backend)[0] if calibration is not None else predicted
        if not measure_runs:
            action = "estimate"
        elif predicted > usable_bytes and not force:
            action = "skip"
        else:
            action = "measure"
        planned.append(Planned(training, predicted, raw, action))
    return sorted(planned, key=lambda p: p.predicted_bytes)


def reusable(stored: Row | None, action: str) -> bool:
    """--resume: a stored row stands unless this run would learn more than it holds."""
    if stored is None:
        return False
    return stored.status in FINAL or action != "measure"


def eta_seconds(walls: list[float], to_measure: int) -> float | None:
    """Time left: the mean wall time of the runs measured so far, times the runs left."""
    if not walls:
        return None
    return sum(walls) / len(walls) * to_measure


def measurement_row(model_id: str, planned: Planned, usable: int, m, wall: float) -> Row:
    steady = m.step_seconds[1:] or m.step_seconds
    return Row(
        model=model_id,
        training=planned.training,
        status=MEASURED,
        backend=m.backend,
        predicted_bytes=planned.predicted_bytes,
        usable_bytes=usable,
        measured_peak_bytes=m.peak_with_load_bytes,
        steps_peak_bytes=m.peak_bytes,
        process_peak_bytes=m.process_peak_bytes,
        cache_bytes=m.cache_bytes,
        tokens_per_second=speed(m),
        seconds_per_step=round(sum(steady) / len(steady), 4) if steady else None,
        steps=m.steps,
        wall_seconds=round(wall, 2),
        measured_by=m.method,
        reason=f"extrapolated from {m.slice['how']}" if m.method == "slice" else "",
    )


def run_sweep(
    model: ModelInfo,
    planned: list[Planned],
    usable_bytes: int,
    backend: str,
    stored: dict | None = None,
    timeout: float | None = None,
    steps: int = measuring.DEFAULT_MAX_STEPS,
    on_event: Callable[[dict], None] = lambda e: None,
    record: bool = True,
    local_usable_bytes: int | None = None,
    force: bool = False,
) -> Iterator[tuple[Row, bool]]:
    """Run the planned combinations in order; yield (row, fresh) for each.

    A run predicted over what this machine can hold (`local_usable_bytes`) is
    measured by slice, unless `force` asks for the whole run.

    `stored` maps config keys to rows from an earlier, interrupted sweep: those
    come back with fresh=False and are not run again (see `reusable`). A run that
    dies is a row with status failed and the sweep goes on; Ctrl-C stops it with
    KeyboardInterrupt after the rows already yielded. With `record`, each
    measurement is stored for calibration, as `mlxfit probe --measure` does.
    """
    stored = stored or {}
    todo = [(p, stored.get(config_key(model.id, p.training))) for p in planned]
    to_measure = sum(1 for p, old in todo if p.action == "measure" and not reusable(old, p.action))
    walls: list[float] = []
    for index, (p, old) in enumerate(todo, 1):
        if reusable(old, p.action):
            on_event({"event": "resumed", "index": index, "total": len(todo), "row": old})
            yield old, False
            continue
        on_event({
            "event": "combination", "index": index, "total": len(todo), "remaining": len(todo) - index,
            "training": p.training, "predicted_bytes": p.predicted_bytes, "action": p.action,
            "eta_seconds": eta_seconds(walls, to_measure),
        })
        if p.action != "measure":
            status = SKIPPED if p.action == "skip" else ESTIMATED
            reason = (
                f"predicted {format_size(p.predicted_bytes)} exceeds the {format_size(usable_bytes)} budget"
                if status == SKIPPED else ""
            )
            row = Row(model.id, p.training, status, backend, p.predicted_bytes, usable_bytes, reason=reason)
        else:
            tic = time.monotonic()
            by_slice = not force and local_usable_bytes is not None and p.predicted_bytes > local_usable_bytes
            m, failure = measure_once(model, p.training, steps, timeout, on_event, by_slice)
            wall = time.monotonic() - tic
            walls.append(wall)
            to_measure -= 1
            if m is None:
                status = UNKNOWN if failure.unknown else FAILED
                row = Row(model.id, p.training, status, backend, p.predicted_bytes, usable_bytes,
                          wall_seconds=round(wall, 2), reason=str(failure))
            else:
                row = measurement_row(model.id, p, usable_bytes, m, wall)
                if record and model.architecture is not None:
                    from ...estimate.calibration import architecture_key
                    from ...estimate.calibration import record as store

                    store(model.id, p.training.to_dict(), m.backend, p.raw_predicted_bytes, m.to_dict(),
                          architecture=architecture_key(model))
        on_event({"event": "row", "index": index, "total": len(todo), "row": row})
        yield row, True


# --- the largest batch size or sequence length ---------------------------


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

    cache: dict[int, int] = {}

    def predicted(v: int) -> int:
        if v not in cache:
            cache[v] = predict(model, with_value(v), backend, calibration)[0]
        return cache[v]

    start = largest(lambda v: predicted(v) <= target, unit)
    result = MaxResult(
        setting, training, backend, usable_bytes, margin, target, start,
        predicted(start) if start else None, start, measured=False,
    )
    if not measure_runs or start is None:
        return result

    runs: list[SearchRun] = []
    best, lowest_fail = None, None  # the largest value measured to fit, the smallest measured not to
    settled = False
    candidate = start
    while len(runs) < max_runs:
        on_event({"event": "search", "value": candidate, "run": len(runs) + 1, "predicted_bytes": predicted(candidate)})
        by_slice = local_usable_bytes is not None and predicted(candidate) > local_usable_bytes
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
