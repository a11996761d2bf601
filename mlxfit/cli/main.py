"""The command line: parse, call, render. No computation lives here."""

from __future__ import annotations

import os
from dataclasses import replace

import click

from .. import __version__
from ..errors import BadInput, MlxfitError
from ..model.training import FINE_TUNE_TYPES, OPTIMIZERS
from . import preference
from .preference import preference_options
from .options import (
    CONTEXT_SETTINGS,
    get_machine,
    handle_errors,
    json_option,
    local_calibration,
    local_usable_bytes,
    machine_options,
    print_json,
)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="mlxfit")
def cli():
    """Will fine-tuning this model fit in this machine's memory?

    mlxfit reads your machine's memory, keeps about a quarter back for the OS and
    apps, and estimates what LoRA, QLoRA and full fine-tuning with mlx-lm need.

    \b
    Examples:
      mlxfit probe                                  # the default model on this machine
      mlxfit probe --model Qwen/Qwen2.5-7B-Instruct
      mlxfit probe --model 7B --memory 36GB         # plan a 36 GB Mac from anywhere
      mlxfit fits --memory 36GB                     # what fits on a 36 GB Mac
      mlxfit memory
    """


@cli.command()
@machine_options
@json_option
@handle_errors
def memory(memory, gpu_memory, reserve, json_):
    """Show this machine's memory, the reserve and the budget for training.

    \b
    Example:
      mlxfit memory --reserve 8GB                   # keep 8 GB back instead of a quarter
    """
    machine = get_machine(memory, gpu_memory, reserve)
    if json_:
        print_json({"machine": machine.to_dict()})
    else:
        from ..render.memory import render_memory

        render_memory(machine)


def _default(name):
    from ..model.training import defaults

    return defaults()[name]


@cli.command()
@click.argument("model_arg", metavar="[MODEL]", required=False)
@click.option("--model", "-m", "model_spec", metavar="MODEL", help="A folder with config.json, a Hugging Face repo id, a catalog id (mlxfit models) or a size like 7B. Default: Qwen/Qwen3-0.6B.")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="An mlx_lm.lora YAML config; flags given here override it, as in mlx-lm.")
@click.option("--data", metavar="DIR|FILE", help="Training data as mlx-lm reads it (a folder with train.jsonl, or one .jsonl): the widest batch drives the estimate.")
@click.option("--fine-tune-type", "--train-type", "fine_tune_type", type=click.Choice(FINE_TUNE_TYPES), help=f"As in mlx_lm.lora (--train-type: mlx_lm_lora.train's name) [default: {_default('fine_tune_type')}].")
@click.option("--method", type=click.Choice(["lora", "qlora", "full"]), help="Shortcut: qlora = LoRA on a 4-bit base; full = --fine-tune-type full.")
@click.option("--num-layers", type=int, help=f"Blocks to train, counted from the last; -1 for all [default: {_default('num_layers')}].")
@click.option("--batch-size", type=int, help=f"Examples per step [default: {_default('batch_size')}].")
@click.option("--max-seq-length", type=int, help=f"Longest example in tokens [default: {_default('max_seq_length')}].")
@click.option("--grad-checkpoint/--no-grad-checkpoint", default=None, help="Recompute activations in the backward pass (less memory, slower) [default: off].")
@click.option("--grad-accumulation-steps", type=int, help="Steps accumulated before each optimizer update [default: 1].")
@click.option("--rank", type=int, help=f"LoRA rank [default: {_default('rank')}].")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), help=f"The optimizer, as in mlx_lm.lora; its state is part of the peak [default: {_default('optimizer')}].")
@click.option("--mask-prompt/--no-mask-prompt", default=None, help="Mask the prompt in the loss, as mlx_lm.lora --mask-prompt.")
@click.option("--bits", type=int, help="QLoRA: bits per weight of the quantized base: 2, 3, 4, 5, 6 or 8 [default: 4].")
@click.option("--group-size", type=int, help="QLoRA: quantization group size: 32, 64 or 128, as MLX quantizes [default: 64]. With --train-mode grpo: completions per prompt, as mlx_lm_lora.train [default: 4].")
@click.option("--skip-bad-lines", is_flag=True, help="With --data: skip malformed lines (reported) instead of stopping at the first.")
@click.option("--trust-remote-code", is_flag=True, help="With --data: let the tokenizer run code from its repository.")
@click.option("--hosts", type=click.IntRange(min=1), help="Data-parallel nodes under mlx.launch: each holds the whole model and batch-size / hosts examples.")
@click.option("--hostfile", type=click.Path(dir_okay=False), help="mlx.launch's JSON hostfile with a \"memory\" size per host: checks every node.")
@click.option("--backend", type=click.Choice(["cpu", "metal", "cuda"]), help="Estimate for this MLX backend (default: this machine's; metal with --memory, cuda with --gpu-memory).")
@click.option("--measure", "do_measure", is_flag=True, help="Also run a few real mlx-lm training steps (in a child process) and report the true peak.")
@click.option("--slice", "by_slice", is_flag=True,
              help="With --measure: measure a slice (the real embedding and head, a few real-width blocks) and "
                   "extrapolate to the whole model. Automatic when the whole run would not fit.")
