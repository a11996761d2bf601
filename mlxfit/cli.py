"""The command line: parse, call, render. No computation lives here."""

from __future__ import annotations

import functools
import os

import click

from . import __version__
from .errors import MlxfitError
from .training import FINE_TUNE_TYPES, OPTIMIZERS, TrainingConfig

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class SizeParam(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        from .units import parse_bytes

        if isinstance(value, int):
            return value
        try:
            return parse_bytes(value)
        except MlxfitError as e:
            self.fail(str(e), param, ctx)


class ReserveParam(click.ParamType):
    name = "FRACTION|SIZE"

    def convert(self, value, param, ctx):
        from .machine import parse_reserve

        try:
            return parse_reserve(value)
        except MlxfitError as e:
            self.fail(str(e), param, ctx)


def handle_errors(fn):
    """Library errors become one line and an exit status; MLXFIT_DEBUG=1 re-raises."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlxfitError as e:
            if os.environ.get("MLXFIT_DEBUG"):
                raise
            if e.exit_code == 2:
                raise click.UsageError(str(e)) from None
            raise click.ClickException(str(e)) from None

    return wrapper


def machine_options(fn):
    options = [
        click.option("--memory", type=SizeParam(), help="Plan for a hypothetical unified-memory machine of this size instead of this one (36GB, 36GiB, 512MB)."),
        click.option("--gpu-memory", type=SizeParam(), help="Plan for a hypothetical discrete GPU with this much memory (the computer's RAM does not count)."),
        click.option("--reserve", type=ReserveParam(), help="Memory kept back for the OS and apps: a fraction (0.25, 25%) or a size (8GB). Default: a quarter of unified memory, 5% of a GPU's."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def json_option(fn):
    return click.option("json_", "--json", is_flag=True, help="Print one JSON object (bytes as integers) instead of text.")(fn)


def get_machine(memory, gpu_memory, reserve):
    from .machine import build_machine, read_platform

    return build_machine(read_platform(), reserve=reserve, memory=memory, gpu_memory=gpu_memory)


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
    """Show this machine's memory, the reserve and the budget for training."""
    from . import render

    machine = get_machine(memory, gpu_memory, reserve)
    if json_:
        render.print_json({"machine": machine.to_dict()})
    else:
        render.render_memory(machine)


@cli.command()
@click.option("--model", "-m", "model_spec", metavar="MODEL", help="A folder with config.json, a Hugging Face repo id, a catalog id (mlxfit models) or a size like 7B. Default: Qwen/Qwen3-0.6B.")
@click.option("--fine-tune-type", type=click.Choice(FINE_TUNE_TYPES), default="lora", show_default=True, help="As in mlx_lm.lora.")
@click.option("--method", type=click.Choice(["lora", "qlora", "full"]), help="Shortcut: qlora = LoRA on a 4-bit base; full = --fine-tune-type full.")
@click.option("--num-layers", type=int, default=16, show_default=True, help="Blocks to train, counted from the last; -1 for all.")
@click.option("--batch-size", type=int, default=4, show_default=True, help="Examples per step.")
@click.option("--max-seq-length", type=int, default=2048, show_default=True, help="Longest example in tokens.")
@click.option("--grad-checkpoint", is_flag=True, help="Recompute activations in the backward pass (less memory, slower).")
@click.option("--rank", type=int, default=8, show_default=True, help="LoRA rank.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adam", show_default=True)
@click.option("--bits", type=int, default=4, show_default=True, help="QLoRA: bits per weight of the quantized base.")
@click.option("--group-size", type=int, default=64, show_default=True, help="QLoRA: quantization group size.")
@click.option("--hosts", type=click.IntRange(min=1), default=1, show_default=True, help="Data-parallel nodes under mlx.launch: each holds the whole model and batch-size / hosts examples.")
@click.option("--hostfile", type=click.Path(dir_okay=False), help="mlx.launch's JSON hostfile with a \"memory\" size per host: checks every node.")
@click.option("--backend", type=click.Choice(["cpu", "metal", "cuda"]), help="Estimate for this MLX backend (default: this machine's; metal with --memory, cuda with --gpu-memory).")
@click.option("--measure", "do_measure", is_flag=True, help="Also run a few real mlx-lm training steps (in a child process) and report the true peak.")
@click.option("--force", is_flag=True, help="Measure even when the estimate says the run does not fit.")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True, help="Seconds before a measurement is stopped.")
@click.option("--steps", type=click.IntRange(min=3), default=6, show_default=True, help="Most steps to measure; stops earlier once the peak has held for two steps.")
@machine_options
@json_option
@handle_errors
def probe(model_spec, fine_tune_type, method, num_layers, batch_size, max_seq_length, grad_checkpoint, rank, optimizer, bits, group_size, hosts, hostfile, backend, do_measure, force, timeout, steps, memory, gpu_memory, reserve, json_):
    """Will LoRA, QLoRA and full fine-tuning of MODEL fit? What to change if not.

    With --measure, mlxfit then trains the run you asked for a few steps with
    mlx-lm (random weights in the model's dtype when only a config is at hand)
    and reports the measured peak beside the prediction.
    """
    from . import render
    from .model import resolve_model
    from .plan import make_plan

    if method == "full":
        fine_tune_type = "full"
    elif method in ("lora", "qlora") and fine_tune_type == "full":
        fine_tune_type = "lora"
    host_list = None
    if hostfile:
        from pathlib import Path

        from .hosts import read_hostfile
        from .machine import read_platform

        host_list = read_hostfile(Path(hostfile), read_platform(), reserve)
        hosts = len(host_list)
        backend = backend or "metal"  # mlx.launch's ring backend joins Macs
    training = TrainingConfig(
        hosts=hosts,
        fine_tune_type=fine_tune_type,
        optimizer=optimizer,
        num_layers=num_layers,
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        grad_checkpoint=grad_checkpoint,
        rank=rank,
        quantize=(method == "qlora"),
        bits=bits,
        group_size=group_size,
    )
    model = resolve_model(model_spec)
    if model.architecture is not None:
        training.layers_trained(model.architecture.num_layers)
    machine = get_machine(memory, gpu_memory, reserve)
    plan = make_plan(machine, model, training, backend=backend, calibration=local_calibration(machine, backend))
    comparison = None
    if do_measure:
        comparison = run_measurement(plan, force=force, timeout=timeout, steps=steps, quiet=json_)
    host_checks = [h.check(plan.selected.predicted_bytes) for h in host_list] if host_list else None
    if json_:
        data = plan.to_dict()
        if host_checks is not None:
            data["hosts"] = host_checks
        if comparison is not None:
            data.update(comparison.to_dict())
        render.print_json(data)
    else:
        render.render_plan(plan)
        if host_checks is not None:
            render.render_hosts(host_checks)
        if comparison is not None:
            render.render_comparison(comparison)


