"""The probe of a DPO, CPO, ORPO or GRPO run: its phases, the verdict, the plans."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..estimate.verdict import Verdict
from ..model.preference import EXTRA
from ..units import format_gb, format_size
from .inputs import storage_words
from .text import console, print_fields, print_hanging, print_table, verdict_markup, verdict_text
from .time import render_time



def run_words(run, estimate) -> list[str]:
    t = run.training
    words = [f"mlx_lm_lora.train --train-mode {run.spec.trainer_mode}", t.fine_tune_type + (f" on a {t.bits}-bit base" if t.quantize else ""),
             f"batch {t.batch_size}", f"layers {'all' if t.num_layers == -1 else t.num_layers}"]
    if run.spec.rollout:
        words += [f"group {run.group_size}", f"completions up to {run.max_completion_length}",
                  f"prompt {estimate.prompt_length}" + (" (assumed; --data or --prompt-length)" if estimate.prompt_assumed else ""),
                  f"beta {run.beta:g}"]
    else:
        words.append(f"{'pairs' if run.spec.pairs else 'rows'} of {estimate.length} tokens")
        if run.has_reference:  # beta scales the log ratio against the reference
            words.append(f"beta {run.beta:g}")
    if t.grad_checkpoint:
        words.append("grad checkpoint")
    if run.efficient_long_context:
        words.append("efficient long context")
    words.append(f"estimated for the {estimate.backend} backend")
    return words


def logits_words(estimate) -> str:
    """Where the logits term comes from: counted on a miniature, or the fitted count."""
    if estimate.logits_buffers is not None:
        return (f"Logits: {estimate.logits_buffers:.1f} float32 buffers of batch x length x vocabulary held at the loss, "
                "counted by running this mode's step on a miniature of the model (same depth and layers, tiny widths).")
    from rich.markup import escape

    from ..model.preference import installed

    how = ("no miniature was run (MLXFIT_MINIATURES=0)" if installed() else
           f"with mlx-lm-lora installed ({EXTRA}) they are counted on a miniature of the model, with a narrower range")
    return escape(f"Logits: the fitted count (the buffers held depend on MLX's evaluation order; {how}).")


def render(model, run, estimate, usable, plans, stats=None, measured=None, notes=(), verbose: bool = False,
           time=None) -> None:
    """By default the verdict first, then what fits (the plan, or the single changes
    that fit), then what was sized; `verbose` (-v): what was sized, each phase with its
    parts, the logits' count, the verdict and every change."""
    if not verbose:
        render_verdict(run, estimate, usable)
        render_brief_plans(plans)
        if measured is not None:
            render_measured(run, estimate, measured)
        render_time(time)
        render_sized(model, run, estimate, stats, notes)
        console.print("[dim]-v shows each phase's parts and every change · GB = 10^9 bytes.[/]")
        return
    render_sized(model, run, estimate, stats, notes)
    peak = estimate.peak
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("phase")
    table.add_column("holds", justify="right")
    table.add_column("of which")
    for p in estimate.phases:
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in p.parts.items() if v)
        table.add_row(Text(p.name + (" ◀ peak" if p is peak else ""), style="bold" if p is peak else ""),
                      format_size(p.bytes), Text(parts, style="dim"))
    print_table(table)
    if estimate.run.spec.counted_on_miniature:
        print_hanging(f"[dim]{logits_words(estimate)}[/]")
    render_verdict(run, estimate, usable)
    singles, combo = plans["singles"], plans["combination"]
    if singles:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="What each change would need", title_justify="left")
        table.add_column("change")
        table.add_column("peak", justify="right")
        table.add_column("verdict")
        table.add_column("costs", style="dim")
        for c in singles:
            w = c.verdict
            table.add_row(c.flags, format_size(c.bytes), verdict_text(w), c.cost)
        print_table(table)
    if combo:
        render_combination(combo)
    if measured is not None:
        render_measured(run, estimate, measured)
    render_time(time)