@click.option("--force", is_flag=True, help="Measure the whole run even when the estimate says it does not fit.")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True, help="Seconds before a measurement is stopped.")
@click.option("--steps", type=click.IntRange(min=3), default=6, show_default=True, help="Most steps to measure; stops earlier once the peak has held for two steps.")
@preference_options
@machine_options
@json_option
@handle_errors
def probe(model_arg, model_spec, config_path, data, method, skip_bad_lines, trust_remote_code, hostfile, backend, do_measure, by_slice, force, timeout, steps, memory, gpu_memory, reserve, json_, **training_flags):
    """Will LoRA, QLoRA and full fine-tuning of MODEL fit? What to change if not.

    MODEL may be given as the argument or as --model (which wins when both are).

    Flags, an mlx_lm.lora YAML file (-c) and mlx-lm's defaults combine as in
    mlx-lm. With --data, the widest batch of your data sets the length. With
    --measure, mlxfit then trains the run a few steps with mlx-lm (random
    weights in the model's dtype when only a config is at hand) and reports the
    measured peak beside the prediction.

    \b
    Example:
      mlxfit probe Qwen/Qwen2.5-7B-Instruct --memory 16GB --batch-size 2
    """
    from pathlib import Path

    from ..estimate.plan import make_plan
    from ..model.resolve import resolve_model
    from ..model.runconfig import check_against_model, check_method, one_model, resolve, with_method

    model_spec = one_model(model_arg, model_spec)
    for flag, given in (("--slice", by_slice), ("--force", force)):
        if given and not do_measure:
            raise BadInput(f"{flag} is about measuring: add --measure (or leave {flag} out)")
    if hostfile:
        for flag, given in (("--memory", memory), ("--gpu-memory", gpu_memory), ("--hosts", training_flags.get("hosts"))):
            if given is not None:
                raise BadInput(f"{flag} with --hostfile: the hostfile gives every host and its memory; leave {flag} out")
    pref = {k: training_flags.pop(k) for k in preference.FLAGS}
    if preference.wanted(pref["train_mode"], config_path):  # mlx-lm-lora's dpo, cpo, orpo, grpo
        return preference.probe(model_spec, config_path, data, training_flags, pref, get_machine(memory, gpu_memory, reserve),
                                backend, do_measure, timeout, steps, json_)
    host_list = None
    if hostfile:
        from ..estimate.hosts import read_hostfile
        from ..machine import read_platform

        host_list = read_hostfile(Path(hostfile), read_platform(), reserve)
        training_flags["hosts"] = len(host_list)
        backend = backend or "metal"  # mlx.launch's ring backend joins Macs
    check_method(method, training_flags.get("fine_tune_type"))
    mask_prompt = training_flags.pop("mask_prompt")
    resolved = resolve({**training_flags, "model": model_spec, "data": data, "mask_prompt": mask_prompt}, Path(config_path) if config_path else None)
    resolved = replace(resolved, training=with_method(resolved.training, method))
    training = resolved.training
    model = resolve_model(resolved.model)
    warnings = check_against_model(training, model)

    stats = valid_stats = None
    if resolved.data:
        stats, valid_stats = read_data(model, resolved, skip_bad_lines, trust_remote_code, quiet=json_)
    if host_list:
        from ..estimate.hosts import smallest

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
        from ..estimate.validation import VAL_BATCHES, validation as validation_moment

        validation = validation_moment(model, training, valid_stats.worst_batch_tokens, valid_stats.examples,
                                       plan.selected.predicted_bytes, plan.selected.detailed.backend,
                                       int(resolved.other.get("val_batches", VAL_BATCHES)))
    longest = ()
    if stats is None and resolved.sources.get("max_seq_length") == "default":
        from ..estimate.lengths import longest_examples

        longest = longest_examples(plan)  # sized at max_seq_length, every batch is the worst case
    comparison = None
    if do_measure:
        from ..measure.parent import InterruptWatch, MeasurementInterrupted

        # Ctrl-C, SIGTERM, SIGHUP: the child is stopped and its folder removed, as in bench.
        with InterruptWatch() as watch:
            try:
                comparison = run_measurement(plan, force=force, timeout=timeout, steps=steps, quiet=json_,
                                             by_slice=by_slice, local_usable=local_usable_bytes(machine, reserve))
            except MeasurementInterrupted as e:
                e.exit_code = watch.exit_code
                raise
    selected = plan.selected
    host_range = selected.predicted_range_bytes if selected.detailed else None
    host_checks = [h.check(selected.predicted_bytes, host_range) for h in host_list] if host_list else None
    if os.environ.get("MLX_RANK", "0") != "0":
        return  # under mlx.launch, rank 0 reports every rank's figures
    if json_:
        out = plan.to_dict()
        out["config"] = resolved.to_dict()
        out["advice"] = advice
        out["warnings"] = warnings
        if stats is not None:
            out["data"] = stats.to_dict()
        if valid_stats is not None:
            out["valid_data"] = valid_stats.to_dict()
        if validation is not None:
            out["validation"] = validation.to_dict()
        if host_checks is not None:
            out["hosts"] = host_checks
        if comparison is not None:
            out.update(comparison.to_dict())
        if longest:
            out["longest_examples"] = [fit.to_dict() for fit in longest]
        print_json(out)
    else:
        from ..render import inputs, measurement, probe as render  # rich, for text only

        inputs.render_config_notes(resolved)
        inputs.render_input_warnings(warnings)
        if stats is not None:
            inputs.render_data(stats)
        if validation is not None:
            inputs.render_validation(validation)
        nodes = None
        if host_list:
            nodes = [f"per node: {len(host_list)} hosts in {hostfile}", f"planned for the smallest, {tightest.name}"]
        render.render_plan(plan, nodes=nodes, longest=longest)
        render.render_advice(advice)
        if host_checks is not None:
            render.render_hosts(host_checks)
        if comparison is not None:
            measurement.render_comparison(comparison)
        render.render_units_note()


