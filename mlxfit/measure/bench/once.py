"""One combination measured once, for bench's sweep and its --max search: the whole
run in a child process, or a slice of it extrapolated (mlxfit/measure/slicing.py) when
the run is predicted over what this machine can hold."""

from __future__ import annotations

from ...errors import MlxfitError
from ...model.resolve import ModelInfo
from ...model.training import TrainingConfig
from .. import parent as measuring


def speed(m) -> float | None:
    """Tokens per second of a whole measurement; None for a slice, whose speed is not the run's."""
    return round(m.tokens_per_second, 2) if m.step_seconds else None


def measure_once(model: ModelInfo, training: TrainingConfig, steps: int, timeout, on_event, by_slice: bool = False):
    """(Measurement, None), or (None, the MeasurementFailed) for a run that died,
    timed out or cannot be measured here; a Ctrl-C that stopped the child is
    raised again as KeyboardInterrupt, not recorded as a failure. `by_slice`:
    measure a slice of the run and extrapolate (mlxfit/measure/slicing.py)."""
    if by_slice:
        return attempt(lambda: _measure_by_slice(model, training, steps, timeout, on_event))
    return attempt(lambda: measuring.measure(measuring.request_for(model, training, max_steps=steps),
                                             timeout=timeout, on_event=on_event))


def attempt(measure):
    """(what `measure()` returns, None), or (None, the MeasurementFailed) for a run
    that died, timed out or was refused; a Ctrl-C that stopped the child is raised
    again as KeyboardInterrupt. Shared by SFT runs and mlx-lm-lora's (preference.py)."""
    with measuring.InterruptWatch() as watch:
        try:
            return measure(), None
        except measuring.MeasurementFailed as e:
            if watch.seen:
                raise measuring.Interrupted(watch.exit_code) from None
            return None, e


def _measure_by_slice(model: ModelInfo, training: TrainingConfig, steps: int, timeout, on_event):
    from ..slicing import measure_by_slices, plan_slices

    try:
        plan_slices(model.architecture, training)
    except MlxfitError as e:
        raise measuring.MeasurementFailed(
            f"not measured: predicted over what this machine can hold, and {e}", kind="refused"
        ) from e
    return measure_by_slices(model, training, None, steps, timeout=timeout, on_event=on_event)
