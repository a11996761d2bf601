"""All terminal drawing, with one shared console. Compute modules never print."""

from __future__ import annotations

import json
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .machine import Machine
from .plan import FitsTable, Plan
from .rule import METHOD_LABELS
from .units import format_count, format_gb, format_gb_range, format_size

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

VERDICT_STYLE = {"fits": "green", "tight": "yellow", "does not fit": "bold red"}
SOURCE_LABEL = {
    "local": "local folder",
    "catalog": "built-in catalog",
    "hub": "Hugging Face config.json",
    "size": "bare size (no architecture)",
}
BAR_WIDTH = 12


def print_json(data: dict) -> None:
    console.file.write(json.dumps(data, indent=2) + "\n")


def bar(need: int, usable: int, width: int = BAR_WIDTH) -> Text:
    """A bar where `width` cells are the budget; past it the overflow shows in red."""
    filled = round(width * need / usable) if usable else width
    text = Text()
    if filled <= width:
        style = "green" if need <= 0.9 * usable else "yellow"
        text.append("█" * filled, style=style)
        text.append("·" * (width - filled), style="dim")
        text.append("│")
    else:
        text.append("█" * width, style="red")
        text.append("│")
        text.append(f"▶{need / usable:.1f}×", style="bold red")
    return text


def machine_line(machine: Machine) -> str:
    kind = "unified memory" if machine.unified else "GPU memory (system RAM does not count)"
    where = "hypothetical" if machine.hypothetical else machine.backend
    line = (
        f"{format_gb(machine.total_bytes)} {kind} ({where})"
        f" · reserve {format_gb(machine.reserve_bytes)}"
        f" · budget {format_gb(machine.usable_bytes)}"
    )
    if not machine.hypothetical:
        line += f" · in use now {format_gb(machine.used_bytes)}"
    return line


def print_warnings(machine: Machine) -> None:
    for warning in machine.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def render_memory(machine: Machine) -> None:
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("backend", machine.backend + (f" ({machine.device_name})" if machine.device_name else ""))
    table.add_row("memory", "unified (shared by CPU and GPU)" if machine.unified else "dedicated GPU memory")
    table.add_row("total", format_gb(machine.total_bytes))
    if not machine.hypothetical:
        table.add_row("in use now", format_gb(machine.used_bytes))
        table.add_row("available now", format_gb(machine.available_bytes))
    table.add_row("reserve (OS and apps)", format_gb(machine.reserve_bytes))
    table.add_row("usable budget", Text(format_gb(machine.usable_bytes), style="bold"))
    if machine.recommended_working_set_bytes:
        table.add_row("Metal recommended working set", format_gb(machine.recommended_working_set_bytes))
    console.print(table)
    print_warnings(machine)
    console.print("[dim]GB = 10^9 bytes[/]")


PART_STYLES = {
    "weights (frozen)": "grey62",
    "weights (trainable)": "green",
    "gradients": "yellow",
    "optimizer state": "orange3",
    "update temporaries": "dark_orange",
    "activations": "cyan",
    "attention scores": "magenta",
    "logits and gradient": "blue",
    "adapter outputs": "bright_cyan",
    "dora temporaries": "red",
    "all-reduce buffers": "purple",
    "framework": "white",
    "calibration": "bright_black",
}
STACK_WIDTH = 40
PHASE_WORDS = {
    "loss": "the backward pass through the loss",
    "block": "the backward pass through the last trained block",
    "update": "the optimizer update",
}


def stacked_bar(parts: dict, scale: int, usable: int, width: int = STACK_WIDTH) -> Text:
    """One bar per method, one colour per part; │ marks the budget."""
    text = Text()
    cells: list[str] = []
    used = 0.0
    for name, n in parts.items():
        used += width * n / scale
        count = round(used) - len(cells)
        cells += [name] * max(count, 0)
    budget_at = min(round(width * usable / scale), width)
    for i in range(width + 1):
        if i == budget_at:
            text.append("│", style="bold")
        if i < len(cells):
            text.append("█", style=PART_STYLES.get(cells[i], "white"))
        elif i < width:
            text.append("·", style="dim")
    return text