def read_data(model, resolved, skip_bad_lines, trust_remote_code, quiet):
    from ..model import dataset
    from ..render.inputs import data_progress

    choice = dataset.load_tokenizer(model, trust_remote_code=trust_remote_code)
    kw = dict(batch_size=resolved.training.batch_size, max_seq_length=resolved.training.max_seq_length,
              mask_prompt=resolved.mask_prompt, features=resolved.features, skip_bad_lines=skip_bad_lines)
    with data_progress(quiet=quiet) as on_progress:
        stats = dataset.measure(resolved.data, choice, on_progress=on_progress, **kw)
    valid = dataset.valid_file(resolved.data)
    if valid is None:
        return stats, None
    with data_progress(quiet=quiet) as on_progress:
        return stats, dataset.measure(valid, choice, on_progress=on_progress, **kw)


def gather_advice(plan, stats, machine, backend):
    from ..estimate.advice import data_advice, growth_advice
    from ..estimate.calibration import stored

    notes = data_advice(plan, stats) if stats is not None else []
    if not machine.hypothetical:
        notes += growth_advice(plan, stored())
    return notes


def run_measurement(plan, force, timeout, steps, quiet, by_slice=False, local_usable=None):
    """Measure the plan's run here. Whole or slice is decided against what this
    machine can hold (`local_usable`), whatever budget the plan is for; the
    measured verdict is judged against the plan's budget."""
    from ..estimate.plan import predict
    from ..machine import mlx_backend
    from ..measure.parent import Comparison, measure, request_for
    from ..render.measurement import measure_progress
    from ..units import format_size

    # Judge the measurement against the estimate for the backend it runs on.
    backend = mlx_backend()
    raw_predicted, _ = predict(plan.model, plan.training, backend, length=plan.length)
    predicted, _ = predict(plan.model, plan.training, backend, plan.calibration, plan.length)
    usable = plan.machine.usable_bytes
    here = usable if local_usable is None else local_usable
    if plan.model.architecture is None and predicted > here and not force:
        raise MlxfitError(
            f"refusing to measure: the estimate ({format_size(predicted)}) exceeds {_budget_words(plan, here)} and "
            f"{plan.model.id} has no architecture to measure by slice; change the run or pass --force"
        )
    if plan.model.architecture is not None and (by_slice or (predicted > here and not force)):
        measurement = measure_slices(plan, backend, here, force, timeout, steps, quiet, whole=predicted)
    else:
        expected_duration(plan, timeout, steps, quiet)  # stops before building when past --timeout
        request = request_for(plan.model, plan.training, length=plan.length, max_steps=steps)
        with measure_progress(quiet=quiet) as on_event:
            measurement = measure(request, timeout=timeout, on_event=on_event)
    note = None
    if plan.model.architecture is not None:
        from ..estimate.calibration import architecture_key, measurements_dir, record

        try:
            record(plan.model.id, plan.training.to_dict(), backend, raw_predicted, measurement.to_dict(),
                   architecture=architecture_key(plan.model), length=plan.length,
                   machine=None if plan.machine.hypothetical else {"device_name": plan.machine.device_name,
                                                                   "total_bytes": plan.machine.total_bytes},
                   config=plan.model.config if plan.model.source == "local" else None)
        except OSError as e:  # the measurement stands; only its use for calibration is lost
            note = f"not stored for calibration: cannot write {e.filename or measurements_dir()} ({e.strerror or e})"
    return Comparison(measurement, predicted, usable, note=note)


