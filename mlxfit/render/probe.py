"""probe's answer: the machine, model and run in brief, each method against the budget
with the bars of its parts, what to change where it does not fit, then advice and the
check of each mlx.launch node."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..estimate.plan import Plan
from ..estimate.rule import METHOD_LABELS
from ..estimate.verdict import Verdict
from ..units import GB, format_count, format_gb, format_gb_range, format_size
from .inputs import storage_words
from .memory import machine_fields, print_warnings
from .text import VERDICT_STYLE, console, print_fields, print_hanging, print_table, tokens, verdict_markup, verdict_text

SOURCE_LABEL = {
    "local": "local folder",
    "catalog": "built-in catalog",
    "hub": "Hugging Face config.json",
    "size": "bare size (no architecture)",
}
BAR_WIDTH = 12


def run_label(training) -> str:
    """The run's method in the words users know: LoRA, QLoRA, DoRA, QDoRA, full."""
    if training.fine_tune_type == "full":
        return "full fine-tuning"
    name = "DoRA" if training.fine_tune_type == "dora" else "LoRA"
    return ("Q" + name) if training.quantize else name


def method_label(method: str, training) -> str:
    """A row of the table: LoRA / QLoRA rows become DoRA / QDoRA for a DoRA run."""
    if training.fine_tune_type == "dora" and method in ("lora", "qlora"):
        return "QDoRA" if method == "qlora" else "DoRA"
    return METHOD_LABELS[method]


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


# One colour and one glyph per part: the glyphs keep the bars readable without colour
# (piped, NO_COLOR), the colours are far apart on a 256-colour terminal.
PART_STYLES = {  # the 16 standard colours, so that none merge on a 16-colour terminal
    "weights (frozen)": "bright_black",
    "weights (trainable)": "green",
    "gradients": "yellow",
    "optimizer state": "bright_red",
    "update temporaries": "bright_yellow",
    "activations": "cyan",
    "attention scores": "magenta",
    "logits and gradient": "blue",
    "adapter outputs": "bright_green",
    "dora temporaries": "red",
    "all-reduce buffers": "bright_magenta",
    "framework": "white",
    "calibration": "bright_blue",
}
PART_GLYPHS = {
    "weights (frozen)": "█",
    "weights (trainable)": "▓",
    "gradients": "▒",
    "optimizer state": "░",
    "update temporaries": "%",
    "activations": "=",
    "attention scores": "#",
    "logits and gradient": "+",
    "adapter outputs": "~",
    "dora temporaries": "*",
    "all-reduce buffers": "&",
    "framework": "@",
    "calibration": "^",
}
STACK_WIDTH = 40  # at most; a narrow terminal gets a shorter bar (stack_width)
PHASE_WORDS = {
    "loss": "the backward pass through the loss",
    "block": "the backward pass through the last trained block",
    "update": "the optimizer update",
}


def plain_output() -> bool:
    """No colour (piped, NO_COLOR, dumb terminal): parts are told apart by glyph."""
    return console.no_color or console.color_system is None


def part_glyph(name: str) -> str:
    return PART_GLYPHS.get(name, "?") if plain_output() else "█"


def stacked_bar(parts: dict, scale: int, usable: int, width: int = STACK_WIDTH) -> Text:
    """One bar per method, one colour (or glyph) per part; │ marks the budget. A
    part too small for a cell gets none, but a bar never reads empty: a run far
    below the budget shows its largest part in one cell."""
    text = Text()
    cells: list[str] = []
    used = 0.0
    for name, n in parts.items():
        used += width * n / scale
        count = round(used) - len(cells)
        cells += [name] * max(count, 0)
    if not cells and any(parts.values()):
        cells = [max(parts, key=parts.get)]
    budget_at = min(round(width * usable / scale), width)
    for i in range(width + 1):
        if i == budget_at:
            text.append("│", style="bold")
        if i < len(cells):
            text.append(part_glyph(cells[i]), style=PART_STYLES.get(cells[i], "white"))
        elif i < width:
            text.append("·", style="dim")
    return text


