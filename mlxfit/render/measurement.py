"""A measurement in words: the progress of the measuring process on stderr, and the
measured figures set against the estimate."""

from __future__ import annotations

from contextlib import contextmanager

from rich import box
from rich.table import Table

from ..units import format_gb, format_size
from .text import console, err_console, print_hanging, print_table, verdict_markup


@contextmanager
def measure_progress(quiet: bool = False):
    """A spinner on stderr with the stage, the step and the time taken."""
    if quiet:
        yield lambda event: None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # only while measuring

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
            elif kind == "slice":
                frozen = event["blocks"] - event["trained"]
                progress.console.print(f"  slice {event['index']} of {event['of']}: {event['trained']} trained block"
                                       f"{'s' if event['trained'] != 1 else ''}" + (f" + {frozen} frozen" if frozen else ""))
            elif kind == "built":
                progress.console.print(f"  model ready in {event['seconds']:.1f} s, {format_size(event['peak_bytes'])} held")
            elif kind == "step":
                progress.console.print(
                    f"  step {event['step']}: peak {format_size(event['peak_bytes'])} {step_time(event['seconds'])}"
                )
                progress.update(task, description=f"training steps (step {event['step'] + 1})")
            elif kind in ("done", "error"):
                progress.update(task, description="done" if kind == "done" else "failed")

        yield on_event


def step_time(seconds: float) -> str:
    """A step's time, to a precision it can be read at: "in 0.47 s", "in 12.3 s", and
    "in under 0.01 s" rather than "in 0.00 s"."""
    if seconds < 0.01:
        return "in under 0.01 s"
    return f"in {seconds:.2f} s" if seconds < 10 else f"in {seconds:.1f} s"


def render_comparison(comparison, verbose: bool = True) -> None:
    """The measured figures against the estimate: in a few lines by default (the
    table of every figure with -v)."""
    m = comparison.measurement
    data = comparison.to_dict()
    judged = data["measured_verdict"]
    if not verbose:
        how = f"by slice ({m.slice['how']})" if m.method == "slice" else f"{m.steps} steps"
        print_hanging(
            f"[bold]Measured[/] on the {m.backend} backend, {how} in {m.seconds:.1f} s: "
            f"{format_size(m.peak_with_load_bytes)} peak with load{' (extrapolated)' if m.method == 'slice' else ''}, "
            f"predicted {format_size(comparison.predicted_bytes)} (error {comparison.error_pct:+.1f}%); "
            f"measured verdict {verdict_markup(judged['verdict'])} against the {format_size(comparison.usable_bytes)} budget",
        )
        if comparison.note:
            print_hanging(f"[yellow]Note[/]     the measurement was {comparison.note}")
        if comparison.cache_breaks_budget:
            print_hanging("[yellow]The allocator cache is what breaks the budget:[/] cap it with "
                          "mx.set_cache_limit(...) or mlx_lm.lora's --clear-cache-threshold.")
        return
    if m.method == "slice":
        print_hanging(f"[bold]Measured[/] by slice on the {m.backend} backend: {m.slice['how']}, "
                      f"{m.seconds:.1f} s in all; the whole run's figures are extrapolated from the slices' peaks "
                      f"({', '.join(format_size(p) for p in m.slice['peaks_bytes'])})")
    else:
        console.print(f"[bold]Measured[/] on the {m.backend} backend, {m.steps} steps in {m.seconds:.1f} s (model built in {m.build_seconds:.1f} s)")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("figure")
    table.add_column("bytes", justify="right")
    table.add_column("what it is")
    if m.method == "slice":
        table.add_row("peak (steps)", format_size(m.peak_bytes), "extrapolated from the slices' mx.get_peak_memory()")
        table.add_row("peak with load", format_size(m.peak_with_load_bytes), "extrapolated: what mlx-lm's trainer would report")
        table.add_row("slices' own peak", format_size(m.slice["peak_bytes"]), "the largest slice's MLX peak: what measuring took")
        table.add_row("allocator cache", format_size(m.cache_bytes), "the slices' largest mx.get_cache_memory()")
        table.add_row("process peak", format_size(m.process_peak_bytes), "resident high-water mark of the slices' process")
    else:
        table.add_row("peak (steps)", format_size(m.peak_bytes), "mx.get_peak_memory(), reset after the model was built")
        table.add_row("peak with load", format_size(m.peak_with_load_bytes), "the figure mlx-lm's trainer reports")
        table.add_row("allocator cache", format_size(m.cache_bytes), "mx.get_cache_memory(): freed buffers MLX keeps")
        table.add_row("process peak", format_size(m.process_peak_bytes), "resident high-water mark of the process")
    table.add_row("predicted", format_size(comparison.predicted_bytes), f"error {comparison.error_pct:+.1f}% against peak with load")
    print_table(table)
    print_hanging(
        f"Measured verdict: {verdict_markup(judged['verdict'])} — {format_size(judged['bytes'])} peak with load "
        f"against a {format_gb(comparison.usable_bytes)} budget, on the estimate's basis: MLX's own memory, "
        f"without the process's resident baseline (the process peak above)",
        indent=2,
    )
    if comparison.note:
        print_hanging(f"[yellow]Note[/]     the measurement was {comparison.note}")
    if comparison.cache_breaks_budget:
        console.print(
            "[yellow]The allocator cache is what breaks the budget:[/] cap it with "
            "mx.set_cache_limit(...) or mlx_lm.lora's --clear-cache-threshold."
        )


def render_expectation(expectation) -> None:
    from ..estimate.duration import span, words

    print_hanging(f"[bold]Expect[/]   {span(expectation)}: {words(expectation)}, plus building the model")


def render_slices(plan, slices, need: int, usable: int, whole: int | None) -> None:
    """Said before a slice is measured: what is measured, and why a slice when the whole would not fit here."""
    why = ""
    if plan.machine.hypothetical and whole is not None and whole > usable:
        why = (f"; the whole run (about {format_gb(whole)}) would not fit this machine's {format_gb(usable)} budget, "
               "and a measurement runs here")
    print_hanging(
        f"[bold]Slice[/]    measuring {slices.describe()}: {len(slices.slices)} short runs in one process, "
        f"each about {format_gb(need)} at most, extrapolated to the whole model{why}",
    )