def expected_duration(plan, timeout, steps, quiet, slices=None):
    """How long the measurement (of the run, or of `slices`) will take, from the steps'
    operations and this machine's rate; stops before building when past --timeout."""
    if plan.model.architecture is None:
        return
    from ..estimate import duration
    from ..measure.rate import matmul_rate
    from ..measure.slicing import slice_training, sliced_model
    from ..measure.steps import MIN_STEPS
    from ..model.lazy_model import checkpoint_dtype

    model, training = plan.model, plan.training
    bits = model.bits if model.quantized else (training.bits if training.quantize else None)
    dtype = str(checkpoint_dtype(model.config or {})).split(".")[-1]  # the activations' dtype
    rate = matmul_rate(dtype, bits, model.group_size or training.group_size)
    dtype = f"{bits}-bit" if bits else dtype
    if slices is None:
        expectation = duration.expect(model, training, plan.length, rate, dtype, MIN_STEPS, steps)
    else:
        runs = [(sliced_model(model, s), slice_training(training, s), s.steps(training)) for s in slices.slices]
        expectation = duration.expect_slices(runs, plan.length, rate, dtype, MIN_STEPS, steps)
    refusal = duration.too_long(expectation, timeout)
    if refusal:
        raise MlxfitError(refusal if slices is None else refusal.replace(", or --slice to measure a slice of the "
                                                                          "model (a few real-width blocks)", ""))
    if not quiet:
        from ..render.measurement import render_expectation

        render_expectation(expectation)


def _budget_words(plan, here):
    """The budget a measurement is held to: this machine's, named as such when the plan is for another."""
    from ..units import format_size

    if plan.machine.hypothetical:
        return f"this machine's {format_size(here)} budget (the plan's {format_size(plan.machine.usable_bytes)} is for another machine)"
    return f"the {format_size(here)} budget"


def measure_slices(plan, backend, usable, force, timeout, steps, quiet, whole=None):
    """A slice of the run: said beforehand, refused where even it would not fit.
    `usable`: what this machine can hold; `whole`: the whole run's estimate."""
    from ..estimate.plan import predict
    from ..measure.slicing import measure_by_slices, plan_slices, slice_training, sliced_model
    from ..render.measurement import measure_progress
    from ..render.text import print_hanging
    from ..units import format_gb, format_size

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
    if not quiet:
        why = ""
        if plan.machine.hypothetical and whole is not None and whole > usable:
            why = (f"; the whole run (about {format_gb(whole)}) would not fit this machine's {format_gb(usable)} budget, "
                   "and a measurement runs here")
        print_hanging(
            f"[bold]Slice[/]    measuring {slices.describe()}: {len(slices.slices)} short runs in one process, "
            f"each about {format_gb(need)} at most, extrapolated to the whole model{why}",
        )
    expected_duration(plan, timeout, steps, quiet, slices)
    with measure_progress(quiet=quiet) as on_event:
        return measure_by_slices(plan.model, plan.training, plan.length, steps, timeout=timeout, on_event=on_event)