KIND_WORDS = {
    "sliding": "sliding-window attention",
    "mla": "multi-head latent attention",
    "linear": "linear-attention or convolution",
    "ssm": "state-space",
}


def run_fields(plan: Plan) -> list[str]:
    training, model = plan.training, plan.model
    fields = [run_label(training)]
    if model.architecture is None:
        return fields + ["rule of thumb: batch, length and layers not counted"]
    fields.append("all layers" if training.num_layers == -1 else f"last {training.num_layers} layers")
    if plan.length is not None:
        fields.append(f"batch {training.batch_size} × {tokens(plan.batch_width)} (your data's widest batch; "
                      f"--max-seq-length {training.max_seq_length})")
    else:
        fields.append(f"batch {training.batch_size} × {tokens(training.max_seq_length)} (the worst case; --data sizes yours)")
    if training.grad_accumulation_steps > 1:
        fields.append(f"{training.grad_accumulation_steps} accumulation steps")
    if training.fine_tune_type != "full":
        fields.append(f"rank {training.rank}")
    if training.quantize:
        if model.quantized:
            fields.append(f"{model.bits}-bit base as stored (group {model.group_size})")
        else:
            fields.append(f"base quantized to {training.bits} bits (group {training.group_size})")
    fields.append(training.optimizer)
    if training.grad_checkpoint:
        fields.append("grad checkpoint")
    if training.hosts > 1:
        fields.append(f"{training.hosts} hosts, batch {training.batch_size // training.hosts} each")
    fields.append(f"estimated for the {plan.backend} backend")
    return fields


def render_context(plan: Plan, nodes: list[str] | None = None) -> None:
    """What was sized: the machine, the model, the run, and the notes on them."""
    model = plan.model
    machine = machine_fields(plan.machine)
    if nodes:
        kind = "unified memory" if plan.machine.unified else "GPU memory"
        machine = [*nodes, f"{format_gb(plan.machine.total_bytes)} {kind}", *machine[1:3]]
    print_fields("Machine", machine)
    model_bits = storage_words(model)
    print_fields("Model", [
        model.id, *([model.model_type] if model.model_type else []),
        f"{format_count(model.params)} parameters ({model.params:,})", model_bits, f"from {SOURCE_LABEL[model.source]}",
    ])
    if plan.calibration is not None:
        c = plan.calibration
        print_fields("Calibration", [f"{format_size(c.offset_bytes)} added, the median gap of {c.count} "
                                     f"measurement{'s' if c.count != 1 else ''} on this machine"], indent=12)
    print_fields("Run", run_fields(plan))
    print_warnings(plan.machine)
    if model.rule_only_reason:
        print_hanging(f"[yellow]Note[/]     {model.rule_only_reason}")
    elif plan.selected.basis == "approximate":
        kinds = ", ".join(KIND_WORDS.get(k, k) for k in plan.selected.detailed.features["unmeasured_kinds"])
        print_hanging(
            f"[yellow]Note[/]     approximate: mlxfit's fitted terms were never measured on {kinds} blocks; "
            "--measure runs real steps and is the way to be sure"
        )


