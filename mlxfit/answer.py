"""probe's answer as data: the run resolved (config, data, hosts), its plan, the
validation moment, the longest examples, and with --measure the measured peak.

It sits below the CLI and the renderers and above measure/ and estimate/: it calls
down into them and draws nothing. What a measurement shows while it runs (the data's
bar, the expected time, the slices, the steps) goes to a `progress` object the caller
passes in; `Silent` shows nothing (--json)."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from .errors import BadInput, MlxfitError


class Silent:
    """The progress of a probe, shown nowhere: the interface render's ProbeProgress draws."""

    @contextmanager
    def data(self):
        """Around tokenizing one data file: yields on_progress(lines, done, total), or None."""
        yield None

    @contextmanager
    def measurement(self):
        """Around a measurement: yields on_event(event) for the measuring process's events."""
        yield lambda event: None

    def expectation(self, expectation) -> None:
        """How long the measurement will take, before it is built."""

    def slices(self, plan, slices, need: int, usable: int, whole: int | None) -> None:
        """A slice of the run is measured: `need` its largest slice, `usable` this machine's budget."""


@dataclass
class Answer:
    """What probe found, ready to be printed as JSON (`to_dict`) or drawn as text."""

    resolved: Any  # model.runconfig.Resolved: the settings and where each came from
    warnings: list[str]
    plan: Any  # estimate.plan.Plan
    advice: list
    stats: Any = None  # model.dataset stats of --data's training file
    valid_stats: Any = None  # and of its valid.jsonl
    validation: Any = None  # estimate.validation: the validation moment
    longest: tuple = ()  # estimate.lengths: the longest examples that fit, without --data
    comparison: Any = None  # measure.parent.Comparison, with --measure
    hostfile: str | None = None
    hosts: list | None = None  # estimate.hosts: every node of the hostfile
    tightest: Any = None  # the smallest of them, the one planned for
    host_checks: list | None = None
    time: Any = None  # estimate.run_time.RunTime: how long the run takes (None: no speed known)
    time_checkpointed: Any = None  # the same run with --grad-checkpoint, where it is off
    measured_time: dict | None = None  # with --measure: its tokens/s and the whole run at its pace

    def to_dict(self) -> dict:
        """probe --json: the one shape of every mode (mlxfit/schema.py, docs/json.md)."""
        from .schema import shaped

        out = self.plan.to_dict()
        out["config"] = self.resolved.to_dict()
        out["advice"] = self.advice
        out["warnings"] = self.warnings
        if self.stats is not None:
            out["data"] = self.stats.to_dict()
        if self.valid_stats is not None:
            out["valid_data"] = self.valid_stats.to_dict()
        if self.validation is not None:
            out["validation"] = self.validation.to_dict()
        if self.host_checks is not None:
            out["hosts"] = self.host_checks
        if self.comparison is not None:
            out.update(self.comparison.to_dict())
        if self.longest:
            out["longest_examples"] = [fit.to_dict() for fit in self.longest]
        if self.time is not None:
            out["time"] = self.time.to_dict()
            if self.time_checkpointed is not None:
                out["time"]["with_grad_checkpoint_seconds"] = round(self.time_checkpointed.seconds, 1)
        if self.measured_time is not None:
            out.setdefault("time", {})["measured"] = self.measured_time
        return shaped({**out, **self._run_keys()})

    def _run_keys(self) -> dict:
        """What every mode's answer holds: the mode, the run and its estimate, judged."""
        from .modes import DEFAULT
        from .schema import run_estimate

        selected, training = self.plan.selected, self.plan.training
        d = selected.detailed
        step = "training step"  # mlx-lm's SFT is one phase; `moment`: where in the step it peaks
        phases = [{"name": step, "bytes": d.peak_bytes, "moment": d.features.get("phase"),
                   "breakdown": dict(d.parts)}] if d else []
        estimate = run_estimate(DEFAULT, selected.method, d.backend if d else self.plan.backend,
                                selected.predicted_bytes, selected.predicted_range_bytes, selected.verdict,
                                step if d else None, phases)
        return {"train_mode": DEFAULT, "run": {"mode": DEFAULT, "training": training.to_dict()}, "estimate": estimate,
                "usable_bytes": self.plan.machine.usable_bytes, "verdict": selected.verdict.value,
                "fits": selected.fits, "notes": []}


