"""probe's mlx-lm-lora flags (--train-mode and what the modes add), and the probe
of a DPO, CPO, ORPO or GRPO run: parse, call, render."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import BadInput
from ..model.preference import CONFIG_DEFAULTS, MODES

FLAGS = ("train_mode", "beta", "reference_model_path", "max_completion_length", "efficient_long_context",
         "load_in_4bits", "load_in_6bits", "load_in_8bits", "prompt_length")


def preference_options(fn):
    """The flags of mlx_lm_lora.train that change memory, with its defaults."""
    d = CONFIG_DEFAULTS
    options = [
        click.option("--train-mode", type=click.Choice(MODES), help="sft (mlx_lm.lora), or dpo, cpo, orpo, grpo as mlx_lm_lora.train runs them [default: sft]."),
        click.option("--beta", type=float, help=f"mlx-lm-lora's beta (GRPO: 0 skips the reference's forward pass) [default: {d['beta']}]."),
        click.option("--reference-model-path", metavar="MODEL", help="DPO, GRPO: the reference model [default: a second copy of --model]."),
        click.option("--max-completion-length", type=click.IntRange(min=1), help=f"GRPO: longest completion in tokens [default: {d['max_completion_length']}]."),
        click.option("--efficient-long-context", is_flag=True, default=None, help="DPO, CPO, ORPO: score and differentiate in 512-token chunks."),
        click.option("--load-in-4bits", is_flag=True, default=None, help="mlx-lm-lora: quantize the policy base to 4 bits (group 128) after loading."),
        click.option("--load-in-6bits", is_flag=True, default=None, help="mlx-lm-lora: the same with 6 bits."),
        click.option("--load-in-8bits", is_flag=True, default=None, help="mlx-lm-lora: the same with 8 bits."),
        click.option("--prompt-length", type=click.IntRange(min=1), help="GRPO: longest prompt in tokens [default: from --data, else 256, said so]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def wanted(train_mode: str | None, config_path: str | None) -> bool:
    """Is this an mlx-lm-lora run (a mode other than sft, from the flag or the YAML)?"""
    from ..model.preference import mode_from, read_yaml

    mode = mode_from(train_mode, read_yaml(Path(config_path)) if config_path else {})
    return mode != "sft"


def probe(model_spec, config_path, data, training_flags: dict, pref: dict, machine, backend, do_measure, timeout, steps,
          json_):
    from dataclasses import replace

    from ..estimate import preference as est
    from ..model.preference import mode_from, read_data, read_yaml, resolve_run
    from ..model.resolve import resolve_model

    config = read_yaml(Path(config_path)) if config_path else {}
    mode = mode_from(pref.pop("train_mode"), config)
    if training_flags.get("hosts") not in (None, 1):
        raise BadInput(f"--hosts is not covered for --train-mode {mode}")
    if training_flags.get("bits") is not None:
        raise BadInput("--bits is mlx_lm.lora's: mlx_lm_lora.train quantizes with --load-in-4bits, -6bits or -8bits")
    flags = {**training_flags, **pref, "rl_group_size": training_flags.get("group_size")}
    model = resolve_model(model_spec or config.get("model"))
    size_note = None
    if model.architecture is None:
        from ..estimate.plan import nearest_catalog_model

        near = nearest_catalog_model(model.params) if model.params else None
        if near is None:
            raise BadInput(f"{model.id}: no architecture to build, and no catalog model of its size")
        size_note = f"{model.id} has no architecture: planned as {near.id}, the catalog's nearest in size"
        model = near
    run = resolve_run(mode, flags, config)
    reference = None
    if run.has_reference and run.reference_model_path:
        reference = resolve_model(run.reference_model_path)
        if reference.architecture is None:
            raise BadInput(f"--reference-model-path {run.reference_model_path}: no architecture to size")
    data = data or (config.get("data") if config.get("data") and Path(str(config["data"])).expanduser().exists() else None)
    stats = None
    length = None
    prompt_length = pref.get("prompt_length")
    if data:
        from ..model.dataset import load_tokenizer

        choice = load_tokenizer(model)
        if choice.approximate:
            raise BadInput(f"--data with --train-mode {mode} needs the model's tokenizer: {choice.note}")
        stats = read_data(data, run, choice.tokenizer)
        if mode == "grpo":
            prompt_length = prompt_length or stats.widest
        else:
            length = stats.widest
    if mode == "grpo":
        run = replace(run, prompt_length=prompt_length)
    backend = backend or machine.backend
    estimate = est.estimate_run(model, run, backend, length, reference, prompt_length)
    usable = machine.usable_bytes
    plans = est.plan(model, run, usable, backend, length, reference, prompt_length)
    measured = None
    if do_measure:
        measured = measure(model, run, estimate, timeout, steps, json_)
    if json_:
        from .options import print_json

        out = {
            "machine": machine.to_dict(),
            "model": model.id,
            "run": run.to_dict(),
            "estimate": estimate.to_dict(),
            "usable_bytes": usable,
            "fits": estimate.peak_bytes <= usable,
            "plans": {k: [c.__dict__ for c in v] for k, v in plans.items()},
        }
        if stats is not None:
            out["data"] = stats.to_dict()
        if size_note:
            out["notes"] = [size_note]
        if measured is not None:
            out["measured"] = measured.to_dict()
        print_json(out)
    else:
        from ..render.preference import render

        render(model, run, estimate, usable, plans, stats, measured, notes=[size_note] if size_note else [])


def measure(model, run, estimate, timeout, steps, quiet):
    from ..measure.preference import measure as run_measure
    from ..model.preference import installed, EXTRA
    from ..errors import MlxfitError

    if not installed():
        raise MlxfitError(f"--measure with --train-mode {run.mode} runs mlx-lm-lora's trainer, which is not installed: {EXTRA}")
    from ..render.measurement import measure_progress

    with measure_progress(quiet=quiet) as on_event:
        return run_measure(model, run, estimate.length if run.mode != "grpo" else estimate.length,
                           prompt_length=estimate.prompt_length, steps=min(steps, 4), timeout=timeout, on_event=on_event)