def render_plan(plan: Plan, nodes: list[str] | None = None, longest=()) -> None:
    """The whole plan (-v): what was sized, each method against the budget with the
    bars of its parts, and every remedy. `nodes`: words for a --hostfile run, whose
    budget is the smallest node's; `longest`: the longest examples that fit per method
    (mlxfit/estimate/lengths.py), said beside the worst case when the run has no data
    and no length of its own."""
    model = plan.model
    render_context(plan, nodes)
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
        label = method_label(e.method, plan.training) + (" ¹" if e.sized_on else "") + (" ◀" if e.selected else "")
        sized = "—" if e.cannot else format_gb_range(e.predicted_bytes, *e.predicted_range_bytes)
        row = [Text(label, style="bold" if e.selected else ""), sized]
        if detailed:
            row.append(format_gb(e.rule_bytes))
        row += [format_gb(e.usable_bytes), "—" if e.cannot else format_gb(e.headroom_bytes),
                verdict_text(e.verdict)]
        if not detailed:
            row.append("" if e.cannot else bar(e.predicted_bytes, e.usable_bytes))
        table.add_row(*row)
    print_table(table)
    reasons: dict[str, list[str]] = {}
    for e in plan.estimates:
        if e.cannot:
            reasons.setdefault(e.cannot, []).append(method_label(e.method, plan.training))
    for e in plan.estimates:
        if e.sized_on:
            print_hanging(f"[yellow]¹ {method_label(e.method, plan.training)}[/] is sized on {e.sized_on}", indent=2)
    stand = "; the other rows stand" if any(not e.cannot for e in plan.estimates) else ""
    for reason, labels in reasons.items():
        print_hanging(f"[yellow]{', '.join(labels)}[/]: {reason}{stand}", indent=2)
    for note in unverified_notes(plan):
        print_hanging(note, indent=2)
    if longest:
        print_hanging(longest_words(plan, longest), indent=2)
    if detailed:
        quantized = " The base is already quantized: LoRA on it is QLoRA (no 16-bit LoRA row)." if model.quantized else ""
        print_hanging("[dim]◀ your run. Estimate: mlxfit's detailed model of mlx-lm's peak, with its range on this "
                      "backend's evidence (fits: the high end within the budget; tight: the budget inside the range); "
                      f"rule: the rule of thumb (moderate lengths and small batches).{quantized}[/]", indent=2)
        gap = rule_gap(plan)
        if gap:
            print_hanging(f"[dim]{gap[1]}[/]", indent=2)
        render_breakdowns(plan)
    elif model.architecture is not None:  # built, but mlx-lm can run none of the methods on it
        print_hanging("[dim]◀ your run. mlx-lm builds this model (its parameters are counted from it) but "
                      "cannot train it by any method, so nothing is sized.[/]", indent=2)
    else:
        what = ("mlx-lm cannot build this model here (the note above says why)" if model.rule_only_reason
                else "A bare size has no architecture")
        print_hanging(f"[dim]◀ your run. {what}, so this is the rule of thumb (moderate "
                      "lengths and small batches): LoRA 2 GB per billion parameters + 3 GB, QLoRA 0.7 GB/B + 3, "
                      "full 12 GB/B + 4.[/]", indent=2)
        render_reference(plan)
    render_remedies(plan, longest)


RULE_GAP = 2.0  # the estimate this many times the rule (or this many times below it) gets a word on why
STEP_PARTS = ("attention scores", "logits and gradient", "adapter outputs", "activations", "dora temporaries")
RESIDENT_PARTS = ("weights (frozen)", "weights (trainable)", "optimizer state", "gradients", "update temporaries")