def probe(model_spec, training_flags: dict, *, config_path=None, data=None, method=None, skip_bad_lines=False,
          trust_remote_code=False, hostfile=None, backend=None, do_measure=False, by_slice=False, force=False,
          timeout=900, steps=6, memory=None, gpu_memory=None, reserve=None, progress=None, chip=None,
          iters=None) -> Answer:
    """Resolve the run, plan it, and with `do_measure` measure it here. `training_flags`:
    the training flags as given (None where not), mask_prompt and hosts among them."""
    from pathlib import Path

    from .estimate.plan import make_plan
    from .model.resolve import resolve_model
    from .model.runconfig import check_method, check_stored_quantization, resolve, with_method

    progress = progress or Silent()
    training_flags = dict(training_flags)
    host_list = tightest = None
    if hostfile:
        from .estimate.hosts import read_hostfile
        from .machine import read_platform

        host_list = read_hostfile(Path(hostfile), read_platform(), reserve)
        training_flags["hosts"] = len(host_list)
        backend = backend or "metal"  # mlx.launch's ring backend joins Macs
    check_method(method, training_flags.get("fine_tune_type"))
    mask_prompt = training_flags.pop("mask_prompt", None)
    resolved = resolve({**training_flags, "model": model_spec, "data": data, "mask_prompt": mask_prompt}, Path(config_path) if config_path else None)
    resolved = replace(resolved, training=with_method(resolved.training, method))
    training = resolved.training
    model = resolve_model(resolved.model)
    check_stored_quantization(resolved, model)
    warnings = checked_run(model, training)

    refuse_data_flags_without_data(resolved.data, skip_bad_lines=skip_bad_lines, trust_remote_code=trust_remote_code)
    stats = valid_stats = None
    if resolved.data:
        stats, valid_stats = read_data(model, resolved, skip_bad_lines, trust_remote_code, progress)
    if host_list:
        from .estimate.hosts import smallest

        tightest = smallest(host_list)
        machine = tightest.machine
    else:
        machine = get_machine(memory, gpu_memory, reserve)
    length = stats.worst_batch_tokens if stats else None
    plan = make_plan(machine, model, training, backend=backend, calibration=local_calibration(machine, backend, model, training, length),
                     length=length, data=stats)
    advice = gather_advice(plan, stats, machine, backend)
    validation = None
    if valid_stats is not None and plan.selected.detailed:
        from .estimate.validation import VAL_BATCHES, validation as validation_moment

        validation = validation_moment(model, training, valid_stats.worst_batch_tokens, valid_stats.examples,
                                       plan.selected.predicted_bytes, plan.selected.detailed.backend,
                                       int(resolved.other.get("val_batches", VAL_BATCHES)))
    longest = ()
    if stats is None and resolved.sources.get("max_seq_length") == "default":
        from .estimate.lengths import longest_examples

        longest = longest_examples(plan)  # sized at max_seq_length, every batch is the worst case
    comparison = None
    if do_measure:
        from .measure.parent import stopping_children

        with stopping_children():
            comparison = run_measurement(plan, force=force, timeout=timeout, steps=steps, progress=progress,
                                         by_slice=by_slice, local_usable=local_usable_bytes(machine, reserve))
    selected = plan.selected
    host_checks = ([h.check(selected.predicted_bytes, selected.predicted_range_bytes) for h in host_list]
                   if host_list else None)
    time = checkpointed = None
    speed = run_speed(plan, machine, chip)
    if speed is not None:
        time = whole_run_time(plan, resolved, speed, iters, stats, valid_stats)
        if not plan.training.grad_checkpoint:
            checkpointed = whole_run_time(plan, resolved, speed, iters, stats, valid_stats, grad_checkpoint=True)
        plan = timed_remedies(plan, resolved, machine, chip, speed, time, stats, valid_stats)
    measured_time = None
    if comparison is not None:
        measured_time = measured_pace(plan, resolved, comparison.measurement, iters, stats, valid_stats)
    return Answer(resolved, warnings, plan, advice, stats=stats, valid_stats=valid_stats, validation=validation,
                  longest=longest, comparison=comparison, hostfile=hostfile, hosts=host_list, tightest=tightest,
                  host_checks=host_checks, time=time, time_checkpointed=checkpointed, measured_time=measured_time)


