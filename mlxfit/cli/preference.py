"""probe's mlx-lm-lora flags (--train-mode and what the modes add), and the printing of
a DPO, CPO, ORPO or GRPO probe's answer (mlxfit.answer_preference)."""

from __future__ import annotations

import click

from ..model.preference import CONFIG_DEFAULTS, MODES, RUN_FLAGS, refuse_mode_flags, refuse_sft_flags  # noqa: F401

FLAGS = ("train_mode", *RUN_FLAGS)


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
        click.option("--train-mode", type=click.Choice(MODES), help="sft (mlx_lm.lora), or dpo, cpo, orpo, grpo as mlx_lm_lora.train runs them [default: sft]. DPO, CPO and ORPO count their logits by running the step on a miniature of the model: shipped with mlxfit for catalog models at mlx-lm-lora's defaults, else counted the first time (then remembered): tens of seconds, 33 s for a 28-block model's DPO on a 2-core CPU, said before it starts (MLXFIT_MINIATURES=0: off)."),
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


def print_answer(answer, json_: bool, verbose: bool = False) -> None:
    """The probe of a DPO, CPO, ORPO or GRPO run (mlxfit.answer_preference), as JSON or text
    (the whole answer with `verbose`)."""
    if json_:
        from .options import print_json

        print_json(answer.to_dict())
    elif answer.run.spec.chosen_by_model:  # a vision-language model's (mlx-vlm)
        from .vision import print_answer as print_vision

        print_vision(answer, verbose)
    else:
        from ..render.preference import render

        a = answer
        render(a.model, a.run, a.estimate, a.usable_bytes, a.plans, a.stats, a.measured, notes=a.notes, verbose=verbose,
               time=a.time)