def rule_gap(plan: Plan) -> tuple[str, str] | None:
    """Why the detailed estimate is far from the rule of thumb, either way: (a short
    clause for the first answer, the sentence for -v)."""
    e, training, model = plan.selected, plan.training, plan.model
    if not e.detailed or not e.rule_bytes:
        return None
    ratio, parts = e.predicted_bytes / e.rule_bytes, e.detailed.parts
    step = f"at batch {training.batch_size} × {tokens(plan.batch_width)}"
    if ratio >= RULE_GAP:
        big = [(n, b) for n, b in sorted(((n, parts.get(n, 0)) for n in STEP_PARTS), key=lambda p: -p[1]) if b][:3]
        named = ", ".join(f"{n} {format_gb(b)}" for n, b in big)
        return (f"{ratio:.1f}× the rule of thumb: the step's {' and '.join(n for n, _ in big[:2])}",
                f"The estimate is {ratio:.1f}× the rule: {step} the step holds {named}, which the rule's fixed "
                "3-4 GB leaves out.")
    if ratio > 1 / RULE_GAP:
        return None
    from ..estimate.rule import RULES

    per_billion, fixed = RULES[e.method]
    resident = sum(parts.get(n, 0) for n in RESIDENT_PARTS)
    rest = e.predicted_bytes - resident
    reasons = []  # (a few words, the whole reason)
    blocks = model.architecture.num_layers if model.architecture else 0
    trained = training.layers_trained(blocks) if blocks else 0
    if e.method == "full" and 0 < trained < blocks:
        words = f"only the last {trained} of {blocks} blocks train"
        reasons.append((words, words))
    trainable, state = parts.get("weights (trainable)", 0), parts.get("optimizer state", 0)
    if e.method == "full" and trainable and state < 0.9 * 4 * trainable:  # the rule: two fp32 moments per 16-bit weight
        reasons.append((f"{training.optimizer}'s state in {model.dtype}",
                        f"{training.optimizer} keeps its {format_gb(state)} of state in the weights' {model.dtype}, "
                        "where the rule counts two float32 moments"))
    if rest < fixed * GB / 2:
        reasons.append(("a short step", f"the step holds {format_gb(rest)}, under the rule's fixed {fixed:g} GB"))
    clause = f"{ratio:.2f}× the rule of thumb" + (f": {reasons[0][0]}" if reasons else "")
    why = f" ({'; '.join(r for _, r in reasons)})" if reasons else ""
    return (clause,
            f"The estimate is {ratio:.2f}× the rule: the rule counts {per_billion:g} GB per billion parameters for all "
            f"{format_count(model.params)} ({format_gb(per_billion * model.params / 1e9 * GB)}) and a fixed "
            f"{fixed:g} GB; here the weights and optimizer state come to {format_gb(resident)} and the step {step} "
            f"{format_gb(rest)}{why}.")


SAME_SIZE_WITHIN = 1.5  # a catalog model within this factor of the parameters is "of this size"


def render_reference(plan: Plan) -> None:
    """A bare size: the detailed estimate of a catalog model of about that size beside the rule."""
    ref = plan.reference
    if ref is None:
        return
    training = ref.training
    figures = " · ".join(f"{METHOD_LABELS[m]} {format_gb(b)}" for m, b in ref.estimates.items())
    ratio = ref.model.params / plan.model.params if plan.model.params else 0
    if 1 / SAME_SIZE_WITHIN <= ratio <= SAME_SIZE_WITHIN:
        which = f"A real model of this size, {ref.model.id} ({format_count(ref.model.params)})"
    else:  # nothing in the catalog is near it: say how far the nearest is
        which = (f"The catalog model nearest in size, {ref.model.id} ({format_count(ref.model.params)}, "
                 f"against this one's {format_count(plan.model.params)})")
    print_hanging(
        f"[dim]{which}, by the detailed "
        f"estimate at batch {training.batch_size} × {tokens(training.max_seq_length)} ({settings_words(training)}) "
        f"on the {ref.backend} backend:[/] {figures}. "
        f"[dim]For a plan with lengths and batches, probe it: --model {ref.model.id}[/]",
        indent=2,
    )


def settings_words(training) -> str:
    """What a reference estimate's batch × length stands for."""
    from ..model.training import defaults

    d = defaults()
    if (training.batch_size, training.max_seq_length) == (d["batch_size"], d["max_seq_length"]):
        return "mlx-lm's defaults, every batch full length: the worst case"
    return "your settings, every batch full length"


def render_units_note() -> None:
    console.print("[dim]GB = 10^9 bytes.[/]")


def stack_width() -> int:
    """The bars' width: STACK_WIDTH, less on a terminal too narrow for it and the
    label and figure beside it, so that a bar never wraps."""
    return max(8, min(STACK_WIDTH, max(console.width, 40) - 20))


