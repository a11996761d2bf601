"""What probe was given, said before its plan: the config file's notes, warnings on the
settings, and the training data's token counts with the bar shown while it is tokenized."""

from __future__ import annotations

from contextlib import contextmanager

from .text import console, err_console, print_fields, print_hanging


@contextmanager
def data_progress(quiet: bool = False):
    """A bar over the bytes of the training file while it is tokenized."""
    if quiet:
        yield None
        return
    # Imported here: rich.progress costs more to import than a plan takes, and only --data shows a bar.
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("tokenizing"), BarColumn(), DownloadColumn(binary_units=False), TimeElapsedColumn(),
        console=err_console, transient=True,
    )
    with progress:
        task = progress.add_task("tokenizing", total=None)

        def on_progress(lines: int, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield on_progress


# Where the model's dtype and bits came from (mlxfit/model/resolve.py SOURCES), as said on the Model line.
STORAGE_SOURCE_WORDS = {
    "weight files": "from the weight files",
    "config": "assumed from config.json",
    "unstated": "assumed: the config states no dtype",
    "name": "assumed from the name",
    "assumed": "assumed",
}


def storage_words(model) -> str:
    """The model's storage and where it came from: "float32 (from the weight files)",
    "4/8-bit quantized (from the weight files)", "bfloat16 (assumed: the config states no dtype)"."""
    if model.quantized:
        bits = "/".join(str(b) for b in model.bits_mix) if model.bits_mix else str(model.bits)
        return f"{bits}-bit quantized ({STORAGE_SOURCE_WORDS[model.bits_source or 'assumed']})"
    return f"{model.dtype} ({STORAGE_SOURCE_WORDS[model.dtype_source]})"


def render_config_notes(resolved) -> None:
    if resolved.config_file:
        console.print(f"[bold]Config[/]   {resolved.config_file} (flags override it, as in mlx_lm.lora)")
    for key in resolved.unknown_keys:
        console.print(f"[yellow]warning:[/] {resolved.config_file}: unknown key {key!r} (mlx_lm.lora does not read it)")
    for key in resolved.ignored_keys:
        console.print(f"[yellow]warning:[/] {resolved.config_file}: mlx_lm.lora ignores {key!r} in a config file (its flag default wins)")


def render_counted_by(counted_by: str, source: str | None, reason: str | None) -> None:
    """How --data's tokens were counted: by the model's tokenizer (from `source`), or by
    characters, said as a warning with the reason there is no tokenizer."""
    from rich.markup import escape

    if reason is None:
        console.print(f"[dim]         tokens counted by the {counted_by}" + (f" ({source})" if source else "") + "[/]")
    else:
        print_hanging(f"[yellow]warning:[/] tokens counted by {counted_by}: {escape(reason)}", indent=2)


def render_data(stats) -> None:
    approx = " (approximate: no tokenizer)" if stats.approximate else ""
    print_fields("Data", [
        str(stats.file), stats.format, f"{stats.examples:,} examples",
        f"tokens p50 {stats.p50} · p90 {stats.p90} · p99 {stats.p99} · max {stats.max}",
        f"widest batch {stats.worst_batch_tokens}{approx}",
    ])
    render_counted_by(stats.tokens_counted_by, stats.tokenizer_source,
                      (stats.no_tokenizer_reason or "no tokenizer") if stats.approximate else None)
    if stats.skipped_lines:
        lines = ", ".join(str(n) for n, _ in stats.bad_lines)
        word = "line" if stats.skipped_lines == 1 else "lines"
        console.print(f"[yellow]warning:[/] skipped {stats.skipped_lines} malformed {word} (first: {lines})")


def render_validation(v) -> None:
    """The validation pass beside the training step (mlxfit/estimate/validation.py)."""
    from ..units import format_gb

    which = f"all {v.valid_batches}" if v.certain else f"{v.batches} random of {v.valid_batches}"
    print_fields("Validate", [
        f"{which} valid batches, widest {v.width}",
        f"about {format_gb(v.peak_bytes)} (forward only)",
        f"the {v.peaks} peaks" + ("" if v.certain or v.peaks == "training step" else " if its widest batch is drawn"),
    ])


def render_input_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        print_hanging(f"[yellow]warning:[/] {warning}", indent=2)
