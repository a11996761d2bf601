"""bench's sweep: every combination of the swept settings, planned by increasing
prediction, then run in order, the rows of an interrupted sweep reused (--resume)."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ...errors import BadInput
from ...estimate.plan import predict, training_for
from ...estimate.sizing import run_range
from ...model.resolve import ModelInfo
from ...model.runconfig import check_against_model
from ...model.training import FINE_TUNE_TYPES, TrainingConfig
from ...units import format_size
from .. import parent as measuring
from ..slicing import slice_needed
from .log import _ON, ESTIMATED, FAILED, FINAL, MEASURED, SKIPPED, UNKNOWN, Row, config_key
from .once import measure_once, speed

# Sweepable settings, outermost first: the order combinations are built in
# before they are sorted by predicted memory.
SWEEPS = ("method", "fine_tune_type", "num_layers", "batch_size", "max_seq_length", "rank", "grad_checkpoint")
METHODS = ("lora", "qlora", "full")


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
        check_against_model(training, model)  # as probe: layers past the model's, a length past its context
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
    predicted_range_bytes: tuple[int, int] | None = None  # probe's range of it (what its verdict judges)


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
        predicted, breakdown = predict(model, training, backend, calibration)
        raw = predict(model, training, backend)[0] if calibration is not None else predicted
        if not measure_runs:
            action = "estimate"
        elif predicted > usable_bytes and not force:
            action = "skip"
        else:
            action = "measure"
        planned.append(Planned(training, predicted, raw, action, run_range(predicted, training, backend, breakdown)))
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

    def row_for(p: Planned) -> Row:
        if p.action != "measure":
            status = SKIPPED if p.action == "skip" else ESTIMATED
            reason = (
                f"predicted {format_size(p.predicted_bytes)} exceeds the {format_size(usable_bytes)} budget"
                if status == SKIPPED else ""
            )
            return Row(model.id, p.training, status, backend, p.predicted_bytes, usable_bytes, reason=reason,
                       estimate_range_bytes=p.predicted_range_bytes)
        tic = time.monotonic()
        by_slice = slice_needed(p.predicted_bytes, local_usable_bytes, force)
        m, failure = measure_once(model, p.training, steps, timeout, on_event, by_slice)
        wall = time.monotonic() - tic
        if m is None:
            status = UNKNOWN if failure.unknown else FAILED
            return Row(model.id, p.training, status, backend, p.predicted_bytes, usable_bytes,
                       wall_seconds=round(wall, 2), reason=str(failure))
        row = measurement_row(model.id, p, usable_bytes, m, wall)
        if record and model.architecture is not None:
            from ...estimate.calibration import architecture_key
            from ...estimate.calibration import record as store

            store(model.id, p.training.to_dict(), m.backend, p.raw_predicted_bytes, m.to_dict(),
                  architecture=architecture_key(model), source=model.source)
        return row

    yield from walk([(p, stored.get(config_key(model.id, p.training))) for p in planned], row_for, on_event)


def walk(todo: list, row_for: Callable, on_event: Callable[[dict], None], training=lambda p: p.training) -> Iterator:
    """The loop both sweeps share (this one and preference.py's): each (planned, stored
    row or None) in order, a reusable stored row yielded as it is (fresh=False), else
    `row_for(planned)`, with the progress events and the time left from the
    measurements so far. `training(planned)`: what the combination event shows."""
    to_measure = sum(1 for p, old in todo if p.action == "measure" and not reusable(old, p.action))
    walls: list[float] = []
    for index, (p, old) in enumerate(todo, 1):
        if reusable(old, p.action):
            on_event({"event": "resumed", "index": index, "total": len(todo), "row": old})
            yield old, False
            continue
        on_event({
            "event": "combination", "index": index, "total": len(todo), "remaining": len(todo) - index,
            "training": training(p), "predicted_bytes": p.predicted_bytes, "action": p.action,
            "eta_seconds": eta_seconds(walls, to_measure),
        })
        tic = time.monotonic()
        row = row_for(p)
        if p.action == "measure":
            walls.append(time.monotonic() - tic)
            to_measure -= 1
        on_event({"event": "row", "index": index, "total": len(todo), "row": row})
        yield row, True
