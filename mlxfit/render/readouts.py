"""The small commands' read-outs: `mlxfit fits` (what fits by model size), `mlxfit models`
(the catalog) and `mlxfit calibration` (the stored measurements)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..estimate.plan import FitsTable, verdict
from ..estimate.rule import METHOD_LABELS
from ..units import format_count, format_gb, format_size
from .memory import machine_fields, print_warnings
from .probe import settings_words
from .text import VERDICT_STYLE, console, print_fields, print_hanging, tokens

VERDICT_MARK = {"fits": "✓", "tight": "!", "does not fit": "✗"}


def render_fits(table_data: FitsTable) -> None:
    print_fields("Machine", machine_fields(table_data.machine))
    print_warnings(table_data.machine)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="By the rule of thumb", title_justify="left")
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
    print_hanging("[dim]The rule of thumb: per billion parameters LoRA 2 GB + 3, QLoRA 0.7 GB + 3, full 12 GB + 4; "
                  "it assumes moderate lengths and small batches.[/]", indent=0)
    if not table_data.references:
        return
    usable = table_data.machine.usable_bytes
    first = table_data.references[0][1]
    detail = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="A real model of each size, by the detailed estimate",
                   title_justify="left")
    detail.add_column("size", justify="right")
    detail.add_column("catalog model")
    for method in ("lora", "qlora", "full"):
        detail.add_column(METHOD_LABELS[method], justify="right")
    for size, ref in table_data.references:
        cells = []
        for method in ("lora", "qlora", "full"):
            need = ref.estimates[method]
            v = verdict(need, usable)
            cells.append(Text(f"{format_gb(need, 0)} {VERDICT_MARK[v]}", style=VERDICT_STYLE[v]))
        detail.add_row(f"{size:g}B", ref.model.id.split("/")[-1], *cells)
    console.print(detail)
    t = first.training
    print_hanging(
        f"[dim]At batch {t.batch_size} × {tokens(t.max_seq_length)}, the last {t.num_layers} layers, rank {t.rank} "
        f"({settings_words(t)}), {first.backend} backend; ✓ fits, "
        "! tight, ✗ does not fit. Attention scores and logits grow with batch × length, which the rule leaves out: "
        "probe a model with your own --batch-size, --max-seq-length or --data for a plan.[/]",
        indent=0,
    )
    console.print("[dim]GB = 10^9 bytes.[/]")


def render_models(rows: list[dict]) -> None:
    """By family: id, size and architecture (active parameters of MoE models);
    the architecture goes on its own line where the terminal is too narrow."""
    id_width = max(len(r["id"]) for r in rows) + 2
    last = None
    console.print(f"[bold]{'family / id':<{id_width}}  {'size':>7}  architecture[/]")
    for r in rows:
        if r["family"] != last:
            console.print(Text(r["family"], style="bold"))
            last = r["family"]
        arch = f"{r['model_type']}, {r['architecture']}"
        if r["active_params"] < r["params"]:
            arch += f", {format_count(r['active_params'])} active"
        line = f"  {r['id']:<{id_width - 2}}  {format_count(r['params']):>7}"
        if len(line) + 2 + len(arch) <= console.width:
            console.print(Text(f"{line}  {arch}"))
        else:
            console.print(Text(line))
            console.print(Text(f"      {arch}", style="dim"))
    console.print("[dim]mlx-community/<name>-4bit (-8bit, -bf16) names resolve to the same architecture with that storage.[/]")


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
        width = e.get("length") or t["max_seq_length"]  # the widest batch measured
        run = f"{t['fine_tune_type']}{' (q)' if t.get('quantize') else ''} b{t['batch_size']}×{width}"
        table.add_row(
            e["model"], e["backend"], run,
            format_size(e["predicted_peak_bytes"]), format_size(e["measured"]["peak_with_load_bytes"]),
            f"{e['versions'].get('mlx')} / {e['versions'].get('mlx-lm')}",
        )
    console.print(table)