def render_plan(plan: Plan) -> None:
    model, training = plan.model, plan.training
    console.print(f"[bold]Machine[/]  {machine_line(plan.machine)}")
    model_bits = f"{model.bits}-bit quantized" if model.quantized else model.dtype
    console.print(
        f"[bold]Model[/]    {model.id} · {model.model_type or 'unknown architecture'}"
        f" · {format_count(model.params)} parameters ({model.params:,})"
        f" · {model_bits} · from {SOURCE_LABEL[model.source]}"
    )
    layers = "all" if training.num_layers == -1 else str(training.num_layers)
    if plan.calibration is not None:
        console.print(f"[bold]Calibration[/] {plan.calibration.describe()}: {format_size(plan.calibration.offset_bytes)} added")
    console.print(
        f"[bold]Run[/]      {training.fine_tune_type} · {layers} layers · batch {training.batch_size}"
        f" × {training.max_seq_length} tokens · rank {training.rank} · {training.optimizer}"
        + (" · grad checkpoint" if training.grad_checkpoint else "")
        + f" · estimated for the {plan.backend} backend"
    )
    print_warnings(plan.machine)

    detailed = any(e.detailed for e in plan.estimates)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("method")
    table.add_column("estimate" if detailed else "rule estimate", justify="right")
    if detailed:
        table.add_column("rule", justify="right", style="dim")
    table.add_column("budget", justify="right")
    table.add_column("headroom", justify="right")
    table.add_column("verdict", no_wrap=True)
    if not detailed:  # with a breakdown, the stacked bars below show this
        table.add_column("vs budget", no_wrap=True)
    for e in plan.estimates:
        label = METHOD_LABELS[e.method] + (" ◀" if e.selected else "")
        row = [Text(label, style="bold" if e.selected else ""), format_gb_range(e.predicted_bytes, *e.predicted_range_bytes)]
        if detailed:
            row.append(format_gb(e.rule_bytes))
        row += [format_gb(e.usable_bytes), format_gb(e.headroom_bytes), Text(e.verdict, style=VERDICT_STYLE[e.verdict])]
        if not detailed:
            row.append(bar(e.predicted_bytes, e.usable_bytes))
        table.add_row(*row)
    console.print(table)
    if detailed:
        console.print("[dim]◀ your run. Estimate: mlxfit's detailed model of mlx-lm's peak, with its range on this backend's "
                      "evidence (fits: the high end within the budget; tight: the budget inside the range); rule: the "
                      "source's rule of thumb.[/]")
        render_breakdowns(plan)
    else:
        console.print("[dim]◀ your run. No architecture for a bare size, so only the source's rule of thumb (SPEC §2): LoRA 2 GB/B + 3, QLoRA 0.7 GB/B + 3, full 12 GB/B + 4.[/]")
    render_remedies(plan)
    console.print("[dim]GB = 10^9 bytes.[/]")


def render_breakdowns(plan: Plan) -> None:
    scale = max([plan.machine.usable_bytes] + [e.predicted_bytes for e in plan.estimates])
    for e in plan.estimates:
        line = Text(f"  {METHOD_LABELS[e.method]:<6}")
        line.append_text(stacked_bar(e.detailed.parts, scale, plan.machine.usable_bytes))
        line.append(f" {format_gb(e.predicted_bytes)}")
        console.print(line)
    shown = [name for name in PART_STYLES if any(e.detailed.parts.get(name) for e in plan.estimates)]
    legend = Text("  ")
    for name in shown:
        legend.append("█ ", style=PART_STYLES[name])
        legend.append(name + "  ")
    console.print(legend)
    selected = plan.selected.detailed
    parts = ", ".join(f"{name} {format_size(n)}" for name, n in selected.parts.items() if n)
    phase = PHASE_WORDS.get(selected.features.get("phase"), "the backward pass")
    console.print(f"[dim]  your run peaks during {phase}: {parts}[/]")


