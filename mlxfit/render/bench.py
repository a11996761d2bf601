"""Drawing for `mlxfit bench`: progress, the results table, the --max answer and
the --plot figure. Uses the one shared console of mlxfit/render/text.py."""

from __future__ import annotations

from contextlib import contextmanager

from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..errors import MlxfitError
from ..estimate.sizing import judged
from ..estimate.verdict import Verdict, judge, measured_range
from ..measure.bench import ESTIMATED, FAILED, MEASURED, SKIPPED, UNKNOWN, MaxResult, Row
from ..units import GB, format_count, format_size
from .measurement import step_time
from .memory import machine_line, print_warnings
from .text import console, err_console, verdict_text

PLOT_INSTALL = "pip install 'mlxfit[plot]'"
SETTING_WORDS = {"batch_size": "batch size", "max_seq_length": "max sequence length"}
# Column title and cell text of each sweepable setting.
SETTING_COLUMNS = {
    "method": ("method", lambda t: t.method),
    "fine_tune_type": ("type", lambda t: t.fine_tune_type),
    "num_layers": ("layers", lambda t: "all" if t.num_layers == -1 else str(t.num_layers)),
    "batch_size": ("batch", lambda t: str(t.batch_size)),
    "max_seq_length": ("length", lambda t: str(t.max_seq_length)),
    "rank": ("rank", lambda t: str(t.rank)),
    "grad_checkpoint": ("checkpoint", lambda t: "on" if t.grad_checkpoint else "off"),
}
# The same for what an mlx-lm-lora run sweeps beyond its TrainingConfig (bench --train-mode grpo).
RUN_COLUMNS = {"max_completion_length": ("completion", lambda run: str(run.max_completion_length))}
COLUMN_ORDER = (*SETTING_COLUMNS, *RUN_COLUMNS)


def settings_of(x):
    """What a row or an event shows its settings from: a TrainingConfig, or an
    mlx-lm-lora run (PreferenceRun: its training and its own knobs)."""
    run = getattr(x, "run", None)
    if run is not None:  # a PreferenceRow
        return run
    return getattr(x, "training", x) if isinstance(x, Row) else x


def cell(name: str, settings) -> str:
    """One setting in words, from a TrainingConfig or a PreferenceRun."""
    if name in RUN_COLUMNS:
        return RUN_COLUMNS[name][1](settings)
    return SETTING_COLUMNS[name][1](getattr(settings, "training", settings))


def is_preference(row) -> bool:
    return getattr(row, "run", None) is not None


UNITS_NOTE = "MB = 10^6 bytes, GB = 10^9 bytes."
UNKNOWN_STYLE = "bold yellow"


def run_word(fits: bool | None) -> Text:
    """A measured run's result: fits, does not fit, or unknown (it timed out)."""
    if fits is None:
        return Text("unknown", style=UNKNOWN_STYLE)
    return verdict_text(Verdict.FITS if fits else Verdict.DOES_NOT_FIT)


def step_line(run: str, event: dict) -> str:
    """One plain line per step, for a log: stderr is not a terminal, so no live bar shows."""
    timed = "" if event.get("seconds") is None else " " + step_time(event["seconds"])
    return f"  {run} · step {event['step']}: peak {format_size(event['peak_bytes'])}{timed}"


def size(n_bytes: int | None) -> str:
    """A size with its unit (MB below 1 GB), blank when there is none."""
    return "" if n_bytes is None else format_size(n_bytes)


def unit_for(sizes) -> tuple[str, int, int]:
    """One unit for a whole table or axis: (name, bytes, decimals); MB when all are below 1 GB."""
    if max((abs(n) for n in sizes if n), default=0) < GB:
        return "MB", 10**6, 1
    return "GB", GB, 2


