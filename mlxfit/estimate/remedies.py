"""What to change when a run does not fit: a plan searched over combined remedies.

The source's remedies (shorter examples, smaller batch, QLoRA, gradient
checkpointing, a smaller model or LoRA instead of full), plus mlx-lm's
`--num-layers`, are combined and each combination is sized with the detailed
estimate. The plan is the combination that fits at the least cost; a few cheaper
or different ones that also fit are its alternatives. Pure functions: they return
data and never print.

The cost model (README, "What to change"): what costs only speed comes first,
what changes the training last.

- `--grad-checkpoint`: a second forward of the trained blocks, so slower (cost 1).
- a smaller batch with gradient accumulation: the effective batch is kept, the
  steps are smaller (cost 0.5 per halving).
- `--num-layers`: fewer blocks learn (cost 2 per halving).
- `--lora-dropout 0`, where the run has dropout: each adapter no longer keeps its
  dropped-out input and mask, but trains without that regularization (cost 1.5).
- QLoRA: the base is trained in 4 bits (cost 3); LoRA instead of full (cost 4).
- a shorter `--max-seq-length`: examples are cut (cost 3 per halving), never below
  what the data needs (with `--data`, its 99th percentile; without, 512 tokens
  unless the run already asks for less).
- another model: a smaller one of the catalog (cost 10).

A plan that fits with margin beats one that is tight, whatever their costs. What
each costs in time is added afterwards, where a speed is known (plan_time.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import MlxfitError
from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from ..units import format_count
from .sizing import catalog_model, catalog_sizes, sized
from .verdict import Verdict

MIN_LENGTH_WITHOUT_DATA = 512
DATA_KEEP_SHARE = 0.99  # with --data, never cut below what keeps this share whole
NO_EFFECT = 0.01  # a change that moves the estimate by less than this share is not a remedy
ALTERNATIVES = 3

COST_CHECKPOINT = 1.0
COST_BATCH_HALVING = 0.5
COST_NO_DROPOUT = 1.5
COST_LAYERS_HALVING = 2.0
COST_QLORA = 3.0
COST_LORA_NOT_FULL = 4.0
COST_LENGTH_HALVING = 3.0
COST_OTHER_MODEL = 10.0


@dataclass(frozen=True)
class Change:
    """One remedy inside a plan: the flags to add and what it costs."""

    dimension: str  # "checkpoint" | "batch" | "dropout" | "method" | "layers" | "length" | "model"
    flags: str
    cost: float
    costs: str  # what it costs, in words
    level: int = 1  # how far along its dimension (plans are compared by these)

    @property
    def speed_only(self) -> bool:
        return self.dimension in ("checkpoint", "batch")

    def to_dict(self) -> dict:
        return {"dimension": self.dimension, "flags": self.flags, "cost": self.cost, "costs": self.costs,
                "speed_only": self.speed_only}


@dataclass(frozen=True)
class Option:
    """A combination of changes and the run it makes, with its estimate."""

    changes: tuple[Change, ...]
    model: ModelInfo
    training: TrainingConfig
    new_bytes: int
    verdict: Verdict
    run_seconds: float | None = None  # the whole run's time, where a speed is known (plan_time.py)
    iters: int | None = None  # the iterations timed: the run's, or more for a smaller batch

    @property
    def cost(self) -> float:
        return sum(c.cost for c in self.changes)

    @property
    def flags(self) -> str:
        return " ".join(c.flags for c in self.changes)

    @property
    def fits(self) -> bool:
        """As probe's verdict: the range's high end within the budget."""
        return self.verdict.fits

    @property
    def speed_only(self) -> bool:
        return all(c.speed_only for c in self.changes)

    def levels(self) -> dict:
        return {c.dimension: c.level for c in self.changes}

    def to_dict(self) -> dict:
        return {
            "flags": self.flags,
            "new_bytes": self.new_bytes,
            "verdict": self.verdict.value,
            "fits": self.fits,
            "cost": self.cost,
            "speed_only": self.speed_only,
            "model": self.model.id,
            "changes": [c.to_dict() for c in self.changes],
            "run_seconds": None if self.run_seconds is None else round(self.run_seconds, 1),
            "iters": self.iters,
        }


# --- the dimensions ---------------------------------------------------------------


def _divisors_down(n: int, step: int) -> list[int]:
    """Batch sizes below n that divide it and split evenly over `step` hosts, largest first.
    Found in pairs up to the square root, so a huge --batch-size answers at once."""
    found = set()
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            found.update((d, n // d))
    return sorted((b for b in found if b < n and b % step == 0), reverse=True)


def _halvings(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def length_floor(training: TrainingConfig, data=None) -> int:
    """The shortest --max-seq-length a plan may propose (never below what the data needs)."""
    if data is not None and len(data.lengths):
        from ..model.dataset import smallest_max_length

        return min(training.max_seq_length, smallest_max_length(data.lengths, DATA_KEEP_SHARE))
    return min(training.max_seq_length, MIN_LENGTH_WITHOUT_DATA)


def dimensions(model: ModelInfo, training: TrainingConfig, data=None, length: int | None = None) -> dict:
    """dimension -> [(Change, changed training)], mildest first; each list may be empty."""
    dims: dict[str, list] = {}
    dims["checkpoint"] = [] if training.grad_checkpoint else [
        (Change("checkpoint", "--grad-checkpoint", COST_CHECKPOINT,
                "recomputes the trained blocks' forward (slower)"),
         lambda t: replace(t, grad_checkpoint=True))
    ]
    batch, accumulation = training.batch_size, training.grad_accumulation_steps
    effective = batch * accumulation
    dims["batch"] = [
        (Change("batch", f"--batch-size {b} --grad-accumulation-steps {effective // b}",
                COST_BATCH_HALVING * math.log2(batch / b),
                f"batch {b} × {effective // b} steps (same effective batch)", level=i),
         lambda t, b=b: replace(t, batch_size=b, grad_accumulation_steps=effective // b))
        for i, b in enumerate(_divisors_down(batch, training.hosts), 1)
    ]
    methods = []
    if training.fine_tune_type == "full":
        methods.append((Change("method", "--method lora --fine-tune-type lora", COST_LORA_NOT_FULL,
                               "LoRA adapters instead of full fine-tuning"),
                        lambda t: replace(t, fine_tune_type="lora")))
        if not model.quantized:
            methods.append((Change("method", "--method qlora --fine-tune-type lora", COST_LORA_NOT_FULL + COST_QLORA,
                                   "LoRA on a 4-bit base instead of full fine-tuning", level=2),
                            lambda t: replace(t, fine_tune_type="lora", quantize=True)))
    elif not training.quantize:
        methods.append((Change("method", "--method qlora", COST_QLORA, f"trains on a {training.bits}-bit base"),
                        lambda t: replace(t, quantize=True)))
    dims["method"] = methods
    dims["dropout"] = [] if training.fine_tune_type == "full" or not training.dropout else [
        (Change("dropout", "--lora-dropout 0", COST_NO_DROPOUT, no_dropout_costs(training.dropout)),
         lambda t: replace(t, dropout=0.0))
    ]
    if model.architecture is not None:
        total = model.architecture.num_layers
        layers = training.layers_trained(total)
        dims["layers"] = [
            (Change("layers", f"--num-layers {n}", COST_LAYERS_HALVING * math.log2(layers / n),
                    f"trains the last {n} of {total} blocks", level=i),
             lambda t, n=n: replace(t, num_layers=n))
            for i, n in enumerate(_halvings(layers, 1), 1)
        ]
    longest = training.batch_width(length)
    floor = length_floor(training, data)
    cuts = [n for n in _halvings(training.max_seq_length, 1) if floor <= n < longest]
    if floor < longest and floor not in cuts:
        cuts.append(floor)
    dims["length"] = [
        (Change("length", f"--max-seq-length {n}", COST_LENGTH_HALVING * math.log2(training.max_seq_length / n),
                _truncation_words(n, data), level=i),
         lambda t, n=n: replace(t, max_seq_length=n))
        for i, n in enumerate(sorted(set(cuts), reverse=True), 1)
    ]
    order = ("method", "checkpoint", "batch", "dropout", "length", "layers")
    return {name: dims[name] for name in order if name in dims}


def no_dropout_costs(dropout: float) -> str:
    """What --lora-dropout 0 costs a run with this dropout, in words (every mode's plans)."""
    return f"no LoRA dropout (was {dropout:g}): trains without its regularization"


def _truncation_words(n: int, data) -> str:
    if data is None or not len(data.lengths):
        return f"cuts examples past {n} tokens"
    cut = sum(1 for x in data.lengths if x > n)
    return f"cuts {cut:,} of {len(data.lengths):,} examples ({100 * cut / len(data.lengths):.1f}%)"


# --- sizing -----------------------------------------------------------------------


def _sizer(backend: str, calibration, length: int | None, usable: int):
    def size(model: ModelInfo, changes: tuple[Change, ...], training: TrainingConfig) -> Option | None:
        """None: mlx-lm cannot run this (quantize, adapt or freeze the model, or fully
        fine-tune a quantized base: sizing.FULL_ON_QUANTIZED), so it is never offered."""
        if model.quantized and training.fine_tune_type == "full":
            return None
        try:
            return Option(changes, model, training, *sized(model, training, backend, usable, calibration, length))
        except MlxfitError:
            return None

    return size


def _rank(option: Option):
    return (not option.fits, option.cost, option.new_bytes)


def _dominates(a: Option, b: Option) -> bool:
    """a asks for no more than b along every dimension (and is not b)."""
    la, lb = a.levels(), b.levels()
    return la != lb and all(lb.get(d, 0) >= level for d, level in la.items())


def single_changes(machine, model: ModelInfo, training: TrainingConfig, backend: str, calibration=None,
                   length: int | None = None, data=None) -> tuple[Option, ...]:
    """Each remedy alone, at its mildest level that fits (else the level that needs
    least), in the source's order; remedies that do not move the estimate are dropped."""
    size = _sizer(backend, calibration, length, machine.usable_bytes)
    start = size(model, (), training)
    base = start.new_bytes if start is not None else None
    found = []
    dims = dimensions(model, training, data, length)
    for name in ("length", "batch", "method", "checkpoint", "dropout", "layers"):
        chosen = None
        for change, apply in dims.get(name, []):
            option = size(model, (change,), apply(training))
            if option is None:
                continue
            if chosen is None or option.fits or option.new_bytes < chosen.new_bytes:
                chosen = option
            if option.fits:
                break
        # A change that makes a run mlx-lm cannot do (base None) possible is a remedy.
        if chosen is not None and (base is None or base - chosen.new_bytes >= NO_EFFECT * base):
            found.append(chosen)
    other = smaller_model(machine, model, training, backend, calibration, length, changes=False)
    if other is not None:
        found.append(other)
    return tuple(found)


def search(machine, model: ModelInfo, training: TrainingConfig, backend: str, calibration=None,
           length: int | None = None, data=None) -> tuple[Option, ...]:
    """The plans that fit, cheapest first: the first is the plan, the rest alternatives.

    Every combination of the dimensions' levels is sized (a few hundred estimates
    at most); combinations that ask for more than a cheaper fitting one along every
    dimension are dropped. A smaller catalog model is offered only when the model's
    own combinations leave room for alternatives."""
    size = _sizer(backend, calibration, length, machine.usable_bytes)
    dims = [[(None, None)] + levels for levels in dimensions(model, training, data, length).values()]
    fitting = []
    for combo in _product(dims):
        changes = tuple(c for c, _ in combo if c is not None)
        if not changes:
            continue
        run = training
        for change, apply in combo:
            if apply is not None:
                run = apply(run)
        option = size(model, changes, run)
        if option is not None and option.fits:
            fitting.append(option)
    fitting.sort(key=_rank)
    kept: list[Option] = []
    for option in fitting:
        if not any(_dominates(k, option) for k in kept):
            kept.append(option)
    kept = kept[: 1 + ALTERNATIVES]
    if len(kept) < 1 + ALTERNATIVES:
        other = smaller_model(machine, model, training, backend, calibration, length)
        if other is not None:
            kept.append(other)
    return tuple(kept)


def _product(dims):
    if not dims:
        yield ()
        return
    for head in dims[0]:
        for tail in _product(dims[1:]):
            yield (head, *tail)


def comparable_models(model: ModelInfo) -> list[list]:
    """The catalog's smaller models a user would call comparable, nearest kind first:
    the same family (Qwen2.5), then the same architecture (qwen2), then the same maker
    (Qwen); never an unrelated one (a 350M LFM2 for a 7B Qwen)."""
    from ..model.resolve import family

    smaller = [m for m in catalog_sizes() if m.params < model.params]
    own_family = family(model.id)
    maker = model.id.split("/")[0] if "/" in model.id else None
    groups, seen = [], set()
    for test in (lambda m: m.family == own_family,
                 lambda m: m.model_type == model.model_type,
                 lambda m: maker is not None and m.maker == maker):
        group = [m for m in smaller if m.id not in seen and test(m)]
        seen.update(m.id for m in group)
        groups.append(sorted(group, key=lambda m: -m.params))
    return groups


def smaller_model(machine, model: ModelInfo, training: TrainingConfig, backend: str, calibration=None,
                  length: int | None = None, changes: bool = True) -> Option | None:
    """The largest comparable catalog model smaller than this one that fits by the
    detailed estimate, at these settings (or, when `changes`, with QLoRA,
    checkpointing and a smaller batch as needed, cheapest first)."""
    size = _sizer(backend, calibration, length, machine.usable_bytes)
    for group in comparable_models(model):
        for other in group:
            built = catalog_model(other.id)  # built only when it is tried
            option = _fit_other(size, model, built, training, changes) if built.architecture else None
            if option is not None:
                return option
    return None


def _fit_other(size, model: ModelInfo, other: ModelInfo, training: TrainingConfig, changes: bool) -> Option | None:
    flags = f"--model {other.id}"
    if model.quantized and training.quantize and training.fine_tune_type != "full":
        flags += " --method qlora"  # the catalog's model is not quantized; quantize it as this one is
    if training.num_layers != -1 and training.num_layers > other.architecture.num_layers:
        flags += f" --num-layers {other.architecture.num_layers}"
        training = replace(training, num_layers=other.architecture.num_layers)
    move = Change("model", flags, COST_OTHER_MODEL, f"another model: {other.id} ({format_count(other.params)})")
    extra = [[(None, None)]]
    if changes:
        dims = dimensions(other, training)
        extra = [[(None, None)] + dims[name] for name in ("method", "checkpoint", "batch")]
    best = None
    for combo in _product(extra):
        run = training
        for _, apply in combo:
            if apply is not None:
                run = apply(run)
        option = size(other, (move, *(c for c, _ in combo if c is not None)), run)
        if option is not None and option.fits and (best is None or _rank(option) < _rank(best)):
            best = option
    return best