def render_remedies(plan: Plan) -> None:
    from .plan import cheapest_fitting

    if not plan.remedies:
        return
    console.print(f"[bold]{METHOD_LABELS[plan.training.method]} does not fit. What to change, in this order:[/]")
    best = cheapest_fitting(plan)
    for i, r in enumerate(plan.remedies, 1):
        if r.new_bytes is None:
            result = ""
        else:
            word = "fits" if r.fits else "still does not fit"
            result = f" → {format_gb(r.new_bytes)}, [{VERDICT_STYLE['fits' if r.fits else 'does not fit']}]{word}[/]"
        console.print(f"  {i}. [bold]{r.change}[/]{result}  [dim]{r.why}[/]")
    if best is not None:
        console.print(f"[bold]Cheapest single change that fits:[/] {best.change} → {format_gb(best.new_bytes)}")


def render_fits(table_data: FitsTable) -> None:
    console.print(f"[bold]Machine[/]  {machine_line(table_data.machine)}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("model size", justify="right")
    for method in ("lora", "qlora", "full"):
        table.add_column(METHOD_LABELS[method], justify="right")
    for size, estimates in table_data.rows:
        cells = [
            Text.assemble(f"{format_gb(e.rule_bytes, 0)} ", (e.verdict, VERDICT_STYLE[e.verdict]))
            for e in estimates
        ]
        table.add_row(f"{size:g}B", *cells)
    console.print(table)
    console.print("[dim]Rule of thumb (SPEC §2). GB = 10^9 bytes.[/]")


def render_models(rows: list[tuple[str, str, int]]) -> None:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id")
    table.add_column("architecture")
    table.add_column("parameters", justify="right")
    for model_id, model_type, params in rows:
        table.add_row(model_id, model_type, format_count(params))
    console.print(table)


@contextmanager
def measure_progress(quiet: bool = False):
    """A spinner on stderr with the stage, the step and the time taken."""
    if quiet:
        yield lambda event: None
        return
    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=False,
    )
    with progress:
        task = progress.add_task("starting the measuring process", total=None)

        def on_event(event: dict) -> None:
            kind = event["event"]
            if kind == "stage":
                progress.update(task, description=event["stage"])
            elif kind == "built":
                progress.console.print(f"  model ready in {event['seconds']:.1f} s, {format_size(event['peak_bytes'])} held")
            elif kind == "step":
                progress.console.print(
                    f"  step {event['step']}: peak {format_size(event['peak_bytes'])} in {event['seconds']:.2f} s"
                )
                progress.update(task, description=f"training steps (step {event['step'] + 1})")
            elif kind in ("done", "error"):
                progress.update(task, description="done" if kind == "done" else "failed")

        yield on_event


def render_comparison(comparison) -> None:
    m = comparison.measurement
    data = comparison.to_dict()
    judged = data["measured_verdict"]
    console.print(f"[bold]Measured[/] on the {m.backend} backend, {m.steps} steps in {m.seconds:.1f} s (model built in {m.build_seconds:.1f} s)")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("figure")
    table.add_column("bytes", justify="right")
    table.add_column("what it is")
    table.add_row("peak (steps)", format_size(m.peak_bytes), "mx.get_peak_memory(), reset after the model was built")
    table.add_row("peak with load", format_size(m.peak_with_load_bytes), "the figure mlx-lm's trainer reports")
    table.add_row("allocator cache", format_size(m.cache_bytes), "mx.get_cache_memory(): freed buffers MLX keeps")
    table.add_row("process peak", format_size(m.process_peak_bytes), "resident high-water mark of the process")
    table.add_row("predicted", format_size(comparison.predicted_bytes), f"error {comparison.error_pct:+.1f}% against peak with load")
    console.print(table)
    style = VERDICT_STYLE[judged["verdict"]]
    console.print(
        f"Measured verdict: [{style}]{judged['verdict']}[/] — {format_size(judged['bytes'])} occupied "
        f"against a {format_gb(comparison.usable_bytes)} budget"
    )
    if comparison.cache_breaks_budget:
        console.print(
            "[yellow]The allocator cache is what breaks the budget:[/] cap it with "
            "mx.set_cache_limit(...) or mlx_lm.lora's --clear-cache-threshold."
        )