def measured_pace(plan, resolved, measurement, iters=None, stats=None, valid_stats=None) -> dict | None:
    """A whole measurement's pace: tokens/s after the first step, and the whole run here at
    the measured step time (the estimate for this machine, scaled by measured over predicted)."""
    from .estimate import step_time

    pace = measured_step(plan, measurement)
    if pace is None:
        return None
    here = whole_run_time(plan, resolved, step_time.measured_speed(local_rates(plan)[0]), iters, stats, valid_stats)
    scale = pace["step_seconds"] / pace["predicted_step_seconds"] if pace["predicted_step_seconds"] else 1.0
    return {**pace, "run_seconds": round(here.seconds * scale, 1), "iters": here.iters}


def measured_step(plan, measurement) -> dict | None:
    """A whole measurement's step after the first, its tokens/s, and the step predicted at
    this machine's rates (uncorrected): what is stored to correct later time estimates."""
    from .estimate import step_time

    steady = measurement.step_seconds[1:] or measurement.step_seconds
    if measurement.method != "full" or not steady or plan.model.architecture is None:
        return None
    step = sum(steady) / len(steady)
    predicted = step_time.step_time(plan.model, plan.training, step_time.measured_speed(local_rates(plan)[0]),
                                    plan.length).seconds
    return {"tokens_per_second": round(measurement.tokens_per_second, 1), "step_seconds": round(step, 4),
            "predicted_step_seconds": round(predicted, 4)}


def run_speed(plan, machine, chip=None, model=None, training=None, decoding=False):
    """How fast the run (or `model` with `training`: one of its remedies, or an
    mlx-lm-lora run, `plan` None) goes where it
    is planned: a named chip (--chip, or the one chip sold with --memory's size) at the
    fitted efficiency; this machine at its rates for the run's dtype (measured once,
    then cached); None where neither is known (another machine, no chip). `decoding`:
    the run decodes with mlx-lm's loop (GRPO's rollout), whose rate is asked too."""
    from .estimate import step_time

    model, training = model or plan.model, training or plan.training
    if model.architecture is None:
        return None
    if chip:
        return step_time.chip_speed(step_time.find_chip(chip))
    if machine.hypothetical:
        found = step_time.chip_for_memory(machine.total_bytes) if machine.backend == "metal" else None
        return step_time.chip_speed(found) if found else None
    from .estimate.calibration import calibration, speed_corrected

    here = step_time.measured_speed(local_rates(model=model, training=training, decoding=decoding)[0])
    stored = calibration(machine.backend, model) if model.architecture is not None else None
    return speed_corrected(here, stored, model, training, plan.length if plan is not None else None)


def timed_remedies(plan, resolved, machine, chip, speed, time, stats=None, valid_stats=None):
    """The plan with what each option and remedy costs in time, beside the run's own."""
    from .estimate.plan_time import batch_widths_for, timed_plan

    if not plan.options and not plan.remedies:
        return plan

    def run_seconds(model, training, iters):
        here = speed if chip or machine.hypothetical else run_speed(plan, machine, chip, model, training)
        return whole_run_time(plan, resolved, here, iters, stats, valid_stats, model=model, training=training,
                              widths=batch_widths_for(stats, training)).seconds

    return timed_plan(plan, run_seconds, time.iters, time.seconds)