def render_breakdowns(plan: Plan) -> None:
    scale = max([plan.machine.usable_bytes] + [e.predicted_bytes for e in plan.estimates if e.detailed])
    for e in plan.estimates:
        if e.detailed is None:
            continue
        line = Text(f"  {method_label(e.method, plan.training):<6}")
        line.append_text(stacked_bar(e.detailed.parts, scale, plan.machine.usable_bytes, stack_width()))
        line.append(f" {format_gb(e.predicted_bytes)}")
        console.print(line)
    shown = [name for name in PART_STYLES if any(e.detailed.parts.get(name) for e in plan.estimates if e.detailed)]
    legend = [Text.assemble((part_glyph(name), PART_STYLES[name]), " ", name) for name in shown]
    print_fields("", legend, sep="  ", indent=2)
    selected = plan.selected.detailed
    if selected is None:
        return
    parts = ", ".join(f"{name} {format_size(n)}" for name, n in selected.parts.items() if n)
    phase = PHASE_WORDS.get(selected.features.get("phase"), "the backward pass")
    print_hanging(f"[dim]  your run peaks during {phase}: {parts}[/]", indent=4)


def verdict_words(plan: Plan, longest=()) -> str:
    """The selected row's verdict in a sentence that agrees with it: "tight" is a
    budget inside the range (it may not fit), "does not fit" a range wholly above it.
    With `longest` (no data, no length given): at the worst case, and how long the
    examples may be for it to fit as it is."""
    e = plan.selected
    label, usable = run_label(plan.training), format_gb(plan.machine.usable_bytes)
    mine = next((f for f in longest if f.method == e.method), None)
    worst = f" with every batch {tokens(plan.training.max_seq_length)} long (the worst case)" if mine else ""
    low, high = e.predicted_range_bytes
    if e.verdict is Verdict.TIGHT:
        words = (f"{label} is tight for the {usable} budget{worst}: the budget lies inside the estimate's range "
                 f"({low / GB:.1f}–{high / GB:.1f} GB), so it may not fit")
    elif e.detailed:
        words = (f"{label} does not fit the {usable} budget{worst}: even the low end of the estimate's range "
                 f"({format_gb(low)}) is above it")
    else:
        words = f"{label} does not fit the {usable} budget"
    if mine is not None and mine.tokens is not None:
        words += f"; with examples up to {tokens(mine.tokens)} it fits as it is"
    return words


def fit_words(fit) -> str:
    """"up to 704 tokens", "every length up to 2,048", "none (not even 32 tokens)"."""
    from ..estimate.lengths import LENGTH_UNIT

    if fit.tokens is None:
        return f"none (not even {LENGTH_UNIT} tokens)"
    if fit.every_length:
        return f"every length up to {tokens(fit.max_seq_length)}"
    return f"up to {tokens(fit.tokens)}"


def longest_words(plan: Plan, longest) -> str:
    """The first answer without data: how long the examples may be, per method."""
    labels = {e.method: method_label(e.method, plan.training) for e in plan.estimates}
    first, *rest = longest
    figures = [f"{labels[first.method]} fits {'examples ' if first.tokens else ''}{fit_words(first)}"]
    figures += [f"{labels[f.method]} {fit_words(f)}" for f in rest]
    return (f"[bold]At batch {first.batch_size}, {'; '.join(figures)}.[/] The rows above are the worst case, "
            f"every batch {tokens(first.max_seq_length)} long: mlx-lm pads a batch only to its longest example, "
            "so --data sizes your own.")