def render_calibration(directory, entries: list[dict]) -> None:
    console.print(f"[bold]Stored measurements[/] in {directory}: {len(entries)}")
    if not entries:
        console.print("[dim]Run `mlxfit probe --measure` to add one; estimates on this machine then use them.[/]")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("model", "backend", "run", "predicted", "measured", "mlx / mlx-lm"):
        table.add_column(name)
    for e in entries:
        t = e["training"]
        run = f"{t['fine_tune_type']}{' (q)' if t.get('quantize') else ''} b{t['batch_size']}×{t['max_seq_length']}"
        table.add_row(
            e["model"], e["backend"], run,
            format_size(e["predicted_peak_bytes"]), format_size(e["measured"]["peak_with_load_bytes"]),
            f"{e['versions'].get('mlx')} / {e['versions'].get('mlx-lm')}",
        )
    console.print(table)


def render_hosts(checks: list[dict]) -> None:
    console.print(f"[bold]Per node[/] ({len(checks)} hosts under mlx.launch, each with the whole model and its share of the batch)")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("host", "left"), ("memory", "right"), ("budget", "right"), ("per-node need", "right"), ("verdict", "left")):
        table.add_column(name, justify=justify)
    for c in checks:
        table.add_row(
            c["host"], format_gb(c["total_bytes"]), format_gb(c["usable_bytes"]),
            format_gb(c["predicted_peak_bytes"]), Text(c["verdict"], style=VERDICT_STYLE[c["verdict"]]),
        )
    console.print(table)


@contextmanager
def data_progress(quiet: bool = False):
    """A bar over the bytes of the training file while it is tokenized."""
    if quiet:
        yield None
        return
    progress = Progress(
        TextColumn("tokenizing"), BarColumn(), DownloadColumn(binary_units=False), TimeElapsedColumn(),
        console=err_console, transient=True,
    )
    with progress:
        task = progress.add_task("tokenizing", total=None)

        def on_progress(lines: int, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield on_progress


def render_config_notes(resolved) -> None:
    if resolved.config_file:
        console.print(f"[bold]Config[/]   {resolved.config_file} (flags override it, as in mlx_lm.lora)")
    for key in resolved.unknown_keys:
        console.print(f"[yellow]warning:[/] {resolved.config_file}: unknown key {key!r} (mlx_lm.lora does not read it)")
    for key in resolved.ignored_keys:
        console.print(f"[yellow]warning:[/] {resolved.config_file}: mlx_lm.lora ignores {key!r} in a config file (its flag default wins)")


def render_data(stats) -> None:
    approx = " (approximate: no tokenizer)" if stats.approximate else ""
    console.print(
        f"[bold]Data[/]     {stats.file} · {stats.format} · {stats.examples:,} examples · tokens p50 {stats.p50}"
        f" · p90 {stats.p90} · p99 {stats.p99} · max {stats.max} · widest batch {stats.worst_batch_tokens}{approx}"
    )
    console.print(f"[dim]         tokenizer: {stats.tokenizer_source}[/]")
    if stats.skipped_lines:
        lines = ", ".join(str(n) for n, _ in stats.bad_lines)
        console.print(f"[yellow]warning:[/] skipped {stats.skipped_lines} malformed lines (first: {lines})")


def render_advice(notes: list[str]) -> None:
    for note in notes:
        console.print(f"[yellow]advice:[/] {note}")