def label(training, varying: list[str]) -> str:
    """The settings that change across the sweep, in words: `batch 4 · length 256`.
    `training`: a TrainingConfig or an mlx-lm-lora run."""
    shown = [name for name in COLUMN_ORDER if name in varying] or ["batch_size", "max_seq_length"]
    return " · ".join(f"{(SETTING_COLUMNS | RUN_COLUMNS)[name][0]} {cell(name, training)}" for name in shown)


def short_label(settings, varying: list[str]) -> str:
    """The same, compactly for a plot's axis: `4×256 r16 gc` (GRPO's completions: `c512`)."""
    training = getattr(settings, "training", settings)
    parts = []
    if "method" in varying or "fine_tune_type" in varying:
        parts.append(training.method + ("/dora" if training.fine_tune_type == "dora" else ""))
    if "num_layers" in varying:
        parts.append(f"L{'all' if training.num_layers == -1 else training.num_layers}")
    if "batch_size" in varying or "max_seq_length" in varying:
        parts.append(f"{training.batch_size}×{training.max_seq_length}")
    if "rank" in varying:
        parts.append(f"r{training.rank}")
    if "grad_checkpoint" in varying:
        parts.append("gc" if training.grad_checkpoint else "no gc")
    if "max_completion_length" in varying:
        parts.append(f"c{settings.max_completion_length}")
    return " ".join(parts) or f"{training.batch_size}×{training.max_seq_length}"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown until a run finishes"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"about {seconds} s left"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"about {minutes} min {seconds:02d} s left"
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes:02d} min left"


def row_line(row: Row, name: str) -> Text:
    text = Text(f"  {name}: ")
    if row.status == MEASURED:
        verdict = judge(*measured_range(row.measured_peak_bytes), row.usable_bytes)
        process = "" if row.process_peak_bytes is None else f", process {size(row.process_peak_bytes)}"
        text.append(f"predicted {size(row.predicted_bytes)}, measured{by_slice(row.measured_by)} "
                    f"{size(row.measured_peak_bytes)} ({row.error_pct:+.1f}%)"
                    f"{process}{rate_words(row.tokens_per_second)} ")
        text.append(verdict_text(verdict))
    elif row.status == FAILED:
        text.append("failed", style="bold red")
        text.append(f": {row.reason}")
    elif row.status == UNKNOWN:
        text.append("unknown", style=UNKNOWN_STYLE)
        text.append(f": {row.reason}")
    elif row.status == SKIPPED:
        text.append("skipped", style="yellow")
        text.append(f": {row.reason}")
    else:
        text.append(f"predicted {size(row.predicted_bytes)}")
    return text


@contextmanager
def sweep_progress(total: int, varying: list[str], quiet: bool = False):
    """A bar on stderr: which combination runs, how many are left, the time to go."""
    if quiet:
        yield lambda event: None
        return
    progress = Progress(
        SpinnerColumn(),
        BarColumn(bar_width=20),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,  # the lines printed for each row stay
    )
    with progress:
        task = progress.add_task("starting", total=total)
        state = {"run": "", "left": ""}

        def show(detail: str = "") -> None:
            progress.update(task, description=" · ".join(x for x in (state["run"], detail, state["left"]) if x))

        def on_event(event: dict) -> None:
            kind = event["event"]
            if kind == "combination":
                state["run"] = f"{label(event['training'], varying)} (predicted {size(event['predicted_bytes'])})"
                left = event["remaining"]
                state["left"] = f"{left} more" + (f", {duration(event['eta_seconds'])}" if left else "")
                show("measuring" if event["action"] == "measure" else "")
            elif kind == "stage":
                show(event["stage"])
            elif kind == "step":
                show(f"step {event['step']}")
                if not err_console.is_terminal:
                    progress.console.print(step_line(state["run"], event))
            elif kind == "resumed":
                progress.advance(task)
            elif kind == "row":
                if event["row"].status != ESTIMATED:
                    # Without a terminal (a log, a pipe) each row is one line, however long.
                    progress.console.print(row_line(event["row"], f"[{event['index']}/{event['total']}] "
                                                                  f"{label(settings_of(event['row']), varying)}"),
                                           soft_wrap=not err_console.is_terminal)
                progress.advance(task)

        yield on_event


