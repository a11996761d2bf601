"""The probe of a vision-language model (mlx-vlm): the verdict, the peak's parts (vision
tower, language model, logits, cached rows), the images and the widest batch in text and
image tokens; with -v every moment of the step and its parts."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..units import format_gb, format_size
from .text import console, print_fields, print_hanging, print_table, verdict_markup

RESIDENT = ("weights (language model)", "weights (vision tower and projector)", "weights (trainable)",
            "optimizer state", "framework", "gradients")


def groups(parts: dict) -> dict:
    """The peak's parts in the words of the answer: weights and optimizer, cached rows,
    vision tower, language model, logits."""
    out = {"weights and optimizer": 0, "cached rows (pixels)": 0, "vision tower": 0, "language model": 0, "logits": 0}
    for name, value in parts.items():
        if name in RESIDENT:
            out["weights and optimizer"] += value
        elif "pixels" in name:
            out["cached rows (pixels)"] += value
        elif name.startswith(("vision", "patch embedding")):
            out["vision tower"] += value
        elif "logits" in name:
            out["logits"] += value
        else:
            out["language model"] += value
    return out


def render(answer, verbose: bool = False) -> None:
    """By default: the verdict, the peak's parts in one line, what was sized; -v adds
    each moment of the step with its parts."""
    a, e, run = answer, answer.estimate, answer.run
    render_sized(a.model, run, a.notes)
    if verbose:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for column, justify in (("moment of the step", "left"), ("holds", "right"), ("of which", "left")):
            table.add_column(column, justify=justify)
        for p in e.phases:
            peak = p is e.peak
            parts = ", ".join(f"{k} {format_size(v)}" for k, v in p.parts.items() if v)
            table.add_row(Text(p.name + (" ◀ peak" if peak else ""), style="bold" if peak else ""), format_size(p.bytes),
                          Text(parts, style="dim"))
        print_table(table)
    print_fields("Moments", [f"{p.name} {format_size(p.bytes)}" + (" ◀ peak" if p is e.peak else "") for p in e.phases])
    print_fields("Peak", [f"{k} {format_size(v)}" for k, v in groups(e.peak.parts).items() if v])
    v = e.verdict(a.usable_bytes)
    low, high = e.range_bytes
    print_hanging(f"[bold]Verdict[/]  {verdict_markup(v)}: the peak is the {e.peak.name}, {format_size(e.peak_bytes)} "
                  f"(range {format_size(low)}–{format_size(high)}: the spread of mlx-vlm runs measured on the CPU) "
                  f"against a budget of {format_gb(a.usable_bytes)}")
    if verbose or not v.fits:
        render_plans(a.plans)
    if a.measured is not None:
        render_measured(a.measured)
    if not verbose:
        console.print("[dim]-v shows each moment of the step and its parts · GB = 10^9 bytes.[/]")


def render_sized(model, run, notes) -> None:
    i, t = model.info, run.training
    print_fields("Model", [model.id, f"{i.params:,} parameters", f"language model {i.language_params:,}",
                           f"vision tower and projector {i.vision_params + i.projector_params:,}",
                           i.dtype])
    words = [f"{run.spec.command} {t.train_type}", f"batch {t.batch_size}", f"max length {t.max_seq_length}"]
    words += ["grad checkpoint"] if t.grad_checkpoint else []
    words += ["vision tower trained (--train-vision)"] if t.train_vision else []
    words += [f"cache {'every row' if t.cache_size is None else f'{t.cache_size} rows'} (--cache-size)"]
    print_fields("Run", words)
    if run.data is None:
        size = "x".join(map(str, run.image_size)) + (" (the family's default; --image-size)" if run.size_is_default else "")
        print_fields("Images", [f"{run.images} per example of {size}",
                                f"{run.image_tokens} image tokens per example (--images-per-example)"])
    else:
        d = run.data
        print_fields("Data", [d.path, f"{len(d.examples)} rows, {d.images} images",
                              f"text counted by {d.text_counted_by}"])
    print_fields("Widest", [f"{run.tokens} tokens per example: {run.text_tokens} text + {run.image_tokens} image",
                            f"pixel values {'x'.join(map(str, run.pixel_shape))}"])
    for note in notes:
        print_hanging(f"[yellow]Note[/]     {note}")


def render_measured(m) -> None:
    source = "stand-in images of --image-size" if m.stand_in else "--data"
    how = [f"{format_size(m.peak_bytes)} over {m.steps} steps of mlx_vlm.train ({m.rows} rows of {source})"]
    if m.method == "slice":
        how = [f"{format_size(m.peak_bytes)} extrapolated from {m.steps} steps of mlx_vlm.train on {m.slice['how']} "
               f"({m.rows} rows of {source}; the largest slice's peak {format_size(m.slice['peak_bytes'])})"]
    print_fields("Measured", [*how, f"predicted for that run {format_size(m.predicted_bytes)}",
                              f"estimate {m.error * 100:+.1f}%"], indent=10)


def render_plans(plans: dict) -> None:
    """Each change re-estimated alone, and the changes together where none fits alone."""
    for title, changes in (("Changes", plans["singles"]), ("Plan", plans["combination"])):
        if changes:
            print_hanging(f"[bold]{title}[/]  each re-estimated (memory only: no step time for mlx-vlm's trainer yet)"
                          if title == "Changes" else f"[bold]{title}[/]     together, in this order")
        for c in changes:
            print_hanging(f"  {c.flags}: {format_size(c.bytes)}, {verdict_markup(c.verdict)} · [dim]{c.cost}[/]")