def whole_run_time(plan, resolved, speed, iters=None, stats=None, valid_stats=None, grad_checkpoint=None,
                   model=None, training=None, widths=None):
    """The whole mlx_lm.lora run: --iters (or the YAML's, or mlx-lm's 1000), the
    validation passes and saves the YAML sets, over --data's batch widths where given.
    `model`, `training` and `widths`: another run of the plan (a remedy's)."""
    from .estimate import run_time

    training = training or plan.training
    if grad_checkpoint is not None:
        training = replace(training, grad_checkpoint=grad_checkpoint)
    if widths is None and stats is not None:
        widths = stats.batch_widths
    other = resolved.other
    return run_time.run_time(
        model or plan.model, training, speed, iters=iters or int(other.get("iters", run_time.ITERS)),
        length=plan.length, widths=widths,
        val_batches=int(other.get("val_batches", run_time.VAL_BATCHES)),
        steps_per_eval=int(other.get("steps_per_eval", run_time.STEPS_PER_EVAL)),
        save_every=int(other.get("save_every", run_time.SAVE_EVERY)),
        valid_width=valid_stats.worst_batch_tokens if valid_stats is not None else None,
        valid_batches=len(valid_stats.batch_widths) if valid_stats is not None else None)


def local_rate(plan=None, model=None, training=None) -> tuple[float, str]:
    """This machine's matmul rate for the run's dtype and the dtype's name."""
    rates, name = local_rates(plan, model, training)
    return rates.matmul, name


def local_rates(plan=None, model=None, training=None, decoding=False):
    """This machine's rates for the run's dtype (measure/rate.py MachineRates: measured
    once per machine and kept in mlxfit's cache) and the dtype's name; with `decoding`,
    the cost of an operation of mlx-lm's decoding loop besides (measure/decode_rate.py,
    asked only for a run that decodes: GRPO's)."""
    from .measure.rate import machine_rates
    from .model.lazy_model import checkpoint_dtype

    if plan is not None:
        model, training = plan.model, plan.training
    bits = model.bits if model.quantized else (training.bits if training.quantize else None)
    dtype = str(checkpoint_dtype(model.config or {})).split(".")[-1]  # the activations' dtype
    rates = machine_rates(dtype, bits, model.group_size or training.group_size)
    if decoding:
        from .measure.decode_rate import decode_rate

        rates = replace(rates, decode_op=decode_rate(dtype, rates))
    return rates, (f"{bits}-bit" if bits else dtype)


def refuse_data_flags_without_data(data, **given) -> None:
    """--skip-bad-lines and --trust-remote-code change how --data is read: without data
    (from the flag or the config file) they would change nothing, so they are refused
    as --slice is without --measure."""
    for name, value in given.items():
        if value and not data:
            flag = "--" + name.replace("_", "-")
            raise BadInput(f"{flag} is about --data: add --data (or leave {flag} out)")


def checked_run(model, training, mode: str | None = None, *, hostfile=None, by_slice=False, skip_bad_lines=False) -> list[str]:
    """The checks every run goes through, whatever its mode, before anything is estimated:
    what its trainer cannot do (mlx-lm-lora's: per-node plans, slices, skipped lines), then
    its settings against the model (context length, layers, LoRA keys). Returns the
    warnings; raises BadInput on what cannot be right."""
    from .model.runconfig import check_against_model
    from .modes import DEFAULT, get_mode

    refusal = get_mode(mode or DEFAULT).refusal(hostfile=hostfile, by_slice=by_slice, skip_bad_lines=skip_bad_lines)
    if refusal:
        raise BadInput(refusal)
    return check_against_model(training, model)


def get_machine(memory, gpu_memory, reserve):
    """This machine, or the hypothetical one --memory or --gpu-memory plan for."""
    from .machine import build_machine, read_platform

    return build_machine(read_platform(), reserve=reserve, memory=memory, gpu_memory=gpu_memory)


def local_usable_bytes(machine, reserve) -> int:
    """What a measurement may take: this machine's budget, whatever --memory or
    --gpu-memory plan for (a measurement runs here, not on the planned machine)."""
    return get_machine(None, None, reserve).usable_bytes if machine.hypothetical else machine.usable_bytes