@contextmanager
def search_progress(setting: str, quiet: bool = False):
    """A spinner on stderr for the measured runs of --max."""
    if quiet:
        yield lambda event: None
        return
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err_console, transient=True)
    with progress:
        task = progress.add_task("measuring", total=None)
        state = {"run": ""}

        def on_event(event: dict) -> None:
            kind = event["event"]
            if kind == "search":
                state["run"] = f"run {event['run']}: {SETTING_WORDS[setting]} {event['value']} (predicted {size(event['predicted_bytes'])})"
                progress.update(task, description=state["run"])
            elif kind == "stage":
                progress.update(task, description=f"{state['run']} · {event['stage']}")
            elif kind == "step":
                progress.update(task, description=f"{state['run']} · step {event['step']}")
                if not err_console.is_terminal:
                    progress.console.print(step_line(state["run"], event))
            elif kind == "search_run":
                run = event["run"]
                line = Text(f"  {SETTING_WORDS[setting]} {run.value}: ")
                line.append(f"measured {size(run.measured_peak_bytes)}{by_slice(run.measured_by)} "
                            if run.measured_peak_bytes else f"{run.reason} ")
                line.append(run_word(run.fits))
                progress.console.print(line)

        yield on_event


def render_header(machine, model, training, varying: list[str], out=None, measuring: bool = False, run=None,
                  notes=None) -> None:
    """The machine, the model, and the settings that stay the same in every run.
    `run`: the first of an mlx-lm-lora sweep (its mode and knobs); `notes`: what to
    say up front instead of the hypothetical machine's note."""
    fixed = [f"{SETTING_COLUMNS[name][0]} {SETTING_COLUMNS[name][1](training)}" for name in SETTING_COLUMNS if name not in varying]
    if run is not None and run.spec.rollout and "max_completion_length" not in varying:
        fixed.append(f"completion {run.max_completion_length}")
    fixed.append(f"optimizer {training.optimizer}")
    if training.quantize and "method" not in varying:
        fixed.append(f"{training.bits}-bit base, group size {training.group_size}")
    console.print(f"[bold]Machine[/]  {machine_line(machine)}")
    console.print(f"[bold]Model[/]    {model.id} · {model.model_type or 'unknown architecture'} · {format_count(model.params)} parameters")
    if run is not None:
        console.print(f"[bold]Mode[/]     {mode_words(run)}")
    console.print(f"[bold]Fixed[/]    {' · '.join(fixed)}")
    if out:
        console.print(f"[bold]Results[/]  {out}")
    if notes is not None:
        for note in notes:
            console.print(f"[bold yellow]Note[/]     {note}")
    elif measuring and machine.hypothetical:
        console.print(f"[bold yellow]Note[/]     {hypothetical_note(machine)}")
    print_warnings(machine)


def mode_words(run) -> str:
    """An mlx-lm-lora run's mode and the knobs it adds: `grpo (mlx_lm_lora.train) · beta 0.1 · ...`."""
    from ..estimate.preference import DEFAULT_PROMPT

    words = [f"{run.mode} (mlx_lm_lora.train)", f"beta {run.beta:g}"]
    if run.has_reference:
        words.append(f"reference: {run.reference_model_path or 'a second copy of the model'}")
    if run.spec.rollout:
        words.append(f"group size {run.group_size}")
        words.append(f"prompt {run.prompt_length or DEFAULT_PROMPT}" + (" (assumed)" if run.prompt_length is None else ""))
    elif run.efficient_long_context:
        words.append("efficient long context")
    return " · ".join(words)


def hypothetical_note(machine, by_slice: bool = True) -> str:
    """`by_slice` False: mlx-lm-lora's runs, which cannot be measured by slice."""
    over = ("a run predicted over what this machine can hold is measured by slice" if by_slice else
            "a run predicted over what this machine can hold is not measured (mlx-lm-lora's trainers cannot be "
            "measured by slice)")
    return (f"the runs are measured on this machine, with its own backend and memory, and judged against the "
            f"hypothetical budget of {size(machine.usable_bytes)}: a measured peak is this machine's, not that one's; "
            + over)


