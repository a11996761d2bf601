"""The command line: parse, call, render. No computation lives here."""

from __future__ import annotations

import os
import click

from .. import __version__
from ..errors import BadInput
from ..model.training import FINE_TUNE_TYPES, OPTIMIZERS
from . import preference
from .preference import preference_options
from .vision import vision_options
from .options import (
    CONTEXT_SETTINGS,
    get_machine,
    given_flag,
    handle_errors,
    json_option,
    machine_options,
    miniatures,
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
@click.option("--grad-accumulation-steps", "--gradient-accumulation-steps", "grad_accumulation_steps", type=int, help="Steps accumulated before each optimizer update (--gradient-accumulation-steps: mlx_lm_lora.train's name) [default: 1].")
@click.option("--rank", type=int, help=f"LoRA rank [default: {_default('rank')}].")
@click.option("--lora-dropout", "dropout", type=float, help="LoRA dropout: mlx_lm.lora's lora_parameters.dropout (in -c), mlx_vlm.train's --lora-dropout; above 0 each adapter keeps its dropped-out input and mask for the backward pass [default: 0].")
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
@click.option("--iters", type=click.IntRange(min=1), help="Iterations of the run, as mlx_lm.lora --iters, for its time [default: the YAML's, else 1000].")
@click.option("--chip", metavar="CHIP", help='The Apple chip the run is timed for ("M3 Max"); default: this machine, or the one chip sold with --memory\'s size.')
@click.option("-v", "--verbose", is_flag=True, help="The whole answer: each estimate's parts and bars, the rule of thumb, the alternatives and each change alone (--json always has them).")
@preference_options
@vision_options
@machine_options
@json_option
@handle_errors
def probe(model_arg, model_spec, config_path, data, method, skip_bad_lines, trust_remote_code, hostfile, backend, do_measure, by_slice, force, timeout, steps, verbose, memory, gpu_memory, reserve, json_, iters=None, chip=None, **training_flags):
    """Will LoRA, QLoRA and full fine-tuning of MODEL fit? What to change if not.

    MODEL may be given as the argument or as --model (which wins when both are).

    Flags, an mlx_lm.lora YAML file (-c) and mlx-lm's defaults combine as in
    mlx-lm. With --data, the widest batch of your data sets the length. With
    --measure, mlxfit then trains the run a few steps with mlx-lm (random
    weights in the model's dtype when only a config is at hand) and reports the
    measured peak beside the prediction.

    \b
    The answer leads with each method's verdict and the plan; -v adds each
    estimate's parts, the rule of thumb and every change.

    \b
    Example:
      mlxfit probe Qwen/Qwen2.5-7B-Instruct --memory 16GB --batch-size 2
      mlxfit probe Qwen/Qwen3-4B --memory 16GiB -v   # the whole answer
    """
    from .. import api
    from ..model.runconfig import one_model

    model_spec = one_model(model_arg, model_spec)
    _check_probe_flags(chip, do_measure, by_slice, force, hostfile, memory, gpu_memory, training_flags.get("hosts"))
    # Every mode through the API's one probe: the same checks, the same answer as a notebook's.
    answer = api.probe(model_spec, config=config_path, data=data, method=method, memory=memory, gpu_memory=gpu_memory,
                       reserve=reserve, backend=backend, hostfile=hostfile, skip_bad_lines=skip_bad_lines,
                       trust_remote_code=trust_remote_code, measure=do_measure, by_slice=by_slice, force=force,
                       timeout=timeout, steps=steps, progress=_probe_progress(json_), chip=chip, iters=iters,
                       miniatures=miniatures(), **training_flags)
    _print_probe(answer, json_, verbose)


def _check_probe_flags(chip, do_measure, by_slice, force, hostfile, memory, gpu_memory, hosts) -> None:
    """What probe refuses before anything is resolved: an unknown chip, measuring flags
    without --measure, machine flags beside --hostfile."""
    if chip:
        from ..estimate.step_time import find_chip

        find_chip(chip)  # an unknown chip stops here, before anything is resolved
    ctx = click.get_current_context()
    for flag, given in (("--slice", by_slice), ("--force", force),
                        ("--timeout", given_flag(ctx, "timeout")), ("--steps", given_flag(ctx, "steps"))):
        if given and not do_measure:
            raise BadInput(f"{flag} is about measuring: add --measure (or leave {flag} out)")
    if hostfile:
        for flag, given in (("--memory", memory), ("--gpu-memory", gpu_memory), ("--hosts", hosts)):
            if given is not None:
                raise BadInput(f"{flag} with --hostfile: the hostfile gives every host and its memory; leave {flag} out")


def _probe_progress(json_: bool):
    """What a measurement shows while it runs: nothing with --json."""
    if json_:
        from ..answer import Silent

        return Silent()
    from ..render.progress import ProbeProgress  # rich when first drawn, for text only

    return ProbeProgress()


def _print_probe(answer, json_: bool, verbose: bool) -> None:
    from ..answer_preference import PreferenceAnswer

    if isinstance(answer, PreferenceAnswer):  # mlx-lm-lora's modes
        return preference.print_answer(answer, json_, verbose)
    if os.environ.get("MLX_RANK", "0") != "0":
        return  # under mlx.launch, rank 0 reports every rank's figures
    if json_:
        print_json(answer.to_dict())
    else:
        from ..render.probe import render_answer

        render_answer(answer, verbose=verbose)


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
    from ..errors import BadInput
    from ..estimate import calibration as store

    if export_path and clear:
        raise BadInput("--clear with --export: export first (mlxfit calibration --export FILE), "
                       "then --clear, so nothing is deleted before it is written")
    if export_path:
        return _export_calibration(export_path, json_)
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


def _export_calibration(export_path, json_: bool) -> None:
    """calibration --export: the stored measurements written as evidence rows."""
    from ..estimate import calibration as store
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


from .bench import bench  # noqa: E402

cli.add_command(bench)
