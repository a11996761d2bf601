"""The answer to probe for a vision-language model (mlx-vlm), as data: the model built
lazily with mlx-vlm's class, the run's images counted, the step sized moment by moment
by its mode (mlxfit/modes/vlm.py), and with --measure mlx-vlm's own trainer run here.
It answers in the phase-by-phase answer of mlxfit/answer_preference.py (one JSON shape,
one renderer's entry); it draws nothing."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from .errors import BadInput, MlxfitError

@dataclass(frozen=True)
class SizedVLM:
    """The model as sized: its id and mlx-vlm's parts (model/vision.py VisionModelInfo)."""

    id: str
    info: object
    path: Path | None
    source: str = "hub"  # "local" (a folder), "catalog" (mlxfit's shipped config.json) or "hub"

    @property
    def params(self) -> int:
        return self.info.params

    def to_dict(self) -> dict:
        i = self.info
        return {"id": self.id, "source": self.source, "model_type": i.model_type,
                "params": i.params, "bits": 8 * i.dtype_bytes, "dtype": i.dtype,
                "language_params": i.language_params, "vision_params": i.vision_params,
                "projector_params": i.projector_params, "path": str(self.path) if self.path else None}


def probe(model_id: str, config: dict, folder, mode: str, data, settings: dict, machine, backend, *, refused: dict, hostfile=None,
          do_measure=False, by_slice=False, force=False, timeout=900, steps=6, progress=None, reserve=None):
    """A VLM's run answered. `refused`: flag -> given value of probe's flags that do not
    apply (each refused in one line); `settings`: the training flags with `image_size` and
    `images_per_example`."""
    from .answer_preference import PreferenceAnswer
    from .model.vision import vision_model
    from .model.vision_run import resolve_run
    from .model.vlm_catalog import shipped_vlm
    from .modes import get_mode

    spec = get_mode(mode)
    for flag, value in refused.items():
        if value:
            raise BadInput(f"{flag} does not apply to a vision-language model (mlx_vlm.train has no such setting)")
    refusal = spec.refusal(hostfile=hostfile)
    if refusal:
        raise BadInput(refusal)
    info = vision_model(config, model_id)  # one line naming mlxfit[vlm] without mlx-vlm
    run = resolve_run(spec, config, folder, model_id, settings, data)
    estimate = spec.estimate(info, run, backend or machine.backend)
    notes = list(run.notes)
    source = "local" if folder else "catalog" if shipped_vlm(model_id) else "hub"
    if source == "catalog":
        notes.append(f"config.json is mlxfit's shipped copy of {model_id}'s on the Hugging Face Hub "
                     "(data/vlm_configs.json), read offline")
    if (backend or machine.backend) != estimate.backend:
        notes.append(f"estimated for the CPU backend: mlx-vlm's vision terms are fitted on CPU runs; no "
                     f"{backend or machine.backend} run of mlx-vlm has been measured")
    measured = None
    if do_measure:
        measured = _measure(info, folder, run, estimate, machine, reserve, force, by_slice, timeout, steps, progress)
    from .estimate.vision_plans import plans

    def resolve(changes: dict, max_pixels: int | None):
        return resolve_run(spec, config, folder, model_id, {**settings, **changes}, data, max_pixels=max_pixels)

    return PreferenceAnswer(machine, SizedVLM(model_id, info, Path(folder) if folder else None, source), run, estimate,
                            plans(info, run, machine.usable_bytes, resolve), run.data, measured, notes)


def _measure(info, folder, run, estimate, machine, reserve, force, by_slice, timeout, steps, progress):
    """Whole, or by slice where the estimate exceeds this machine's budget (or with
    --slice), refused where even the largest slice's estimate exceeds it (--force
    measures the whole); the prediction beside it is the estimate of the run measured
    (its width and rows)."""
    from .answer import local_usable_bytes
    from .estimate.vision import vision_estimate
    from .measure.parent import stopping_children
    from .measure.slicing import slice_needed
    from .measure.vision import measure, measure_by_slices, slice_estimate, slice_plan
    from .units import format_size

    usable = local_usable_bytes(machine, reserve)
    plan = slice_plan(info, run) if by_slice or slice_needed(estimate.peak_bytes, usable, force) else None
    if plan is not None:
        need = slice_estimate(info, run, max(s.blocks for s in plan.slices)).breakdown.peak_bytes
        if need > usable and not force:
            raise MlxfitError(f"refusing to measure: the estimate ({format_size(estimate.peak_bytes)}) exceeds this "
                              f"machine's {format_size(usable)} budget, and even the largest slice of its language "
                              f"model needs about {format_size(need)}; change the run or pass --force")
    with stopping_children(), progress.measurement() as on_event:
        if plan is not None:
            m = measure_by_slices(folder, run, plan, steps=min(steps, 3), timeout=timeout, on_event=on_event)
        else:
            m = measure(folder, run, steps=min(steps, 3), timeout=timeout, on_event=on_event)
    width = max(m.widths) if m.widths else run.tokens
    predicted = vision_estimate(info, run.training, width, run.image_tokens, run.pixel_shape, images=run.images,
                                rows=m.rows).peak_bytes
    return replace(m, predicted_bytes=predicted)