def by_slice(measured_by: str | None) -> str:
    return " by slice" if measured_by == "slice" else ""


def rate_words(tokens_per_second: float | None) -> str:
    """", N tok/s", or nothing for a run measured by slice."""
    return "" if tokens_per_second is None else f", {tokens_per_second:,.0f} tok/s"


def rate_cell(value: float | None, spec: str) -> str:
    """tok/s or s/step; blank for a run measured by slice (a slice's speed is not the run's)."""
    return "" if value is None else format(value, spec)


def number(n_bytes: int | None, unit: tuple[str, int, int]) -> str:
    """A table cell in the table's unit (named in the column title)."""
    if n_bytes is None:
        return ""
    return f"{n_bytes / unit[1]:.{unit[2]}f}"


def row_verdict(row: Row) -> Text:
    if row.status == MEASURED:
        return verdict_text(judge(*measured_range(row.measured_peak_bytes), row.usable_bytes))
    if row.status == ESTIMATED:  # an estimate's verdict respects its range (mlxfit/estimate/uncertainty.py)
        if is_preference(row):  # its mode's range
            verdict = judge(*row.predicted_range_bytes, row.usable_bytes)
        elif row.estimate_range_bytes:  # the range the sweep made, as probe's (what it spans included)
            verdict = judge(*row.estimate_range_bytes, row.usable_bytes)
        else:
            verdict = judged(row.predicted_bytes, row.training, row.backend, row.usable_bytes)
        return verdict_text(verdict, " (estimate)")
    return Text(row.status, style={FAILED: "bold red", SKIPPED: "yellow", UNKNOWN: UNKNOWN_STYLE}.get(row.status, ""))


