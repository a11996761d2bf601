"""`mlxfit bench`: parse, call mlxfit/measure/bench/, render with mlxfit/render/bench.py.

Registered on the group in mlxfit/cli/main.py with `cli.add_command(bench)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import click

from ..errors import BadInput, MlxfitError
from ..model.training import OPTIMIZERS, TrainingConfig
from ..model.runconfig import check_method
from ..modes import DEFAULT, get_mode
from .preference import preference_options, refuse_mode_flags, refuse_sft_flags
from .options import (
    CONTEXT_SETTINGS,
    get_machine,
    given_flag,
    handle_errors,
    json_option,
    local_calibration,
    local_usable_bytes,
    machine_options,
    miniatures,
    print_json,
)

LIST = "N[,N...]"
MAX_CHOICES = ("batch_size", "max_seq_length", "batch-size", "max-seq-length")
# What --train-mode dpo, cpo, orpo or grpo sweeps of bench's own flags; left at
# their defaults, mlx-lm-lora's defaults apply (all blocks, batch 1).
PREFERENCE_SWEPT = ("fine_tune_type", "num_layers", "batch_size", "max_seq_length", "rank", "grad_checkpoint")


def check_writable(option: str, path: str | None) -> None:
    """An output file whose folder is missing or read-only fails now, not after a sweep."""
    import os
    from pathlib import Path

    if not path:
        return
    folder = Path(path).expanduser().parent
    if not folder.is_dir():
        raise BadInput(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BadInput(f"{option} {path}: the folder {folder} is not writable")


@click.command(context_settings=CONTEXT_SETTINGS)
@click.option("--model", "-m", "model_spec", metavar="MODEL", help="A folder with config.json, a Hugging Face repo id, a catalog id or a size like 7B. Default: Qwen/Qwen3-0.6B.")
@click.option("--method", metavar="M[,M...]", help="Any of lora, qlora, full (as in mlxfit probe). Default: lora.")
@click.option("--fine-tune-type", "--train-type", "fine_tune_type", metavar="T[,T...]", default="lora", show_default=True, help="Any of lora, dora, full (--train-type: mlx_lm_lora.train's name).")
@click.option("--num-layers", metavar=LIST, default="16", help="Blocks to train, counted from the last; -1 for all [default: 16; with --train-mode dpo, cpo, orpo, grpo: -1, as mlx_lm_lora.train].")
@click.option("--batch-size", metavar=LIST, default="4", help="Examples per step [default: 4; with --train-mode dpo, cpo, orpo, grpo: 1].")
@click.option("--max-seq-length", metavar=LIST, default="2048", show_default=True, help="Longest example in tokens.")
@click.option("--rank", metavar=LIST, default="8", show_default=True, help="LoRA rank.")
@click.option("--grad-checkpoint", metavar="on[,off]", default="off", show_default=True, help="Recompute activations in the backward pass.")
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adam", show_default=True)
@click.option("--bits", type=int, default=4, show_default=True, help="QLoRA: bits per weight of the quantized base.")
@click.option("--group-size", type=int, default=64, help="QLoRA: quantization group size [default: 64]. With --train-mode grpo: completions per prompt, as mlx_lm_lora.train [default: 4].")
@click.option("--max", "maximize", type=click.Choice(MAX_CHOICES), help="Instead of a sweep: the largest batch_size or max_seq_length that fits the budget less --margin (sft runs only, not --train-mode dpo, cpo, orpo, grpo).")
@click.option("--margin", type=click.FloatRange(0, 1, max_open=True), default=0.1, show_default=True, help="With --max: the share of the budget kept free.")
@click.option("--estimate-only", is_flag=True, help="Predict only; measure nothing.")
@click.option("--force", is_flag=True, help="Measure combinations predicted not to fit too.")
@click.option("--out", type=click.Path(dir_okay=False), help="Append one CSV row per combination to this file as it finishes.")
@click.option("--resume", is_flag=True, help="Skip the combinations already in --out (an interrupted sweep).")
@click.option("--plot", type=click.Path(dir_okay=False), help="Draw measured vs predicted peak and tokens/second to this PNG (needs mlxfit[plot]).")
@click.option("--backend", type=click.Choice(["cpu", "metal", "cuda"]), help="With --estimate-only: estimate for this MLX backend. Measured runs use this machine's.")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True, help="Seconds before one measurement is stopped.")
@click.option("--steps", type=click.IntRange(min=3), default=6, show_default=True, help="Most steps per measurement (at most 4 with --train-mode dpo, cpo, orpo, grpo, as probe --measure).")
@preference_options(sweep=True)
@machine_options
@json_option
@handle_errors
def bench(model_spec, method, fine_tune_type, num_layers, batch_size, max_seq_length, rank, grad_checkpoint,
          optimizer, bits, group_size, maximize, margin, estimate_only, force, out, resume, plot, backend,
          timeout, steps, memory, gpu_memory, reserve, json_, **pref):
    """Sweep training settings: predicted and measured peak and speed of each combination.

    Comma-separated values sweep a setting; every combination runs in order of
    increasing prediction, a few real mlx-lm steps each. --max finds the largest
    batch size or sequence length that fits instead.

    With --train-mode dpo, cpo, orpo or grpo each combination is an mlx_lm_lora.train
    run: the preference estimate (its peak and peak phase) and a few steps of
    mlx-lm-lora's own trainer (pip install 'mlxfit[rl]'); one this machine cannot
    hold is not measured, even with --force (it cannot be measured by slice).

    Exit status 3: a measurement timed out, so whether that run fits is unknown
    (never reported as "does not fit"); 130 (143, 129: SIGTERM, SIGHUP): interrupted.

    \b
    Examples:
      mlxfit bench -m Qwen/Qwen3-0.6B --batch-size 1,2,4,8 --max-seq-length 512,1024 --out r.csv --plot r.png
      mlxfit bench -m Qwen/Qwen3-0.6B --method lora,qlora --grad-checkpoint on,off --estimate-only
      mlxfit bench -m Qwen/Qwen3-0.6B --max batch_size --memory 16GB
      mlxfit bench -m Qwen/Qwen3-0.6B --train-mode grpo --max-completion-length 128,256,512 --estimate-only
    """
    ctx = click.get_current_context()
    b = checked_flags(ctx, pref)
    resolve(b)
    combine(b)
    if b.setting:
        search_max(ctx, b)
    else:
        sweep(ctx, b)


@dataclass
class Bench:
    """One bench command: its flags (click's parameters, by name) and what is resolved
    from them, stage by stage: the model, the machine and backend, the combinations."""

    flags: dict
    mode: str
    pref: dict  # mlx-lm-lora's flags left to give its runs
    sweeps: dict = field(default_factory=dict)
    setting: str | None = None  # what --max searches; None: a sweep
    model: Any = None
    machine: Any = None
    backend: str | None = None
    trainings: list = field(default_factory=list)
    runs: list | None = None  # mlx-lm-lora's runs (--train-mode dpo, cpo, orpo, grpo)
    notes: list = field(default_factory=list)
    calibration: Any = None
    local_usable: int | None = None  # what a measurement may take here (sft: over it, by slice)

    @property
    def sft(self) -> bool:
        return get_mode(self.mode).by_mlx_lm  # mlx_lm.lora's sweep, else mlx_lm_lora.train's

    @property
    def measuring(self) -> bool:
        return not self.flags["estimate_only"]

    @property
    def quiet(self) -> bool:
        return self.flags["json_"] or not self.measuring


def checked_flags(ctx, pref: dict) -> Bench:
    """The flags parsed into the lists to sweep, everything that would mean nothing
    refused before anything is resolved or measured."""
    f = ctx.params
    b = Bench(f, pref.pop("train_mode") or DEFAULT, pref)
    given = {name: f[name] for name in ("method", *PREFERENCE_SWEPT)}
    if b.sft:
        refuse_mode_flags(pref)
    else:
        given = preference_sweeps(ctx, b.mode, given, f["maximize"], pref)
    b.sweeps, b.setting = checked_sweeps(ctx, b.mode, given, f["maximize"], f["out"], f["resume"], f["plot"],
                                         f["force"], f["estimate_only"])
    if f["plot"]:
        from ..render import bench as render_bench

        render_bench.check_plotting()
    return b


def resolve(b: Bench) -> None:
    """The model (one with an architecture where it is to be built), the machine
    planned for, and the backend estimated for."""
    from ..model.resolve import resolve_model

    b.model = model = resolve_model(b.flags["model_spec"])
    if not b.sft:
        from ..model.preference import require_extra

        if model.architecture is None:
            raise BadInput(f"{model.id} is a bare size with no architecture: --train-mode {b.mode} needs one (a catalog id, "
                           "a Hugging Face repo id or a folder with config.json)")
        if b.measuring:
            require_extra(f"bench --train-mode {b.mode} without --estimate-only")
    if b.measuring and model.config is None:
        raise MlxfitError(
            f"{model.id} is a bare size with no architecture to build: measure a catalog id, a Hugging Face "
            "repo id or a folder with config.json, or add --estimate-only"
        )
    b.machine = get_machine(b.flags["memory"], b.flags["gpu_memory"], b.flags["reserve"])
    b.backend = measured_backend(b.flags["backend"]) if b.measuring else b.flags["backend"] or b.machine.backend


def measured_backend(backend: str | None) -> str:
    """This machine's backend: the prediction is judged against a measurement made here."""
    from ..machine import mlx_backend

    local = mlx_backend()
    if backend and backend != local:
        raise BadInput(f"--backend {backend}: measured runs run on this machine's {local} backend; add --estimate-only to estimate for {backend}")
    return local


def combine(b: Bench) -> None:
    """Every combination's training settings (and mlx-lm-lora's runs), with the notes
    the rows rest on."""
    from ..measure import bench as lib
    from ..render import bench as render_bench

    f = b.flags
    if b.sft:
        b.calibration = local_calibration(b.machine, b.backend, b.model)
        b.local_usable = local_usable_bytes(b.machine, f["reserve"])
        base = TrainingConfig(optimizer=f["optimizer"], bits=f["bits"], group_size=f["group_size"])
        if b.setting:  # searched: its default is not the run's, and must not be checked as if it were
            b.sweeps[b.setting] = (lib.SEARCH_UNITS[b.setting],)
        b.trainings = lib.combinations(b.model, base, b.sweeps)
        b.notes = [render_bench.hypothetical_note(b.machine)] if b.measuring and b.machine.hypothetical else []
        return
    from ..measure.bench import preference as pref_lib

    rl_group_size = f["group_size"] if given_flag(click.get_current_context(), "group_size") else None
    flags = {**b.pref, "optimizer": f["optimizer"], "rl_group_size": rl_group_size}
    b.runs = pref_lib.combinations(b.model, b.mode, flags, b.sweeps)
    b.trainings = [run.training for run in b.runs]
    b.notes = preference_notes(b.runs, b.machine, b.measuring)


def search_max(ctx, b: Bench) -> None:
    """--max: the largest batch size or sequence length that fits, searched and shown."""
    from ..measure import bench as lib
    from ..render import bench as render_bench

    f, machine = b.flags, b.machine
    if not f["json_"]:
        render_bench.render_header(machine, b.model, b.trainings[0], [b.setting], measuring=b.measuring)
    with render_bench.search_progress(b.setting, quiet=b.quiet) as on_event:
        result = lib.find_max(
            b.model, b.trainings[0], b.setting, machine.usable_bytes, b.backend, margin=f["margin"],
            calibration=b.calibration, measure_runs=b.measuring, timeout=f["timeout"], steps=f["steps"],
            on_event=on_event, local_usable_bytes=b.local_usable,
        )
    if f["json_"]:
        print_json({"model": b.model.to_dict(), "machine": machine.to_dict(), "notes": b.notes, "max": result.to_dict()})
    else:
        render_bench.render_max(result)
    if result.unknown:
        ctx.exit(lib.EXIT_UNKNOWN)


@dataclass
class Swept:
    """What a sweep gave: its rows, how many were read back from --out, the exit code
    of a signal that interrupted it (0: none), and why it stopped early (None: it did not)."""

    rows: list = field(default_factory=list)
    resumed: int = 0
    written: int = 0
    interrupted: int = 0
    failed: str | None = None


def sweep(ctx, b: Bench) -> None:
    """The combinations planned, each run (or read back from --out) in order, written
    to --out as it finishes, plotted and shown; the exit status says what was unknown."""
    from ..measure import bench as lib

    log, stored = opened_log(b)
    planned = plan(b)
    expected = sweep_duration_here(b, planned)
    varying = varying_settings(b)
    if not b.flags["json_"]:
        render_sweep_header(b, varying, expected)
    swept = run_combinations(b, planned, stored, log, varying)
    plot = plotted(b, swept, varying)
    report(b, swept, varying, len(planned), plot)
    if swept.failed:
        raise MlxfitError(swept.failed)
    if swept.interrupted:
        ctx.exit(swept.interrupted)
    if any(row.status == lib.UNKNOWN for row in swept.rows):
        ctx.exit(lib.EXIT_UNKNOWN)


def opened_log(b: Bench) -> tuple:
    """--out's CSV log (None without it), checked, and with --resume the rows it holds by key."""
    from ..measure import bench as lib

    out = b.flags["out"]
    if not out:
        return None, {}
    if b.sft:
        log = lib.CsvLog(out)
    else:
        from ..measure.bench import preference as pref_lib

        log = lib.CsvLog(out, row=pref_lib.PreferenceRow)
    log.check()
    return log, ({row.key: row for row in log.read()} if b.flags["resume"] else {})


def plan(b: Bench) -> list:
    """Each combination with its estimate and what to do with it, by increasing estimate."""
    from ..measure import bench as lib

    f = b.flags
    if b.sft:
        return lib.plan_sweep(b.model, b.trainings, b.machine.usable_bytes, b.backend, b.calibration, b.measuring,
                              f["force"])
    from ..measure.bench import preference as pref_lib

    return plan_preference(pref_lib, b.model, b.runs, b.machine, f["reserve"], b.backend, b.measuring, f["force"],
                           quiet=f["json_"])


def sweep_duration_here(b: Bench, planned: list):
    """How long the sft sweep's measurements will take (refused past --timeout); None otherwise."""
    if not (b.sft and b.measuring):
        return None
    from ..answer import sweep_duration

    return sweep_duration(b.model, planned, b.flags["timeout"], b.flags["steps"], b.local_usable)


def varying_settings(b: Bench) -> list:
    """The settings that differ between combinations: the columns of the table."""
    from ..render import bench as render_bench

    varying = [name for name, values in b.sweeps.items() if len(values) > 1]
    # --method full,qlora with one --fine-tune-type still gives runs of two types.
    varying += [name for name, (_, shown) in render_bench.SETTING_COLUMNS.items()
                if name not in varying and len({shown(t) for t in b.trainings}) > 1]
    return varying


def render_sweep_header(b: Bench, varying: list, expected) -> None:
    from ..render import bench as render_bench

    out, first = b.flags["out"], b.trainings[0]
    if b.sft:
        render_bench.render_header(b.machine, b.model, first, varying, out, measuring=b.measuring)
        if b.measuring:
            render_bench.render_expected(*expected)
    else:
        render_bench.render_header(b.machine, b.model, first, varying, out, measuring=b.measuring, run=b.runs[0],
                                   notes=b.notes)


def run_combinations(b: Bench, planned: list, stored: dict, log, varying: list) -> Swept:
    """Each planned combination measured (or estimated, or read back), its row appended
    to --out as it comes; a row that cannot be written stops the sweep, Ctrl-C too."""
    from ..measure import bench as lib
    from ..render import bench as render_bench

    f, swept = b.flags, Swept()
    with render_bench.sweep_progress(len(planned), varying, quiet=b.quiet) as on_event:
        try:
            if b.sft:
                rows = lib.run_sweep(b.model, planned, b.machine.usable_bytes, b.backend, stored, f["timeout"],
                                     f["steps"], on_event, local_usable_bytes=b.local_usable, force=f["force"])
            else:
                from ..measure.bench import preference as pref_lib

                rows = pref_lib.run_sweep(b.model, planned, b.machine.usable_bytes, b.backend, stored, f["timeout"],
                                          f["steps"], on_event)
            for row, fresh in rows:
                swept.rows.append(row)
                swept.resumed += not fresh
                if fresh and log is not None and not appended(log, row, swept, len(planned), f["out"], f["plot"]):
                    break
        except KeyboardInterrupt as e:
            swept.interrupted = getattr(e, "exit_code", 130)  # 128 + the signal's number
    return swept


def appended(log, row, swept: Swept, total: int, out: str, plot) -> bool:
    """The row appended to --out; False, with why in `swept.failed`, when it cannot be:
    the sweep stops, and what it measured is still shown."""
    try:
        log.append(row)
        swept.written += 1
        return True
    except OSError as e:
        kept = swept.written + swept.resumed  # rows the file holds, whole
        where = (f"none of them could be written to {out}" if not kept else
                 f"the one written before stays in {out} for --resume" if kept == 1 else
                 f"the {kept} written before stay in {out} for --resume")
        swept.failed = (f"--out {out}: cannot write ({e.strerror or e}), so the sweep stopped after {len(swept.rows)} of "
                        f"{total}; the rows above are every one measured, and {where}"
                        + (" (no plot drawn)" if plot else ""))
        return False


def plotted(b: Bench, swept: Swept, varying: list):
    """--plot drawn from the rows (unless the sweep failed); the path, or None where not drawn."""
    plot, out = b.flags["plot"], b.flags["out"]
    if not (plot and swept.rows and swept.failed is None):
        return plot
    from ..render import bench as render_bench

    try:
        title = f"{b.model.id} · {b.backend}" if b.sft else f"{b.model.id} · {b.mode} · {b.backend}"
        render_bench.plot_sweep(swept.rows, varying, b.machine.usable_bytes, plot, title=title)
    except OSError as e:
        swept.failed = f"--plot {plot}: cannot write ({e.strerror or e}); the rows above are every one measured" + (
            f", and they are in {out}" if out else "")
        return None
    return plot


def report(b: Bench, swept: Swept, varying: list, total: int, plot) -> None:
    """The sweep's rows, as JSON or as the table."""
    from ..render import bench as render_bench
    from ..render.text import console

    rows = swept.rows
    if not b.flags["json_"]:
        render_bench.render_sweep(rows, varying, b.machine.usable_bytes, swept.interrupted, total)
        if plot and rows:
            console.print(f"Plot written to {plot}")
        return
    print_json({
        "model": b.model.to_dict(),
        "machine": b.machine.to_dict(),
        "notes": b.notes,
        "backend": b.backend,
        **({} if b.sft else {"train_mode": b.mode}),
        "usable_bytes": b.machine.usable_bytes,
        "swept": {name: list(values) for name, values in b.sweeps.items() if name in varying},
        "total": total,
        "resumed": swept.resumed,
        "interrupted": bool(swept.interrupted),
        "out": b.flags["out"],
        "plot": plot if rows else None,
        "rows": [row.to_dict() for row in rows],
    })


# --- --train-mode dpo, cpo, orpo, grpo: mlx-lm-lora's runs -----------------------------


def checked_sweeps(ctx, mode: str, given: dict, maximize, out, resume, plot, force, estimate_only) -> tuple[dict, str | None]:
    """The lists to sweep ({setting: values}) and the setting --max searches (None: a
    sweep), once every combination of flags that would mean nothing is refused, and
    before anything is resolved or measured."""
    from ..measure import bench as lib

    sweeps = {name: lib.parse_sweep(name, text) for name, text in given.items() if text is not None}
    if given_flag(ctx, "fine_tune_type") and len(sweeps.get("method", ())) == 1 == len(sweeps["fine_tune_type"]):
        check_method(sweeps["method"][0], sweeps["fine_tune_type"][0])  # as probe: one of each must agree
    if len(sweeps.get("max_completion_length", ())) > 1 and not get_mode(mode).rollout:
        raise BadInput(f"--max-completion-length {given['max_completion_length']}: a list sweeps GRPO's completions, "
                       f"and --train-mode {mode} generates none")
    if force and estimate_only:
        raise BadInput("--force measures combinations predicted not to fit: it means nothing with --estimate-only")
    setting = maximize.replace("-", "_") if maximize else None
    if setting:
        flag = "--" + setting.replace("_", "-")
        if given_flag(ctx, setting):
            raise BadInput(f"--max {setting} searches {flag}: leave {flag} out")
        several = [f"--{n.replace('_', '-')} {given[n]}" for n, v in sweeps.items() if len(v) > 1]
        if several:
            raise BadInput(f"--max searches one setting; give the others one value each (got {', '.join(several)})")
        for option, value in (("--out", out), ("--resume", resume), ("--plot", plot), ("--force", force)):
            if value:
                raise BadInput(f"{option} is for sweeps, not for --max")
    if resume and not out:
        raise BadInput("--resume needs --out: the CSV of the sweep to resume")
    for option, path in (("--out", out), ("--plot", plot)):
        check_writable(option, path)  # before any measurement is spent
    return sweeps, setting


def preference_sweeps(ctx, mode: str, given: dict, maximize, pref: dict) -> dict:
    """The lists to sweep for an mlx-lm-lora run: the flags given (those left out take
    mlx-lm-lora's defaults, not mlx-lm's), and --max-completion-length's list."""
    if maximize:
        raise BadInput(f"--max is for sft runs: with --train-mode {mode}, sweep a list (--batch-size 1,2,4) "
                       "and read the largest that fits")
    refuse_sft_flags(mode, given["method"] is not None, given_flag(ctx, "bits"))
    sweeps = {name: given[name] for name in PREFERENCE_SWEPT if given_flag(ctx, name)}
    completion = pref.pop("max_completion_length")
    if completion is not None:
        sweeps["max_completion_length"] = completion
    return sweeps


def preference_notes(runs, machine, measuring: bool) -> list[str]:
    """What the rows rest on: the machine a measurement runs on, GRPO's assumed
    prompt, and what mlx-lm-lora does with the flags (each said once)."""
    from ..estimate.preference import DEFAULT_PROMPT
    from ..render.bench import hypothetical_note

    notes = [hypothetical_note(machine, by_slice=False)] if measuring and machine.hypothetical else []
    first = runs[0]
    if first.spec.rollout and first.prompt_length is None:
        notes.append(f"GRPO's prompts are assumed to be {DEFAULT_PROMPT} tokens: give --prompt-length")
    for run in runs:
        notes += [n for n in run.notes if n not in notes]
    return notes


def plan_preference(pref_lib, model, runs, machine, reserve, backend: str, measuring: bool, force: bool,
                    quiet: bool = False):
    """Each run's estimate and action; a run this machine cannot hold is refused by
    mlxfit.answer_preference's rule, as probe --measure refuses it. The runs' logits
    are first counted on miniatures (shipped for the catalog at mlx-lm-lora's defaults;
    another shape takes tens of seconds the first time, said before it starts)."""
    from .. import answer_preference
    from ..estimate import preference as est
    from ..measure.miniature import logits_buffers_many, uncounted
    from ..render.measurement import measure_progress

    shapes = pref_lib.miniature_shapes(model, runs)
    allowed = miniatures()
    if uncounted(shapes, miniatures=allowed):
        with measure_progress(quiet) as on_event:
            logits_buffers_many(shapes, on_event, miniatures=allowed)

    reference = answer_preference.reference_model(runs[0])  # one --reference-model-path for every run

    def refuse(run, estimate):
        answer_preference.refuse_what_would_not_fit_here(
            est, model, run, estimate, backend, machine, reserve, None, reference, run.prompt_length,
            then="so it is skipped, even with --force")

    return pref_lib.plan(model, runs, machine.usable_bytes, backend, measuring, force, reference, refuse,
                         miniatures=allowed)
