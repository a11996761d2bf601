"""The small commands' read-outs: `mlxfit fits` (what fits by model size), `mlxfit models`
(the catalog) and `mlxfit calibration` (the stored measurements)."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..estimate.plan import STAND_IN_RULE, FitsTable
from ..estimate.rule import METHOD_LABELS
from ..units import format_count, format_gb, format_size
from .memory import machine_fields, print_warnings
from .probe import settings_words
from .text import VERDICT_MARK, VERDICT_STYLE, console, print_fields, print_hanging, print_table, tokens


def render_fits(table_data: FitsTable) -> None:
    """One table, one basis per cell: a catalog model of each size by the detailed
    estimate at the given settings; the rule of thumb only where the catalog has none."""
    print_fields("Machine", machine_fields(table_data.machine))
    print_warnings(table_data.machine)
    refs = dict(table_data.references)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left",
                  title="A real model of each size, by the detailed estimate" if refs else "By the rule of thumb")
    table.add_column("size", justify="right")
    if refs:
        table.add_column("catalog model")
    for method in ("lora", "qlora", "full"):
        table.add_column(METHOD_LABELS[method], justify="right")
    for size, _ in table_data.rows:
        cells = []
        for method in ("lora", "qlora", "full"):
            c = table_data.cell(size, method)
            mark = VERDICT_MARK[c["verdict"]] + (" (rule)" if c["basis"] == "rule" and refs else "")
            cells.append(Text(f"{format_gb(c['bytes'], 0)} {mark}", style=VERDICT_STYLE[c["verdict"]]))
        name = [refs[size].model.id.split("/")[-1] if size in refs else "none: the rule"] if refs else []
        table.add_row(f"{size:g}B", *name, *cells)
    print_table(table)
    if refs:
        first = table_data.references[0][1]
        t = first.training
        layers = "all layers" if t.num_layers == -1 else f"the last {t.num_layers} layers"
        print_hanging(
            f"[dim]At batch {t.batch_size} × {tokens(t.max_seq_length)}, {layers}, rank {t.rank}"
            f"{', grad checkpoint' if t.grad_checkpoint else ''}, {t.optimizer} ({settings_words(t)}), "
            f"{first.backend} backend; each size stands for the catalog's {STAND_IN_RULE}; ✓ fits (the range's high end within the budget), ! tight (the budget inside "
            "the range), ✗ does not fit. Without --data mlx-lm pads each batch only to its longest example: give "
            "--max-seq-length your examples' length here, or probe a model with --data for a plan.[/]",
            indent=0,
        )
    print_hanging("[dim]The rule of thumb (per billion parameters LoRA 2 GB + 3, QLoRA 0.7 GB + 3, full 12 GB + 4) "
                  "assumes moderate lengths and small batches; --json has its figures beside these.[/]", indent=0)
    console.print("[dim]GB = 10^9 bytes.[/]")


def render_models(rows: list[dict]) -> None:
    """By family: id, size and architecture (active parameters of MoE models);
    the architecture goes on its own line where the terminal is too narrow."""
    id_width = max(len(r["id"]) for r in rows) + 2
    narrow = id_width + 9 > console.width  # too narrow for the ids in a column: id, then size and architecture
    last = None
    header = "family / id" if narrow else f"{'family / id':<{id_width}}  {'size':>7}  architecture"
    console.print(f"[bold]{header}[/]")
    for r in rows:
        if r["family"] != last:
            console.print(Text(r["family"], style="bold"))
            last = r["family"]
        arch = f"{r['model_type']}, {r['architecture']}"
        if r["active_params"] < r["params"]:
            arch += f", {format_count(r['active_params'])} active"
        if narrow:
            console.print(Text(f"  {r['id']}"), soft_wrap=True)
            print_hanging(Text(f"      {format_count(r['params'])} · {arch}", style="dim"), indent=8)
            continue
        line = f"  {r['id']:<{id_width - 2}}  {format_count(r['params']):>7}"
        if len(line) + 2 + len(arch) <= console.width:
            console.print(Text(f"{line}  {arch}"))
        else:
            console.print(Text(line))
            print_hanging(Text(f"      {arch}", style="dim"), indent=8)
    print_hanging("[dim]mlx-community/<name>-4bit (-8bit, -bf16) names resolve to the same architecture with that "
                  "storage.[/]", indent=0)


def render_calibration(directory, entries: list[dict]) -> None:
    """Each model as stored, in full on a line of its own (a path folds at the terminal's
    width rather than being cut), then its measurements in aligned columns."""
    console.print(f"[bold]Stored measurements[/] in {directory}: {len(entries)}")
    if not entries:
        console.print("[dim]Run `mlxfit probe --measure` to add one; estimates on this machine then use them.[/]")
        return
    header = ("backend", "run", "predicted", "measured", "mlx / mlx-lm")
    by_model: dict[str, list[tuple[str, ...]]] = {}
    for e in entries:
        t = e["training"]
        width = e.get("length") or t["max_seq_length"]  # the widest batch measured
        run = f"{t['fine_tune_type']}{' (q)' if t.get('quantize') else ''} b{t['batch_size']}×{width}"
        by_model.setdefault(e["model"], []).append((
            e["backend"], run, format_size(e["predicted_peak_bytes"]), format_size(e["measured"]["peak_with_load_bytes"]),
            f"{e['versions'].get('mlx')} / {e['versions'].get('mlx-lm')}",
        ))
    rows = [r for group in by_model.values() for r in group]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = (False, False, True, True, False)  # sizes align on their units

    def line(cells) -> str:
        return "  " + "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()

    console.print(Text(line(header), style="bold"))
    for model, group in by_model.items():
        console.print(Text(model, overflow="fold"))
        for cells in group:
            console.print(Text(line(cells)))