def local_calibration(machine, backend, model, training=None, length=None):
    """Stored measurements correct estimates for this machine's own backend only,
    and only of the architecture they measured at close settings (with `training`
    at `length`, the widest batch of the data: None unless that run has a close
    measurement)."""
    from .estimate.calibration import calibration

    if machine.hypothetical or (backend and backend != machine.backend) or model.architecture is None:
        return None
    return calibration(machine.backend, model, training, length)


def read_data(model, resolved, skip_bad_lines, trust_remote_code, progress):
    """--data in tokens: the training file's stats, and its valid.jsonl's (or None)."""
    from .model import dataset

    choice = dataset.load_tokenizer(model, trust_remote_code=trust_remote_code)
    kw = dict(batch_size=resolved.training.batch_size, max_seq_length=resolved.training.max_seq_length,
              mask_prompt=resolved.mask_prompt, features=resolved.features, skip_bad_lines=skip_bad_lines)
    with progress.data() as on_progress:
        stats = dataset.measure(resolved.data, choice, on_progress=on_progress, **kw)
    valid = dataset.valid_file(resolved.data)
    if valid is None:
        return stats, None
    with progress.data() as on_progress:
        return stats, dataset.measure(valid, choice, on_progress=on_progress, **kw)


def gather_advice(plan, stats, machine, backend):
    from .estimate.advice import data_advice, growth_advice, weak_kind_advice
    from .estimate.calibration import stored

    notes = weak_kind_advice(plan)
    notes += data_advice(plan, stats) if stats is not None else []
    if not machine.hypothetical:
        notes += growth_advice(plan, stored())
    return notes


def run_measurement(plan, force, timeout, steps, progress=None, by_slice=False, local_usable=None):
    """Measure the plan's run here. Whole or slice is decided against what this
    machine can hold (`local_usable`), whatever budget the plan is for; the
    measured verdict is judged against the plan's budget."""
    from .estimate.plan import predict
    from .machine import mlx_backend
    from .measure.parent import Comparison, measure, request_for
    from .measure.slicing import slice_needed
    from .units import format_size

    progress = progress or Silent()
    # Judge the measurement against the estimate for the backend it runs on.
    backend = mlx_backend()
    raw_predicted, _ = predict(plan.model, plan.training, backend, length=plan.length)
    predicted, _ = predict(plan.model, plan.training, backend, plan.calibration, plan.length)
    usable = plan.machine.usable_bytes
    here = usable if local_usable is None else local_usable
    if plan.model.architecture is None and slice_needed(predicted, here, force):
        raise MlxfitError(
            f"refusing to measure: the estimate ({format_size(predicted)}) exceeds {_budget_words(plan, here)} and "
            f"{plan.model.id} has no architecture to measure by slice; change the run or pass --force"
        )
    if plan.model.architecture is not None and (by_slice or slice_needed(predicted, here, force)):
        measurement = measure_slices(plan, backend, here, force, timeout, steps, progress, whole=predicted)
    else:
        expected_duration(plan, timeout, steps, progress)  # stops before building when past --timeout
        request = request_for(plan.model, plan.training, length=plan.length, max_steps=steps)
        with progress.measurement() as on_event:
            measurement = measure(request, timeout=timeout, on_event=on_event)
    note = None
    if plan.model.architecture is not None:
        from .estimate.calibration import architecture_key, measurements_dir, record

        try:
            record(plan.model.id, plan.training.to_dict(), backend, raw_predicted, measurement.to_dict(),
                   architecture=architecture_key(plan.model), length=plan.length,
                   machine=None if plan.machine.hypothetical else {"device_name": plan.machine.device_name,
                                                                   "total_bytes": plan.machine.total_bytes},
                   config=plan.model.config if plan.model.source == "local" else None, source=plan.model.source,
                   time=measured_step(plan, measurement))
        except OSError as e:  # the measurement stands; only its use for calibration is lost
            note = f"not stored for calibration: cannot write {e.filename or measurements_dir()} ({e.strerror or e})"
    return Comparison(measurement, predicted, usable, note=note)