def render_remedies(plan: Plan, longest=()) -> None:
    if not plan.remedies and not plan.options:
        return
    words = verdict_words(plan, longest)
    if plan.options:
        best, *others = plan.options
        print_hanging(f"[bold]{words}.[/]", indent=0)
        console.print("[bold]The plan that fits at the least cost:[/]")
        render_option(best, plan)
        if others:
            console.print("[bold]Alternatives:[/]")
            for option in others:
                render_option(option, plan)
        print_hanging("[dim]Add the flags to your command; probing again confirms the plan. Cheapest first: what "
                      "costs only speed (checkpointing, accumulation), then what changes the training.[/]", indent=0)
    elif plan.selected.cannot:
        label = method_label(plan.selected.method, plan.training)
        print_hanging(f"[bold]mlx-lm cannot run {label} on this model, and no change of the remedies below makes it "
                      "possible.[/]" if plan.remedies else f"[bold]mlx-lm cannot run {label} on this model.[/]", indent=0)
    elif plan.model.architecture is not None:
        print_hanging(f"[bold]{words}, and no combination of the remedies "
                      "below (nor a smaller catalog model) makes it fit: it needs a machine with more memory.[/]",
                      indent=0)
    else:
        print_hanging(f"[bold]{words}.[/]", indent=0)
        console.print("[bold]What to change:[/]")
    if plan.remedies:
        title = "Each change alone:" if plan.options or plan.model.architecture is not None else None
        if title:
            console.print(f"[dim]{title}[/]")
        for r in plan.remedies:
            if r.new_bytes is None:
                result = ""
            else:
                result = f" → {format_gb(r.new_bytes)}, {verdict_markup(r.verdict)}"
            print_hanging(f"  [bold]{r.change}[/]{result} · [dim]{r.why}{_time_cost(r, plan)}[/]", indent=4)


def flag_pairs(flags: str) -> list[str]:
    """'--a 1 --b --c 2' -> ['--a 1', '--b', '--c 2']: the units a line may break between."""
    pairs: list[str] = []
    for word in flags.split():
        if word.startswith("-") or not pairs:
            pairs.append(word)
        else:
            pairs[-1] += " " + word
    return pairs


def _time_cost(remedy, plan: Plan | None) -> str:
    """'; 3 h 10 min (2 h 30 min now)' where the remedy's run is timed, else nothing."""
    from .time import cost_in_time

    if getattr(remedy, "run_seconds", None) is None or plan is None:
        return ""
    return "; " + cost_in_time(remedy.run_seconds, remedy.iters, plan.run_seconds, plan.run_iters)


def render_option(option, plan: Plan | None = None) -> None:
    print_fields("", [Text(p, style="bold") for p in flag_pairs(option.flags)], sep=" ", indent=4)
    costs = "; ".join(c.costs for c in option.changes) + _time_cost(option, plan)
    kind = "costs speed only" if option.speed_only else "costs"
    print_hanging(f"      → {format_gb(option.new_bytes)}, {verdict_markup(option.verdict)} · {kind}: [dim]{costs}[/]", indent=8)


def render_hosts(checks: list[dict]) -> None:
    print_hanging(f"[bold]Per node[/] ({len(checks)} hosts under mlx.launch, each with the whole model and its "
                  "share of the batch)", indent=2)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name, justify in (("host", "left"), ("memory", "right"), ("budget", "right"), ("per-node need", "right"), ("verdict", "left")):
        table.add_column(name, justify=justify)
    for c in checks:
        table.add_row(
            c["host"], format_gb(c["total_bytes"]), format_gb(c["usable_bytes"]),
            format_gb(c["predicted_peak_bytes"]), verdict_text(c["verdict"]),
        )
    print_table(table)


def render_advice(notes: list[str]) -> None:
    for note in notes:
        print_hanging(f"[yellow]advice:[/] {note}", indent=2)