def render_sized(model, run, estimate, stats, notes) -> None:
    """What was sized: the model, the run, its notes, the reference model, the data."""
    print_fields("Model", [model.id, f"{model.params:,} parameters", storage_words(model)])
    print_fields("Run", run_words(run, estimate))
    for note in [*notes, *run.notes]:
        print_hanging(f"[yellow]Note[/]     {note}")
    if run.has_reference:
        ref = "the model at " + run.reference_model_path if run.reference_model_path else "a second full copy of the model"
        print_hanging(f"[dim]Reference: {ref}, frozen and unquantized (mlx_lm_lora/train.py load_reference_model).[/]")
    if stats is not None:
        what = "longest prompt" if run.spec.rollout else "widest chosen/rejected batch"
        print_fields("Data", [stats.file, f"{stats.rows} rows, {stats.batches} batches", f"{what} {stats.widest} tokens",
                              "read with mlx-lm-lora's dataset classes"])
        from .inputs import render_counted_by

        render_counted_by(stats.tokens_counted_by, None, stats.no_tokenizer_reason)


def render_verdict(run, estimate, usable) -> None:
    peak = estimate.peak
    v = estimate.verdict(usable)
    low, high = estimate.range_bytes
    spread = (f"the spread of {run.mode.upper()} runs against mlx-lm-lora's trainer on the CPU"
              + (", logits counted" if estimate.logits_buffers is not None else "")
              + ("" if estimate.backend == "cpu" else
                 f", widened by the {estimate.backend} SFT spread: no public {estimate.backend} run of this mode was found"))
    if run.spec.step_is_mlx_lm:
        spread = f"mlx-lm's SFT range on the {estimate.backend} backend: the step is mlx-lm's"
    print_hanging(f"[bold]Verdict[/]  {verdict_markup(v)}: the peak is the {peak.name.split(':')[0]}, "
                  f"{format_size(estimate.peak_bytes)} (range {format_size(low)}–{format_size(high)}: {spread}) "
                  f"against a budget of {format_gb(usable)}")
    if v is Verdict.TIGHT:
        print_hanging("[dim]The budget lies inside the range: --measure settles it with a few steps of mlx-lm-lora's own trainer.[/]")


def render_combination(combo) -> None:
    w = combo[-1].verdict
    flags = " ".join(c.flags for c in combo)
    print_hanging(f"[bold]Plan[/]     {verdict_markup(w)} together: {flags} ({format_size(combo[-1].bytes)})")


BRIEF_CHANGES = 3  # the single changes the first answer names, at most


def render_brief_plans(plans) -> None:
    """The plan when no change fits alone; else the single changes that fit (or, when
    none does, the tight ones), at most BRIEF_CHANGES, smallest peak first."""
    singles, combo = plans["singles"], plans["combination"]
    if combo:
        render_combination(combo)
        return
    for word in ("fits", "tight"):
        chosen = sorted((c for c in singles if c.verdict.value == word), key=lambda c: c.bytes)
        if chosen:
            more = len(singles) - min(len(chosen), BRIEF_CHANGES)
            console.print(f"[bold]What {word} alone[/]" + (f" (-v: {more} more change{'s' if more != 1 else ''}):" if more else ":"))
            for c in chosen[:BRIEF_CHANGES]:
                print_hanging(f"  [bold]{c.flags}[/] → {format_size(c.bytes)}, {verdict_markup(word)} · "
                              f"[dim]{c.cost}[/]", indent=4)
            return


def render_measured(run, estimate, m) -> None:
    err = (estimate.peak_bytes - m.peak_bytes) / m.peak_bytes * 100 if m.peak_bytes else 0.0
    words = [f"{format_size(m.peak_bytes)} over {m.steps} steps of mlx-lm-lora's {run.mode} trainer",
             f"estimate {err:+.1f}%"]
    if not m.compiled:
        words.append("compilation off (CPO's compiled step fails on this MLX)")
    if m.completion_lengths:
        words.append(f"longest completions {', '.join(str(int(x)) for x in m.completion_lengths)} tokens "
                     f"(all forced to --max-completion-length)")
    print_fields("Measured", words, indent=10)