def render_sweep(rows: list[Row], varying: list[str], usable_bytes: int, interrupted: bool = False, total: int | None = None) -> None:
    """The results table. Rows of mlx-lm-lora runs (bench --train-mode) show the
    estimate's peak phase, and no process peak or speed (their child measures neither)."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    shown = [name for name in COLUMN_ORDER if name in varying] or ["batch_size", "max_seq_length"]
    for name in shown:
        table.add_column((SETTING_COLUMNS | RUN_COLUMNS)[name][0], justify="right", no_wrap=True)
    measured = any(r.status == MEASURED for r in rows)
    preference = any(is_preference(r) for r in rows)
    unit = unit_for([n for r in rows for n in (r.predicted_bytes, r.measured_peak_bytes, r.process_peak_bytes)])
    if preference:
        titles = [f"predicted\n{unit[0]}", "peak phase"] + ([f"measured\n{unit[0]}", "error"] if measured else [])
    else:
        titles = [f"predicted\n{unit[0]}"] + ([f"measured\n{unit[0]}", "error", f"process\n{unit[0]}", "tok/s", "s/step"] if measured else [])
    for title in titles:
        table.add_column(title, justify="right" if title != "peak phase" else "left", no_wrap=True)
    table.add_column("result", min_width=8)
    notes = []
    for row in rows:
        cells = [cell(name, settings_of(row)) for name in shown]
        cells.append(number(row.predicted_bytes, unit))
        if preference:
            cells.append(row.peak_phase.split(":")[0])
            if measured:
                cells += ([number(row.measured_peak_bytes, unit), f"{row.error_pct:+.0f}%"] if row.status == MEASURED
                          else ["", ""])
        elif measured and row.status == MEASURED:
            cells += [number(row.measured_peak_bytes, unit), f"{row.error_pct:+.0f}%", number(row.process_peak_bytes, unit),
                      rate_cell(row.tokens_per_second, ".0f"), rate_cell(row.seconds_per_step, ".2f")]
        elif measured:
            cells += [""] * 5
        if row.reason:
            notes.append(Text.assemble(f"  {label(settings_of(row), varying)}: ", (row.status, "bold"), f": {row.reason}"))
        table.add_row(*cells, row_verdict(row))
    console.print(table)
    for note in notes:
        console.print(note)
    if interrupted:
        console.print(f"[yellow]Interrupted[/] after {len(rows)} of {total}: what was measured is kept; run again with --resume for the rest.")
    if preference:
        words = (" Measured: MLX's peak over a few steps of mlx-lm-lora's own trainer (what probe --measure reports);"
                 " error: predicted against it." if measured else "")
    else:
        words = (" Measured: MLX's peak with the model load (what mlx-lm reports); error: predicted against it;"
                 " process: the resident high-water mark." if measured else "")
    console.print(f"[dim]Budget {size(usable_bytes)}." + words + f" {UNITS_NOTE}[/]")


def render_max(result: MaxResult) -> None:
    words = SETTING_WORDS[result.setting]
    limit = f"{size(result.target_bytes)} (the {size(result.usable_bytes)} budget less a {result.margin:.0%} margin)"
    timed_out = next((r for r in result.runs if r.fits is None), None)
    if result.unknown and result.value is None:
        console.print(f"[{UNKNOWN_STYLE}]Unknown[/]: the measurement of {words} {timed_out.value} timed out before it "
                      f"could tell whether it fits {limit}; raise --timeout or --estimate-only.")
    elif result.unknown:
        console.print(f"[bold]Largest {words} measured to fit[/] {limit}: [bold green]at least {result.value}[/]; "
                      f"{words} {timed_out.value} timed out, so larger values are unknown.")
    elif result.value is None:
        how = "when measured" if result.measured else "by the estimate"
        console.print(f"[bold red]No {words} fits[/] {limit} {how}.")
    else:
        console.print(f"[bold]Largest {words} that fits[/] {limit}: [bold green]{result.value}[/]")
    if result.measured:
        run = result.answer_run
        if run is not None:
            console.print(f"  measured peak{by_slice(run.measured_by)} {size(run.measured_peak_bytes)} "
                          f"(process {size(run.process_peak_bytes)}{rate_words(run.tokens_per_second)})")
        console.print(f"  {len(result.runs)} measured run{'s' if len(result.runs) != 1 else ''}; "
                      f"the estimate alone said {result.estimate_value} ({size(result.estimate_bytes)})")
        if not result.settled and not result.unknown:
            console.print(f"  [yellow]stopped after {len(result.runs)} runs before the limit was pinned down:[/] "
                          f"{result.value} fits, larger values were not all tried")
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for title in ("run", words, "predicted", "measured", "result"):
            table.add_column(title, justify="right" if title != "result" else "left")
        for i, r in enumerate(result.runs, 1):
            measured = size(r.measured_peak_bytes) + (" (slice)" if r.measured_by == "slice" else "")
            table.add_row(str(i), str(r.value), size(r.predicted_bytes), measured if r.measured_peak_bytes else r.reason,
                          run_word(r.fits))
        console.print(table)
    elif result.value is not None:
        console.print(f"  predicted peak {size(result.estimate_bytes)} (estimate only)")
        if not result.estimate_verdict.fits:
            console.print(f"  [yellow]probe calls it {result.estimate_verdict.value}[/]: the estimate's range reaches past the "
                          f"whole {size(result.usable_bytes)} budget; --measure (without --estimate-only) settles it")
    measured_note = "Measured: MLX's peak with the model load (what mlx-lm reports). " if result.measured else ""
    console.print(f"[dim]{measured_note}{UNITS_NOTE}[/]")


def check_plotting() -> None:
    """Fail at once, before a long sweep, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MlxfitError(f"--plot needs matplotlib: {PLOT_INSTALL}") from None