def render_answer(answer, verbose: bool = False) -> None:
    """All of probe's answer (mlxfit.answer.Answer) as text. By default one screen that
    leads with the answer: each method's verdict (and the longest examples that fit),
    the plan, then what was sized. `verbose` (-v): what it was given, the whole plan
    with each estimate's parts and every remedy, the advice, each node's check, the
    measurement, and the note on units."""
    from . import inputs, measurement
    from .time import render_time

    nodes = None
    if answer.hosts:
        nodes = [f"per node: {len(answer.hosts)} hosts in {answer.hostfile}", f"planned for the smallest, {answer.tightest.name}"]
    if not verbose:
        render_verdicts(answer.plan, answer.longest)
        render_brief_remedies(answer.plan)
        if answer.comparison is not None:
            measurement.render_comparison(answer.comparison, verbose=False)
        render_time(answer.time, answer.time_checkpointed, answer.measured_time)
        render_advice(answer.advice)
        render_given(answer)
        render_context(answer.plan, nodes)
        if answer.plan.reference is not None:
            render_reference(answer.plan)
        if answer.host_checks is not None:
            render_hosts(answer.host_checks)
        console.print("[dim]-v shows the parts, the rule of thumb and every change · GB = 10^9 bytes.[/]")
        return
    render_given(answer)
    render_plan(answer.plan, nodes=nodes, longest=answer.longest)
    render_time(answer.time, answer.time_checkpointed, answer.measured_time)
    render_advice(answer.advice)
    if answer.host_checks is not None:
        render_hosts(answer.host_checks)
    if answer.comparison is not None:
        measurement.render_comparison(answer.comparison)
    render_units_note()


def render_given(answer) -> None:
    """What probe was given beyond the model: the config's notes, warnings, --data and
    its validation set."""
    from . import inputs

    inputs.render_config_notes(answer.resolved)
    inputs.render_input_warnings(answer.warnings)
    if answer.stats is not None:
        inputs.render_data(answer.stats)
    if answer.validation is not None:
        inputs.render_validation(answer.validation)


# --- the first answer: one screen ---------------------------------------------------


def verdict_phrase(e) -> str:
    """A row's figure and verdict in a few words: "47.8 GB (43.3–58.3), does not fit"."""
    if e.cannot:
        return f"[{VERDICT_STYLE[e.verdict]}]mlx-lm cannot run it[/] (below)"
    after = " (it may not fit)" if e.verdict is Verdict.TIGHT else ""
    return f"{format_gb_range(e.predicted_bytes, *e.predicted_range_bytes)}, {verdict_markup(e.verdict, after)}"


def short_fit_words(fit) -> str:
    """"up to 704 tokens", "every length", "none": a row of the first answer."""
    if fit.tokens is None:
        return "none"
    return "every length" if fit.every_length else f"up to {tokens(fit.tokens)}"


def unverified_notes(plan: Plan, brief: bool = False) -> list[str]:
    """Why a range is wider than the estimate's spread: what it counts unverified on this
    backend (`brief`: one line each, the why with -v)."""
    found = {u.mechanism: u.why for e in plan.estimates if not e.cannot for u in e.unverified}
    if brief:
        return [f"[yellow]The range covers the {mechanism} and its absence[/] (-v: why)." for mechanism in found]
    return [f"[yellow]The range spans the {mechanism} and its absence[/]: {why}." for mechanism, why in found.items()]