def local_calibration(machine, backend):
    """Stored measurements correct estimates for this machine's own backend only."""
    from .calibration import calibration

    if machine.hypothetical or (backend and backend != machine.backend):
        return None
    return calibration(machine.backend)


def run_measurement(plan, force, timeout, steps, quiet):
    from . import render
    from .machine import mlx_backend
    from .measure import Comparison, measure, request_for
    from .plan import predict
    from .units import format_gb

    # Judge the measurement against the estimate for the backend it runs on.
    backend = mlx_backend()
    raw_predicted, _ = predict(plan.model, plan.training, backend)
    predicted, _ = predict(plan.model, plan.training, backend, plan.calibration)
    usable = plan.machine.usable_bytes
    if predicted > usable and not force:
        raise MlxfitError(
            f"refusing to measure: the predicted {format_gb(predicted)} exceeds the "
            f"{format_gb(usable)} budget and could push this machine into swap; "
            "change the run (see the remedies without --measure) or pass --force"
        )
    request = request_for(plan.model, plan.training, max_steps=steps)
    with render.measure_progress(quiet=quiet) as on_event:
        measurement = measure(request, timeout=timeout, on_event=on_event)
    if plan.model.architecture is not None:
        from .calibration import record

        record(plan.model.id, plan.training.to_dict(), backend, raw_predicted, measurement.to_dict())
    return Comparison(measurement, predicted, usable)


@cli.command()
@machine_options
@json_option
@handle_errors
def fits(memory, gpu_memory, reserve, json_):
    """What fits on this machine: model sizes 0.5B-70B by LoRA, QLoRA and full."""
    from . import render
    from .plan import fits_table

    table = fits_table(get_machine(memory, gpu_memory, reserve))
    if json_:
        render.print_json(table.to_dict())
    else:
        render.render_fits(table)


@cli.command()
@json_option
@handle_errors
def models(json_):
    """List the built-in catalog (works offline; ids as on the Hugging Face Hub)."""
    from . import render
    from .model import catalog, from_catalog

    rows = []
    for hub_id, _ in catalog().values():
        info = from_catalog(hub_id)
        rows.append((hub_id, info.model_type, info.params))
    if json_:
        render.print_json({"models": [{"id": i, "model_type": t, "params": p} for i, t, p in rows]})
    else:
        render.render_models(rows)


@cli.command()
@click.option("--clear", is_flag=True, help="Remove every stored measurement.")
@json_option
@handle_errors
def calibration(clear, json_):
    """Show (or --clear) the measurements that calibrate estimates on this machine."""
    from . import calibration as store
    from . import render

    if clear:
        removed = store.clear()
        if json_:
            render.print_json({"removed": removed})
        else:
            render.console.print(f"Removed {removed} stored measurement{'s' if removed != 1 else ''} from {store.measurements_dir()}")
        return
    entries = store.stored()
    if json_:
        render.print_json({"directory": str(store.measurements_dir()), "measurements": entries})
    else:
        render.render_calibration(store.measurements_dir(), entries)