def plot_sweep(rows: list[Row], varying: list[str], usable_bytes: int, path, title: str = "") -> None:
    """Two panels: predicted and measured peak per configuration with the budget
    line; tokens per second beside it. Written without pyplot's global state."""
    check_plotting()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [short_label(settings_of(r), varying) for r in rows]
    x = list(range(len(rows)))
    unit_name, unit, _ = unit_for([n for r in rows for n in (r.predicted_bytes, r.measured_peak_bytes, r.process_peak_bytes)])
    predicted = [r.predicted_bytes / unit for r in rows]
    measured = [r.measured_peak_bytes / unit if r.measured_peak_bytes else None for r in rows]
    speed = [r.tokens_per_second or 0.0 for r in rows]
    budget = usable_bytes / unit

    width = max(9.0, 4.0 + 0.55 * len(rows))
    fig = Figure(figsize=(width, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    memory_ax, speed_ax = fig.subplots(1, 2, width_ratios=[3, 2])

    nan = float("nan")  # a gap in a line where a run has no figure
    process = [r.process_peak_bytes / unit if r.process_peak_bytes else nan for r in rows]
    memory_ax.plot(x, predicted, "o--", color="tab:blue", label="predicted")
    what = "mlx-lm-lora trainer's peak" if any(is_preference(r) for r in rows) else "MLX peak with load"
    memory_ax.plot(x, [nan if v is None else v for v in measured], "s-", color="tab:orange", label=f"measured ({what})")
    if any(r.process_peak_bytes for r in rows):
        memory_ax.plot(x, process, "^:", color="tab:gray", alpha=0.7, label="process peak")
    for i, r in enumerate(rows):
        if r.status in (FAILED, SKIPPED, UNKNOWN):
            color = {FAILED: "tab:red", SKIPPED: "tab:olive", UNKNOWN: "tab:orange"}[r.status]
            memory_ax.annotate(r.status, (i, predicted[i]), textcoords="offset points", xytext=(0, 8),
                               ha="center", fontsize=8, color=color)
    top = max([v for v in predicted + measured + process if v and v == v] or [budget])
    log = budget > 4 * top
    if log:
        # The budget is far above every run: a log scale keeps both readable.
        memory_ax.set_yscale("log")
    memory_ax.axhline(budget, color="tab:red", linewidth=1.5, label=f"budget {size(usable_bytes)}")
    memory_ax.margins(y=0.12)  # room for the failed / skipped labels
    memory_ax.set_ylabel(f"peak memory, {unit_name} = 10^{len(str(unit)) - 1} bytes" + (" (log scale)" if log else ""))
    memory_ax.set_title("Peak memory per configuration")
    memory_ax.legend(fontsize=8, loc="best")

    colors = ["tab:green" if r.status == MEASURED else "lightgray" for r in rows]
    speed_ax.bar(x, speed, color=colors)
    for i, r in enumerate(rows):
        if r.status != MEASURED:
            speed_ax.annotate(r.status, (i, 0), textcoords="offset points", xytext=(0, 3), ha="center",
                              fontsize=8, rotation=90, color="dimgray")
    speed_ax.set_ylabel("tokens / second")
    speed_ax.set_title("Training speed")

    for ax in (memory_ax, speed_ax):
        ax.set_xticks(x, labels, rotation=45 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center", fontsize=8)
        ax.set_xlabel("configuration, by increasing prediction")
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    from ..files import write_atomically

    # Drawn beside the file and renamed over it: a full disk leaves no half-written PNG.
    write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=120))


def render_expected(low: float, high: float, runs: int) -> None:
    """How long the sweep's measurements will take, said before the first starts."""
    from ..units import format_seconds

    if runs:
        span = (format_seconds(low) if format_seconds(low) == format_seconds(high)
                else f"{format_seconds(low)}-{format_seconds(high)}")
        span = "under a second" if high < 1 else f"about {span}"
        console.print(f"Expected: {span} of training steps for {runs} run{'s' if runs != 1 else ''} measured whole "
                      "(from their operations and this machine's matmul rate), plus building each")
