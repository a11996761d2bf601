"""The answer to probe for a DPO, CPO, ORPO or GRPO run (mlx-lm-lora), as data, in one
function: the preference modes' counterpart of mlxfit/answer.py, at the same stage (below
render/ and cli/, above measure/ and estimate/); it draws nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BadInput


@dataclass
class PreferenceAnswer:
    machine: Any
    model: Any
    run: Any
    estimate: Any
    plans: dict
    stats: Any = None
    measured: Any = None
    notes: list = None
    time: Any = None  # estimate.run_time.RunTime: how long the run takes (None: no speed known)

    @property
    def usable_bytes(self) -> int:
        return self.machine.usable_bytes

    def to_dict(self) -> dict:
        """probe --json: the one shape of every mode (mlxfit/schema.py, docs/json.md)."""
        from .schema import run_estimate, shaped

        verdict = self.estimate.verdict(self.usable_bytes)
        e = self.estimate.to_dict()
        estimate = run_estimate(e.pop("train_mode"), None, e.pop("backend"), e.pop("predicted_peak_bytes"),
                                e.pop("predicted_range_bytes"), verdict, e.pop("peak_phase"), e.pop("phases"), **e)
        singles, combination = self.plans["singles"], self.plans["combination"]
        out = {
            "train_mode": self.run.mode,
            "machine": self.machine.to_dict(),
            "model": self.model.to_dict(),
            "training": self.run.training.to_dict(),
            "run": self.run.to_dict(),
            "estimate": estimate,
            "estimates": [estimate],
            "usable_bytes": self.usable_bytes,
            "verdict": verdict.value,
            "fits": verdict.fits,
            "remedies": [_remedy(c) for c in singles],
            "plan": [_remedy(c) for c in combination],
            "plans": {k: [c.to_dict() for c in v] for k, v in self.plans.items()},
            "basis": "detailed",
            "backend": self.estimate.backend,
            "advice": [],
            "warnings": [],
            "notes": self.notes or [],
        }
        if self.stats is not None:
            out["data"] = self.stats.to_dict()
        if self.measured is not None:
            out["measured"] = self.measured.to_dict()
        if self.time is not None:
            out["time"] = self.time.to_dict()
        return shaped(out)


def _remedy(change) -> dict:
    """A change in the keys of an SFT remedy (mlxfit/estimate/plan.py Remedy)."""
    return {"change": change.flags, "why": change.cost, "new_bytes": change.bytes, "fits": change.fits,
            "verdict": change.verdict.value}


def probe(model_spec, config_path, data, training_flags: dict, pref: dict, machine, backend, do_measure, timeout, steps,
          progress, reserve=None, *, skip_bad_lines=False, trust_remote_code=False, hostfile=None, by_slice=False,
          force=False, chip=None, iters=None, miniatures=False) -> PreferenceAnswer:
    """A DPO, CPO, ORPO or GRPO run, answered: mlx-lm-lora's settings resolved, checked
    as every run is (mlxfit.answer.checked_run), the estimate phase by phase, the plans
    and, with `do_measure`, the measurement, judged against this machine (`reserve` as
    given) whatever `machine` plans for; `force` measures even past this machine's budget.
    `progress`: as for mlxfit.answer.probe (Silent shows nothing); `miniatures`: whether
    the logits buffers may be counted on miniatures of the model (a child process the
    first time a shape is met), else the fitted count."""
    from dataclasses import replace

    from .answer import checked_run
    from .estimate import preference as est
    from .measure.miniature import logits_buffers_many, uncounted
    from .model.preference import mode_from, read_data, read_yaml, resolve_run
    from .model.resolve import resolve_model

    config = read_yaml(Path(config_path)) if config_path else {}
    pref = dict(pref)
    mode = mode_from(pref.pop("train_mode", None), config)
    if training_flags.get("hosts") not in (None, 1):
        raise BadInput(f"--hosts is not covered for --train-mode {mode}")
    if training_flags.get("bits") is not None:
        raise BadInput("--bits is mlx_lm.lora's: mlx_lm_lora.train quantizes with --load-in-4bits, -6bits or -8bits")
    flags = {**training_flags, **pref, "rl_group_size": training_flags.get("group_size")}
    model = resolve_model(model_spec or config.get("model"))
    size_note = None
    if model.architecture is None:
        from .estimate.plan import nearest_catalog_model

        near = nearest_catalog_model(model.params) if model.params else None
        if near is None:
            raise BadInput(f"{model.id}: no architecture to build, and no catalog model of its size")
        size_note = f"{model.id} has no architecture: planned as {near.id}, the catalog's nearest in size"
        model = near
    run = resolve_run(mode, flags, config)
    notes = [size_note] if size_note else []
    notes += checked_run(model, run.training, mode, hostfile=hostfile, by_slice=by_slice, skip_bad_lines=skip_bad_lines)
    reference = reference_model(run)
    data = data or (config.get("data") if config.get("data") and Path(str(config["data"])).expanduser().exists() else None)
    from .answer import refuse_data_flags_without_data

    refuse_data_flags_without_data(data, trust_remote_code=trust_remote_code)
    stats = None
    length = None
    prompt_length = pref.get("prompt_length")
    if data:
        from .model.dataset import load_tokenizer

        stats = read_data(data, run, load_tokenizer(model, trust_remote_code=trust_remote_code))
        if run.spec.rollout:
            prompt_length = prompt_length or stats.widest
        else:
            length = stats.widest
    if run.spec.rollout:
        cap = run.training.max_seq_length
        if prompt_length is not None and prompt_length > cap:
            notes.append(f"prompts are cut to --max-seq-length {cap}: a {prompt_length}-token prompt is counted as {cap}")
            prompt_length = cap
        run = replace(run, prompt_length=prompt_length)
    backend = backend or machine.backend
    counted = est.shapes(model, run, length, prompt_length)
    if uncounted(counted, miniatures=miniatures):  # tens of seconds of miniatures for a shape not shipped, shown as a measurement
        with progress.measurement() as on_event:
            logits_buffers_many(counted, on_event, miniatures=miniatures)
    estimate = est.estimate_run(model, run, backend, length, reference, prompt_length, miniatures=miniatures)
    usable = machine.usable_bytes
    plans = est.plan(model, run, usable, backend, length, reference, prompt_length, miniatures=miniatures)
    measured = None
    if do_measure:
        if not force:
            refuse_what_would_not_fit_here(est, model, run, estimate, backend, machine, reserve, length, reference,
                                           prompt_length)
        measured = _measure(model, run, estimate, timeout, steps, progress)
    time = preference_time(model, run, machine, chip, iters, estimate)
    return PreferenceAnswer(machine, model, run, estimate, plans, stats, measured, notes, time)


def preference_time(model, run, machine, chip, iters, estimate):
    """The whole run's time where its speed is known (mlxfit.answer.run_speed): `iters`
    (default mlx-lm-lora's) steps of the mode's step at the widest batch. A rollout's
    decoding loop is timed here (its rate measured the first time), after any measuring
    child has ended, never before it."""
    from .answer import run_speed
    from .estimate import run_time, step_time

    speed = run_speed(None, machine, chip, model, run.training, decoding=run.spec.rollout)
    if speed is None:
        return None
    step = step_time.preference_step_time(run, model, speed, estimate.length, estimate.prompt_length)
    return run_time.preference_run_time(model, run.training, step, speed, iters or run_time.PREFERENCE_ITERS)


def reference_model(run):
    """The model at --reference-model-path, sized (None: the reference is a second
    copy of --model, or the mode has none)."""
    from .model.resolve import resolve_model

    if not (run.has_reference and run.reference_model_path):
        return None
    reference = resolve_model(run.reference_model_path)
    if reference.architecture is None:
        raise BadInput(f"--reference-model-path {run.reference_model_path}: no architecture to size")
    return reference


def refuse_what_would_not_fit_here(est, model, run, estimate, backend, machine, reserve, length, reference, prompt_length,
                                   then="change the run (see its plans without --measure) or pass --force"):
    """A measurement runs here, and mlx-lm-lora's trainers cannot be measured by slice:
    refused (MlxfitError), before anything is built, when this machine's own estimate
    exceeds its budget, whatever `machine` plans for. `then`: what the message ends with
    (probe and bench say what to do differently)."""
    from .answer import get_machine, local_usable_bytes
    from .errors import MlxfitError
    from .units import format_size

    here = get_machine(None, None, reserve) if machine.hypothetical else machine
    need = (estimate if here.backend == backend else
            est.estimate_run(model, run, here.backend, length, reference, prompt_length,
                             counted=estimate.logits_buffers)).peak_bytes
    usable = local_usable_bytes(machine, reserve)
    if need > usable:
        planned = (f" (the plan's {format_size(machine.usable_bytes)} is for another machine)"
                   if machine.hypothetical else "")
        raise MlxfitError(
            f"refusing to measure: the estimate on this machine ({format_size(need)}) exceeds its "
            f"{format_size(usable)} budget{planned}, and a --train-mode {run.mode} run cannot be measured by slice; "
            + then
        )


def _measure(model, run, estimate, timeout, steps, progress):
    from .errors import MlxfitError
    from .measure.parent import stopping_children
    from .measure.preference import measure as run_measure
    from .model.preference import EXTRA, installed

    if not installed():
        raise MlxfitError(f"--measure with --train-mode {run.mode} runs mlx-lm-lora's trainer, which is not installed: {EXTRA}")
    with stopping_children(), progress.measurement() as on_event:
        return run_measure(model, run, estimate.length, prompt_length=estimate.prompt_length, steps=min(steps, 4),
                           timeout=timeout, on_event=on_event)
