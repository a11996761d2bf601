"""How long a measurement will take, said before it starts: the operations of one
training step of the run, counted from the architecture, over a rate of this
machine measured for the model's dtype (mlxfit/measure/rate.py). Pure functions:
they return data and never print.

One step (one batch of B x T tokens, mlx_lm/tuner/trainer.py) runs:

- the forward pass: 2 operations per weight a token goes through (a linear layer;
  an MoE block's k of E experts), the head's 2 V h, and per softmax-attention block
  4 H d T (the scores and their weighted sum);
- the backward pass: the input gradients from the loss down to the first trained
  block (as much again, the attention's twice), and the weight gradients of what
  is trained (2 per trainable element and token);
- with --grad-checkpoint, the trained blocks' forward pass once more.

The measurement runs between MIN_STEPS and --steps steps (it stops once the peak
has held), a slice a fixed number where it is synchronous, plus building the
model; the count is of matrix products only, so the time is a guide, not a promise.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig

ATTENTION_KINDS = ("attention", "sliding", "mla")


def _block_operations(block, tokens: int) -> tuple[int, int]:
    """(forward operations per token of the block's linear layers, of its attention)."""
    linear = 0
    for lin in block.linears:
        if lin.experts > 1 and block.experts_per_token:
            linear += 2 * lin.params * block.experts_per_token // lin.experts
        else:
            linear += 2 * lin.params
    attention = 4 * block.heads * block.head_dim * tokens if block.kind in ATTENTION_KINDS else 0
    return linear, attention


def phase_operations(model: ModelInfo, training: TrainingConfig, length: int | None = None,
                     sequences: int | None = None) -> dict[str, int]:
    """Operations of one training step by phase: "forward" (its linear layers and
    head), "attention" (the scores and weighted sums, forward and backward),
    "backward" (input and weight gradients of the linear layers and head) and
    "recompute" (--grad-checkpoint's second forward of the trained blocks).
    `sequences`: the rows one host runs (default batch_size / hosts)."""
    from .detailed import counted_totals

    arch = model.architecture
    batch_len = training.batch_width(length)
    T = max(batch_len - 1, 1)  # mlx-lm's default_loss drops the last token
    rows = training.batch_size // training.hosts if sequences is None else sequences
    N = rows * T
    first = arch.num_layers - training.layers_trained(arch.num_layers)
    per_block = [_block_operations(b, T) for b in arch.blocks]
    head = 2 * arch.vocab_size * arch.hidden_size
    trained = per_block[first:]
    trainable_elements = counted_totals(model, training)[1]
    recompute = N * sum(lin + att for lin, att in trained) if training.grad_checkpoint else 0
    return {
        "forward": N * (sum(lin for lin, _ in per_block) + head),
        "attention": N * (sum(att for _, att in per_block) + sum(2 * att for _, att in trained)),
        "backward": N * (head + sum(lin for lin, _ in trained)) + 2 * N * trainable_elements,
        "recompute": recompute,
    }


def forward_operations(model: ModelInfo, length: int, sequences: int) -> int:
    """Operations of a forward pass alone (an evaluation, a reference model) of
    `sequences` rows `length` tokens wide."""
    arch = model.architecture
    T = max(length, 1)
    per_block = [_block_operations(b, T) for b in arch.blocks]
    return sequences * T * (sum(lin + att for lin, att in per_block) + 2 * arch.vocab_size * arch.hidden_size)


def step_operations(model: ModelInfo, training: TrainingConfig, length: int | None = None) -> int:
    """Operations (multiply-adds counted as two) of one training step of this run."""
    return sum(phase_operations(model, training, length).values())


@dataclass(frozen=True)
class Expectation:
    """What a measurement will take on this machine: its steps and their operations,
    fewest to most (it stops once the peak has held), at the rate measured here."""

    steps: tuple[int, int]
    operations: tuple[int, int]  # of all the steps
    rate: float  # operations per second measured here for the dtype
    dtype: str
    runs: int = 1  # slices measured in turn (1: the run itself)

    @property
    def low_seconds(self) -> float:
        return self.operations[0] / self.rate

    @property
    def high_seconds(self) -> float:
        return self.operations[1] / self.rate

    def to_dict(self) -> dict:
        return {"steps": list(self.steps), "operations": list(self.operations), "rate_per_second": self.rate,
                "dtype": self.dtype, "runs": self.runs,
                "expected_seconds": [round(self.low_seconds, 1), round(self.high_seconds, 1)]}


def expect(model: ModelInfo, training: TrainingConfig, length: int | None, rate: float, dtype: str, min_steps: int,
           max_steps: int) -> Expectation:
    """The run itself: between min_steps and max_steps steps."""
    high = max(max_steps, min_steps)
    ops = step_operations(model, training, length)
    return Expectation((min_steps, high), (min_steps * ops, high * ops), rate, dtype)


def expect_slices(runs, length: int | None, rate: float, dtype: str, min_steps: int, max_steps: int) -> Expectation:
    """Slices measured in turn: `runs` is [(sliced model, its training, fixed steps or None)]."""
    steps, ops = [0, 0], [0, 0]
    for model, training, fixed in runs:
        low, high = (fixed, fixed) if fixed else (min_steps, max(max_steps, min_steps))
        each = step_operations(model, training, length)
        steps[0] += low
        steps[1] += high
        ops[0] += low * each
        ops[1] += high * each
    return Expectation(tuple(steps), tuple(ops), rate, dtype, runs=len(runs))


def words(e: Expectation) -> str:
    """3-6 steps, 3.6-7.2 TFLOP in all, at 40.0 GFLOP/s (bfloat16 products, measured here)."""
    from ..units import format_operations

    steps = f"{e.steps[0]}" if e.steps[0] == e.steps[1] else f"{e.steps[0]}-{e.steps[1]}"
    ops = (format_operations(e.operations[0]) if e.operations[0] == e.operations[1]
           else f"{format_operations(e.operations[0])}-{format_operations(e.operations[1])}")
    where = f" over {e.runs} slices" if e.runs > 1 else ""
    return (f"{steps} steps{where}, {ops} in all, at {format_operations(e.rate)}/s "
            f"({e.dtype} products, measured here)")


def span(e: Expectation) -> str:
    """The time in words: "about 40 s-2 min"; never "about 0 s" as a bound, since a
    sub-second end reads as "under a second"."""
    from ..units import format_seconds

    low, high = format_seconds(e.low_seconds), format_seconds(e.high_seconds)
    if e.high_seconds < 1:
        return "under a second"
    if e.low_seconds < 1:
        return f"under a second to about {high}"
    return f"about {low}" if low == high else f"about {low}-{high}"


def too_long(e: Expectation, timeout: float, refusing: str = "refusing to measure", sliceable: bool = True) -> str | None:
    """Why the measurement would not finish within --timeout (None: it would): `refusing`
    opens the reason; `sliceable` offers --slice (probe's, not bench's sweep)."""
    import math

    from ..units import format_seconds

    if e.low_seconds <= timeout:
        return None
    slice_words = ", or --slice to measure a slice of the model (a few real-width blocks)" if sliceable else ""
    return (f"{refusing}: {words(e)} take about {format_seconds(e.low_seconds)} or more, past --timeout "
            f"{timeout:g} s; give --timeout {math.ceil(e.high_seconds * 1.2)} or more{slice_words}")
