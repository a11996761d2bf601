"""probe's mlx-lm-lora flags (--train-mode and what the modes add), and the probe
of a DPO, CPO, ORPO or GRPO run: parse, call mlxfit.answer_preference, render."""

from __future__ import annotations

from pathlib import Path

import click

from ..model.preference import CONFIG_DEFAULTS, MODES

MODE_WORDS = "dpo, cpo, orpo or grpo"  # the --train-mode values that are mlx_lm_lora.train's
FLAGS = ("train_mode", "beta", "reference_model_path", "max_completion_length", "efficient_long_context",
         "load_in_4bits", "load_in_6bits", "load_in_8bits", "prompt_length")


def preference_options(fn=None, *, sweep: bool = False):
    """The flags of mlx_lm_lora.train that change memory, with its defaults. `sweep`
    (bench): --max-completion-length takes a comma list, and there is no --data."""
    if fn is None:
        return lambda f: preference_options(f, sweep=sweep)
    d = CONFIG_DEFAULTS
    if sweep:
        completion = click.option("--max-completion-length", metavar="N[,N...]", help=f"GRPO: longest completion in tokens; a comma list sweeps it [default: {d['max_completion_length']}].")
        prompt = "GRPO: longest prompt in tokens [default: 256, said so]."
    else:
        completion = click.option("--max-completion-length", type=click.IntRange(min=1), help=f"GRPO: longest completion in tokens [default: {d['max_completion_length']}].")
        prompt = "GRPO: longest prompt in tokens [default: from --data, else 256, said so]."
    options = [
        click.option("--train-mode", type=click.Choice(MODES), help="sft (mlx_lm.lora), or dpo, cpo, orpo, grpo as mlx_lm_lora.train runs them [default: sft]. DPO, CPO and ORPO count their logits by running the step on a miniature of the model (a few seconds, once per shape; MLXFIT_MINIATURES=0: off)."),
        click.option("--beta", type=float, help=f"mlx-lm-lora's beta (GRPO: 0 skips the reference's forward pass) [default: {d['beta']}]."),
        click.option("--reference-model-path", metavar="MODEL", help="DPO, GRPO: the reference model [default: a second copy of --model]."),
        completion,
        click.option("--efficient-long-context", is_flag=True, default=None, help="DPO, CPO, ORPO: score and differentiate in 512-token chunks."),
        click.option("--load-in-4bits", is_flag=True, default=None, help="mlx-lm-lora: quantize the policy base to 4 bits (group 128) after loading."),
        click.option("--load-in-6bits", is_flag=True, default=None, help="mlx-lm-lora: the same with 6 bits."),
        click.option("--load-in-8bits", is_flag=True, default=None, help="mlx-lm-lora: the same with 8 bits."),
        click.option("--prompt-length", type=click.IntRange(min=1), help=prompt),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def mode_of(train_mode: str | None, config_path: str | None) -> str:
    """sft, or the mlx-lm-lora mode (dpo, cpo, orpo, grpo) from the flag or the YAML."""
    from ..model.preference import mode_from, read_yaml

    return mode_from(train_mode, read_yaml(Path(config_path)) if config_path else {})


def refuse_mode_flags(pref: dict) -> None:
    """mlx_lm_lora.train's own flags on an sft run (mlx_lm.lora) would change nothing: say so."""
    from ..errors import BadInput

    given = [name for name, value in pref.items() if name != "train_mode" and value is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise BadInput(f"{flag} is mlx_lm_lora.train's: add --train-mode {MODE_WORDS}")


def refuse_sft_flags(mode: str, method_given: bool, bits_given: bool) -> None:
    """mlx_lm.lora's --method and --bits mean nothing to mlx_lm_lora.train: say so rather
    than estimate a run the user did not ask for."""
    from ..errors import BadInput

    if method_given:
        raise BadInput(f"--method is mlx_lm.lora's: with --train-mode {mode} use --train-type (lora, dora, full) "
                       "and --load-in-4bits")
    if bits_given:
        raise BadInput("--bits is mlx_lm.lora's: mlx_lm_lora.train quantizes with --load-in-4bits, -6bits or -8bits")


def probe(model_spec, config_path, data, training_flags: dict, pref: dict, machine, backend, do_measure, timeout, steps,
          json_, reserve=None, verbose=False):
    """Call mlxfit.answer_preference.probe and print its answer (JSON or text)."""
    from .. import answer_preference
    from ..answer import Silent

    if json_:
        progress = Silent()
    else:
        from ..render.progress import ProbeProgress

        progress = ProbeProgress()
    answer = answer_preference.probe(model_spec, config_path, data, training_flags, pref, machine, backend, do_measure,
                                     timeout, steps, progress, reserve)
    if json_:
        from .options import print_json

        print_json(answer.to_dict())
    else:
        from ..render.preference import render

        a = answer
        render(a.model, a.run, a.estimate, a.usable_bytes, a.plans, a.stats, a.measured, notes=a.notes, verbose=verbose)