def render_verdicts(plan: Plan, longest=()) -> None:
    """Each method's verdict, first; without data or a length of the run's own, the
    longest examples that fit at the run's batch beside the worst case."""
    training, usable = plan.training, format_gb(plan.machine.usable_bytes)
    labels = {e.method: method_label(e.method, plan.training) + (" ¹" if e.sized_on else "") + (" ◀" if e.selected else "")
              for e in plan.estimates}
    width = max(len(label) for label in labels.values()) + 2
    gap = rule_gap(plan)
    fits = {f.method: f for f in longest}
    if plan.model.architecture is None:
        why = ("mlx-lm cannot build this model here, the note below says why" if plan.model.rule_only_reason
               else "a bare size has no architecture")
        print_hanging(f"[bold]By the rule of thumb[/] ({why}; batch and length not counted), against the {usable} "
                      "budget:", indent=2)
    elif fits:
        console.print(f"[bold]At batch {training.batch_size}, the longest examples that fit the {usable} budget:[/]")
    elif plan.length is not None:
        console.print(f"[bold]At batch {training.batch_size} × {tokens(plan.batch_width)}[/] (your data's widest batch), "
                      f"against the {usable} budget:")
    else:
        console.print(f"[bold]At batch {training.batch_size} × {tokens(plan.batch_width)}[/], against the {usable} budget:")
    fit_width = max((len(short_fit_words(f)) for f in longest), default=0)
    for e in plan.estimates:
        label = Text(f"  {labels[e.method]:<{width}}", style="bold" if e.selected else "")
        if e.method in fits:
            words = f"{short_fit_words(fits[e.method]):<{fit_width}} · at {training.max_seq_length:,}: {verdict_phrase(e)}"
        else:
            words = verdict_phrase(e)
        print_hanging(label + Text.from_markup(words, emoji=False), indent=width + 4)
    notes = []
    if fits:
        notes.append(f"{tokens(training.max_seq_length)} in every batch is the worst case"
                     + (f" ({gap[0]})" if gap else "") + ": mlx-lm pads a batch only to its longest example, "
                     "so --data sizes your own.")
    elif gap:
        notes.append(f"The estimate is {gap[0]}.")
    for e in plan.estimates:
        if e.sized_on:  # the first clause: where it was sized; -v says why mlx-lm cannot
            notes.append(f"[yellow]¹ {method_label(e.method, plan.training)}[/] is sized on "
                         f"{e.sized_on.split(':')[0]}, which mlx-lm cannot fully fine-tune")
    stand = "; the other rows stand" if any(not e.cannot for e in plan.estimates) else ""
    reasons: dict[str, list[str]] = {}
    for e in plan.estimates:
        if e.cannot:
            reasons.setdefault(e.cannot, []).append(method_label(e.method, plan.training))
    notes += [f"[yellow]{', '.join(labels)}[/]: {reason}{stand}" for reason, labels in reasons.items()]
    notes += unverified_notes(plan, brief=True)
    for note in notes:
        print_hanging(note, indent=2)


def render_brief_remedies(plan: Plan) -> None:
    """The cheapest plan that fits (the alternatives and single changes come with -v)."""
    if plan.options:
        best, *others = plan.options
        more = f" (-v: {len(others)} alternative{'s' if len(others) != 1 else ''})" if others else ""
        label = run_label(plan.training)
        console.print(f"[bold]The plan that fits {label} at the least cost{more}:[/]")
        render_option(best, plan)
        if plan.model.quantized and plan.training.fine_tune_type == "full":
            print_hanging("[dim]Full fine-tuning itself needs the 16-bit base: mlx_lm.convert --dequantize it.[/]", indent=0)
    elif plan.model.architecture is not None and all(e.cannot for e in plan.estimates):
        print_hanging("[bold]mlx-lm builds this model (its parameters are counted from it) but cannot train it by "
                      "any method, so nothing is sized.[/]", indent=0)
    elif plan.selected.cannot:
        label = method_label(plan.selected.method, plan.training)
        print_hanging(f"[bold]mlx-lm cannot run {label} on this model[/]"
                      + (" (-v: what was tried)." if plan.remedies else "."), indent=0)
    elif plan.model.architecture is not None and not plan.selected.fits:
        print_hanging(f"[bold]No combination of the remedies (nor a smaller catalog model) makes "
                      f"{run_label(plan.training)} fit: it needs a machine with more memory.[/]", indent=0)
    elif plan.remedies:
        console.print("[bold]What to change:[/]")
        for r in plan.remedies:
            result = ""
            if r.new_bytes is not None:
                result = f" → {format_gb(r.new_bytes)}, {verdict_markup(r.verdict)}"
            print_hanging(f"  [bold]{r.change}[/]{result} · [dim]{r.why}{_time_cost(r, plan)}[/]", indent=4)


FULL_ON_QUANTIZED_REMEDY = ("train the original 16-bit model, or dequantize this one (mlx_lm.convert --dequantize); "
                            "mlx-lm cannot fully fine-tune a quantized base, so no plan above keeps full on it")