def expected_duration(plan, timeout, steps, progress, slices=None):
    """How long the measurement (of the run, or of `slices`) will take, from the steps'
    operations and this machine's rate; stops before building when past --timeout."""
    if plan.model.architecture is None:
        return
    from .estimate import duration
    from .measure.slicing import slice_training, sliced_model
    from .measure.steps import MIN_STEPS

    model, training = plan.model, plan.training
    rate, dtype = local_rate(plan)
    if slices is None:
        expectation = duration.expect(model, training, plan.length, rate, dtype, MIN_STEPS, steps)
    else:
        runs = [(sliced_model(model, s), slice_training(training, s), s.steps(training)) for s in slices.slices]
        expectation = duration.expect_slices(runs, plan.length, rate, dtype, MIN_STEPS, steps)
    refusal = duration.too_long(expectation, timeout)
    if refusal:
        raise MlxfitError(refusal if slices is None else refusal.replace(", or --slice to measure a slice of the "
                                                                          "model (a few real-width blocks)", ""))
    progress.expectation(expectation)


def sweep_duration(model, planned, timeout, steps, local_usable) -> tuple[float, float, int]:
    """How long bench's measurements will take here, (fewest, most) seconds and the runs
    counted (those measured whole; a slice's time is its own); refuses, as probe
    --measure does, a sweep one of whose runs would pass --timeout."""
    from .estimate import duration
    from .measure.steps import MIN_STEPS

    low = high = 0.0
    counted = 0
    for p in planned:
        if p.action != "measure" or model.architecture is None or p.predicted_bytes > local_usable:
            continue
        rate, dtype = local_rate(model=model, training=p.training)
        expectation = duration.expect(model, p.training, None, rate, dtype, MIN_STEPS, steps)
        refusal = duration.too_long(expectation, timeout, refusing="refusing the sweep: the run of", sliceable=False)
        if refusal:
            t = p.training
            raise MlxfitError(f"{refusal} "
                              f"(batch {t.batch_size}, length {t.max_seq_length}, {t.method}"
                              f"{', checkpointed' if t.grad_checkpoint else ''}); or drop it from the sweep, or "
                              "add --estimate-only")
        low += expectation.low_seconds
        high += expectation.high_seconds
        counted += 1
    return low, high, counted


def _budget_words(plan, here):
    """The budget a measurement is held to: this machine's, named as such when the plan is for another."""
    from .units import format_size

    if plan.machine.hypothetical:
        return f"this machine's {format_size(here)} budget (the plan's {format_size(plan.machine.usable_bytes)} is for another machine)"
    return f"the {format_size(here)} budget"


def measure_slices(plan, backend, usable, force, timeout, steps, progress, whole=None):
    """A slice of the run: said beforehand, refused where even it would not fit.
    `usable`: what this machine can hold; `whole`: the whole run's estimate."""
    from .estimate.plan import predict
    from .measure.slicing import measure_by_slices, plan_slices, slice_training, sliced_model
    from .units import format_size

    try:
        slices = plan_slices(plan.model.architecture, plan.training)
    except MlxfitError as e:
        raise MlxfitError(
            f"refusing to measure: the estimate exceeds {_budget_words(plan, usable)} and {e} "
            "(change the run, see the plan without --measure, or pass --force)"
        ) from e
    need = max(predict(sliced_model(plan.model, s), slice_training(plan.training, s), backend, length=plan.length)[0]
               for s in slices.slices)
    if need > usable and not force:
        raise MlxfitError(
            f"refusing to measure: even the largest slice needs about {format_size(need)}, over "
            f"{_budget_words(plan, usable)}; change the run (see the plan without --measure) or pass --force"
        )
    progress.slices(plan, slices, need, usable, whole)
    expected_duration(plan, timeout, steps, progress, slices)
    with progress.measurement() as on_event:
        return measure_by_slices(plan.model, plan.training, plan.length, steps, timeout=timeout, on_event=on_event)