@cli.command()
@click.option("--num-layers", type=int, help=f"Blocks to train, counted from the last; -1 for all [default: {_default('num_layers')}].")
@click.option("--batch-size", type=int, help=f"Examples per step [default: {_default('batch_size')}].")
@click.option("--max-seq-length", type=int, help=f"Longest example in tokens [default: {_default('max_seq_length')}].")
@click.option("--grad-checkpoint/--no-grad-checkpoint", default=None, help="Recompute activations in the backward pass [default: off].")
@click.option("--rank", type=int, help=f"LoRA rank [default: {_default('rank')}].")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), help=f"The optimizer, as in mlx_lm.lora [default: {_default('optimizer')}].")
@machine_options
@json_option
@handle_errors
def fits(memory, gpu_memory, reserve, json_, **training_flags):
    """What fits on this machine: model sizes 0.5B-70B by LoRA, QLoRA and full.

    Each cell is a catalog model of that size by the detailed estimate, at
    mlx-lm's defaults or the training flags given (as in mlxfit probe).

    \b
    Example:
      mlxfit fits --memory 36GiB                    # a Mac sold as 36GB
      mlxfit fits --memory 16GiB --batch-size 1 --max-seq-length 1024
    """
    from ..estimate.plan import fits_table
    from ..model.runconfig import resolve

    training = resolve({k: v for k, v in training_flags.items()}, None).training
    machine = get_machine(memory, gpu_memory, reserve)
    table = fits_table(machine, backend=machine.backend, training=training)
    if json_:
        print_json(table.to_dict())
    else:
        from ..render.readouts import render_fits

        render_fits(table)


@cli.command()
@json_option
@handle_errors
def models(json_):
    """List the built-in catalog (works offline; ids as on the Hugging Face Hub).

    \b
    Example:
      mlxfit models --json                          # ids, families, sizes as JSON
    """
    from ..model.resolve import catalog_rows

    rows = catalog_rows()
    if json_:
        print_json({"models": rows})
    else:
        from ..render.readouts import render_models

        render_models(rows)


@cli.command()
@click.option("--clear", is_flag=True, help="Remove every stored measurement.")
@click.option("--export", "export_path", type=click.Path(dir_okay=False, writable=True),
              help="Write the stored measurements to FILE as evidence rows (CSV, no paths of this machine): "
                   "see docs/accuracy.md to contribute them.")
@json_option
@handle_errors
def calibration(clear, export_path, json_):
    """Show (or --clear, or --export) the measurements that calibrate estimates on this machine.

    \b
    Example:
      mlxfit calibration --clear                    # forget this machine's measurements
      mlxfit calibration --export my_runs.csv       # your measurements as evidence rows
    """
    from ..estimate import calibration as store

    if export_path:
        from ..errors import BadInput
        from ..estimate import export

        machine = get_machine(None, None, None)
        try:
            n = export.write(export_path, store.stored(), {"device_name": machine.device_name, "total_bytes": machine.total_bytes})
        except OSError as e:
            raise BadInput(f"cannot write {export_path}: {e.strerror or e}") from e
        if json_:
            print_json({"exported": n, "file": export_path})
        else:
            from ..render.text import console

            console.print(f"Wrote {n} stored measurement{'s' if n != 1 else ''} to {export_path} as evidence rows")
        return
    if clear:
        removed = store.clear()
        if json_:
            print_json({"removed": removed})
        else:
            from ..render.text import console

            console.print(f"Removed {removed} stored measurement{'s' if removed != 1 else ''} from {store.measurements_dir()}")
        return
    entries = store.stored()
    if json_:
        print_json({"directory": str(store.measurements_dir()), "measurements": entries})
    else:
        from ..render.readouts import render_calibration

        render_calibration(store.measurements_dir(), entries)


from .bench import bench  # noqa: E402

cli.add_command(bench)
