"""How long a training step takes, by phase, and how fast the machine runs one.

A step's time is the matrix products of its phases (counted in duration.py from the
architecture: the forward pass, the attention, the backward pass, checkpointing's
second forward; a DPO step's reference forwards over chosen and rejected rows; a
GRPO step's generation, token by token) over the machine's matmul rate, plus the
rest of what the step runs (step_work.py): its elementwise passes over the
activations at the machine's elementwise rate, its exps at the machine's exp rate
where it has one, and its dispatched operations at the machine's cost per
operation; never less than the time to read the weights once at the memory
bandwidth (a small batch on a Mac waits on memory, not on arithmetic). A GRPO
step's decoding steps dispatch their operations (the KV cache's, the sampler's) at
what one costs in mlx-lm's decoding loop, the loop's own cost spread over them,
measured on this machine as a rate.

The rates are a `Speed`: on this machine, measured here (the caller measures them,
mlxfit/measure/rate.py, and passes them in: nothing here runs or times anything); on
a named Mac its matrix-product rate (its GPU cores at the rate a core of its
generation was measured to reach) and bandwidth from mlxfit/data/apple_chips.json,
with two figures fitted on public mlx-lm logs: the share of that rate a training
step's products reach and the cost of one Metal operation
(benchmarks/chip_efficiency.py writes them, with the error on the runs the fit did
not see, which is the range). Pure functions: they return data and never print.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import BadInput
from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from .duration import forward_operations, phase_operations
from .step_work import (ADAPTER_FORWARD_OPS, FLOAT32_BYTES, OPTIMIZER_OPS, Work, activation_bytes, adapted_layers,
                        decode_ops, forward_work, step_work, trainable_arrays)

MEASURED_BASIS = "rates measured on this machine"
# The spread of measured over predicted step time on this machine (a factor on the
# predicted seconds): 3.3 above, the highest of the blind set of seed 1796504337 (a busy machine,
# benchmarks/results/step_time.md); 0.8 below, under the lowest of any blind set since (0.83 and
# 0.85, seeds 1796595979 and 1796596637, bfloat16 SFT steps faster than their rates predict), which
# 0.9 did not hold. Set after those sets were read: a later set judges it.
MEASURED_RANGE = (0.8, 3.3)


@dataclass(frozen=True)
class Chip:
    name: str
    gpu_cores: int
    gemm_operations: float  # per second: its cores at their generation's measured matrix-product rate
    bandwidth: float  # bytes per second
    memory_gb: tuple[int, ...]
    sources: tuple[str, ...]


@lru_cache(maxsize=1)
def chip_table() -> dict:
    from .. import data_text

    return json.loads(data_text("apple_chips.json"))


def generation(name: str) -> str:
    """"M3 Max" -> "M3": the generation whose GPU core the chip has."""
    return name.split()[0]


def chips() -> list[Chip]:
    table = chip_table()
    per_core = table["gemm_per_core"]
    return [Chip(r["chip"], r["gpu_cores"], r["gpu_cores"] * per_core[generation(r["chip"])]["tflops_per_core"] * 1e12,
                 r["bandwidth_gb_s"] * 1e9, tuple(r["memory_gb"]), tuple(r["source"])) for r in table["chips"]]


def _key(name: str) -> str:
    return "".join(name.lower().replace("apple", "").split())


def find_chip(name: str) -> Chip:
    """The chip named ("M3 Max", "m3max", "Apple M3 Max"); BadInput naming the known ones if none."""
    for c in chips():
        if _key(c.name) == _key(name):
            return c
    raise BadInput(f"unknown chip {name!r}: use one of {', '.join(c.name for c in chips())}")


def chip_for_memory(total_bytes: int) -> Chip | None:
    """The one chip Apple sold with this much memory (192 GB: M2 Ultra), or None
    where several were (or none)."""
    gb = round(total_bytes / 10**9)
    gib = round(total_bytes / 2**30)
    found = [c for c in chips() if gb in c.memory_gb or gib in c.memory_gb]
    return found[0] if len(found) == 1 else None


@dataclass(frozen=True)
class Speed:
    """How fast a machine runs a step's work."""

    operations_per_second: float  # matrix products
    bytes_per_second: float | None  # elementwise traffic, and the floor of reading the weights; None: neither
    basis: str  # "rates measured on this machine" | "M3 Max, fitted efficiency"
    range: tuple[float, float]  # measured over predicted seconds, lowest and highest expected
    chip: str | None = None
    transcendentals_per_second: float | None = None  # exps apart from the traffic; None: in it
    softmax_per_second: float | None = None  # the attention's scores (a precise softmax); None: as other exps
    roots_per_second: float | None = None  # the optimizer's square roots apart from the traffic; None: in it
    loss_per_second: float | None = None  # logits through the training loss, whole; None: its exps and passes counted
    seconds_per_op: float = 0.0  # dispatching one operation
    decode_op_seconds: float = 0.0  # an operation of mlx-lm's decoding loop (0: as seconds_per_op)
    correction: dict | None = None  # the stored measurement that scaled the rates (calibration.py), if any

    def to_dict(self) -> dict:
        return {"operations_per_second": self.operations_per_second, "bytes_per_second": self.bytes_per_second,
                "transcendentals_per_second": self.transcendentals_per_second,
                "softmax_per_second": self.softmax_per_second, "roots_per_second": self.roots_per_second,
                "loss_per_second": self.loss_per_second,
                "seconds_per_op": self.seconds_per_op, "decode_op_seconds": self.decode_op_seconds,
                "basis": self.basis, "chip": self.chip,
                **({"corrected_by": self.correction} if self.correction else {})}


def corrected(speed: Speed, factor: float, measurement: dict) -> Speed:
    """`speed` slowed by `factor` (measured over predicted seconds of a step measured here):
    every rate divided by it, so every step's time is `factor` times the rates' estimate."""
    def slower(rate):
        return None if rate is None else rate / factor

    return replace(speed, operations_per_second=speed.operations_per_second / factor,
                   bytes_per_second=slower(speed.bytes_per_second),
                   transcendentals_per_second=slower(speed.transcendentals_per_second),
                   softmax_per_second=slower(speed.softmax_per_second), roots_per_second=slower(speed.roots_per_second),
                   loss_per_second=slower(speed.loss_per_second),
                   seconds_per_op=speed.seconds_per_op * factor, decode_op_seconds=speed.decode_op_seconds * factor,
                   correction={**measurement, "factor": round(factor, 3)})


def measured_speed(rates) -> Speed:
    """This machine, at the rates the caller measured here (measure/rate.py MachineRates)."""
    return Speed(rates.matmul, rates.elementwise, MEASURED_BASIS, MEASURED_RANGE,
                 transcendentals_per_second=rates.transcendental, seconds_per_op=rates.operation,
                 softmax_per_second=rates.softmax, roots_per_second=rates.root, loss_per_second=rates.loss,
                 decode_op_seconds=rates.decode_op or 0.0)


def fitted_efficiency() -> dict:
    """The efficiency fitted on public logs, with its held-out range (apple_chips.json)."""
    fit = chip_table()["efficiency"]
    if not fit.get("fitted"):
        raise BadInput("no efficiency has been fitted for Apple chips (run benchmarks/chip_efficiency.py)")
    return fit


def chip_speed(chip: Chip) -> Speed:
    """A named Mac: its matrix-product rate at the fitted efficiency, its bandwidth as the floor."""
    fit = fitted_efficiency()
    return Speed(chip.gemm_operations * fit["fitted"], chip.bandwidth, f"{chip.name}, fitted efficiency",
                 tuple(fit["range"]), chip=chip.name, seconds_per_op=fit.get("seconds_per_op", 0.0))


@dataclass(frozen=True)
class StepTime:
    """One step: seconds per phase at the speed's rate, and the floor of reading the weights."""

    phases: dict  # phase -> seconds
    operations: int
    floor: float  # seconds to read the weights once at the bandwidth (0: no bandwidth known)

    @property
    def seconds(self) -> float:
        return max(sum(self.phases.values()), self.floor)

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 4), "phases": {k: round(v, 4) for k, v in self.phases.items() if v},
                "operations": self.operations, "memory_floor_seconds": round(self.floor, 4)}


def _floor(model: ModelInfo, training: TrainingConfig, speed: Speed) -> float:
    from .detailed import counted_totals

    if not speed.bytes_per_second:
        return 0.0
    return counted_totals(model, training)[0] / speed.bytes_per_second


def elementwise_seconds(work: Work, speed: Speed) -> float:
    """The passes over the activations at the elementwise rate, and the exps at theirs
    (the attention's at the softmax's where the machine has that rate); the loss's logits
    at the loss's rate where the machine has one, its counted passes and exps left out."""
    seconds = 0.0
    if speed.loss_per_second and work.loss_logits:
        seconds += work.loss_logits / speed.loss_per_second
        work = work.loss_apart()
    if speed.bytes_per_second:
        seconds += work.traffic_bytes / speed.bytes_per_second
    if speed.transcendentals_per_second:
        scores = work.scores if speed.softmax_per_second else 0
        seconds += (work.transcendentals - scores) / speed.transcendentals_per_second
        if scores:
            seconds += scores / speed.softmax_per_second
    if speed.roots_per_second:
        seconds += work.roots / speed.roots_per_second
    return seconds


def _with_work(phases: dict, work: Work, speed: Speed) -> dict:
    return {**phases, "elementwise": elementwise_seconds(work, speed), "dispatch": work.ops * speed.seconds_per_op}


def step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, length: int | None = None) -> StepTime:
    """An SFT step (mlx_lm.lora) whose batch is `length` tokens wide (default max_seq_length)."""
    ops = phase_operations(model, training, length)
    rate = speed.operations_per_second
    phases = _with_work({k: v / rate for k, v in ops.items()}, step_work(model, training, length), speed)
    return StepTime(phases, sum(ops.values()), _floor(model, training, speed))


def _own_loss(work: Work) -> Work:
    """mlx-lm-lora's losses are its own (DPO's and CPO's cross-entropy over logits cast to
    float32, GRPO's compiled log-probabilities), not the mlx-lm default_loss that the loss
    rate times: their passes and exps stay counted."""
    return replace(work, loss_logits=0)


def _pair_loss(work: Work, model: ModelInfo) -> Work:
    """DPO's, CPO's and ORPO's log-probabilities are nn.losses.cross_entropy, default_loss's,
    over logits cast to float32 (ORPO's uncast): in a float32 model the same work the loss
    rate times; in half precision the cast and float32 logits are their own, counted."""
    return work if activation_bytes(model) == FLOAT32_BYTES else _own_loss(work)


def dpo_step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, length: int | None = None,
                  reference: bool = True) -> StepTime:
    """A DPO (or CPO/ORPO) step: the policy's forward and backward over the chosen and
    the rejected rows (2 x batch), and for DPO (`reference`) the reference model's
    forward of both."""
    rows = 2 * training.batch_size // training.hosts
    policy = phase_operations(model, training, length, sequences=rows)
    width = training.batch_width(length)
    rate = speed.operations_per_second
    phases = _with_work({k: v / rate for k, v in policy.items()},
                        _pair_loss(step_work(model, training, length, sequences=rows), model), speed)
    if not reference:
        return StepTime(phases, sum(policy.values()), _floor(model, training, speed))
    reference_ops = forward_operations(model, max(width - 1, 1), rows)
    phases["reference"] = reference_ops / rate
    ref_work = forward_work(model, max(width - 1, 1), rows)
    phases["elementwise"] += elementwise_seconds(ref_work, speed)
    phases["dispatch"] += ref_work.ops * speed.seconds_per_op
    floor = 2 * _floor(model, training, speed)  # the policy's and the reference's weights
    return StepTime(phases, sum(policy.values()) + reference_ops, floor)


def _forward_seconds(model: ModelInfo, length: int, rows: int, speed: Speed, calls: int = 1) -> float:
    """A forward of `rows` rows, `length` tokens wide, in `calls` separate calls (each dispatching its operations)."""
    work = forward_work(model, length, rows)
    return (forward_operations(model, length, rows) / speed.operations_per_second + elementwise_seconds(work, speed)
            + calls * work.ops * speed.seconds_per_op)


def decode_work_seconds(model: ModelInfo, speed: Speed, rows: int = 1) -> float:
    """One decoding step's products and passes: a forward of `rows` rows one token wide."""
    return forward_operations(model, 1, rows) / speed.operations_per_second + elementwise_seconds(
        forward_work(model, 1, rows), speed)


def decode_step_seconds(model: ModelInfo, training: TrainingConfig, speed: Speed, rows: int) -> float:
    """One decoding step of GRPO's rollout: its products and passes, and its operations
    (step_work.decode_ops: mlx-lm's decoding step, its KV cache and sampler included;
    the LoRA adapters' forward besides) at what one costs in mlx-lm's decoding loop;
    never faster than reading the weights."""
    ops = decode_ops(model) + len(adapted_layers(model, training)) * ADAPTER_FORWARD_OPS
    per_op = speed.decode_op_seconds or speed.seconds_per_op
    return max(decode_work_seconds(model, speed, rows) + ops * per_op, _floor(model, training, speed))


def rollout_rounds(training: TrainingConfig, group_size: int, completion_length: int) -> tuple[int, int]:
    """(decoding steps, rows each) of a GRPO step's generation. mlx-lm-lora's
    generate_grpo hands its batch_size x group_size completions to mlx-lm's
    BatchGenerator with completion_batch_size=batch_size: at most batch_size rows
    decode at once, so the completions run in group_size rounds of
    completion_length tokens each (every completion runs to the end here: no stop
    token is counted on), and each round one step more: mlx-lm's GenerationBatch
    runs a step as it starts, each later step returning the token the one before
    sampled, so a round's last step samples a token never returned."""
    return group_size * (completion_length + 1), max(training.batch_size // training.hosts, 1)


# mlx_lm_lora grpo_trainer._grpo_microbatches: each microbatch's gradients are scaled and
# added to the sum (tree_map twice over the trainable arrays).
ACCUMULATE_OPS = 2


def grpo_step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, prompt_length: int,
                   group_size: int, completion_length: int) -> StepTime:
    """A GRPO step: the completions generated token by token, batch_size rows at a time
    (rollout_rounds, decode_step_seconds), each prompt's prefill once (its cache is
    shared by its group), then the reference's forward and the policy's forward and
    backward over prompt and completion, in group_size microbatches of batch_size
    rows (mlx_lm_lora train_grpo: chunk_size max(len(prompt_tokens), 1)), each
    dispatching its operations; the optimizer's update once."""
    rows = training.batch_size // training.hosts * group_size
    width = prompt_length + completion_length
    rate = speed.operations_per_second
    steps, decoding = rollout_rounds(training, group_size, completion_length)
    read = _floor(model, training, speed)
    generation = steps * decode_step_seconds(model, training, speed, decoding)
    generation += _forward_seconds(model, prompt_length, decoding, speed)  # the prompts' prefill
    policy_training = replace(training, max_seq_length=max(training.max_seq_length, width))
    policy = phase_operations(model, policy_training, width, sequences=rows)
    chunks = -(-rows // decoding)
    phases = {"generation": generation, "reference": _forward_seconds(model, width, rows, speed, calls=chunks)}
    work = _own_loss(step_work(model, policy_training, width, sequences=rows))
    phases.update(_with_work({k: v / rate for k, v in policy.items()}, work, speed))
    arrays = trainable_arrays(model, policy_training)
    microbatched = work.ops - arrays * OPTIMIZER_OPS
    phases["dispatch"] += ((chunks - 1) * microbatched + chunks * arrays * ACCUMULATE_OPS) * speed.seconds_per_op
    ops = (sum(policy.values()) + forward_operations(model, width, rows) + forward_operations(model, 1, decoding) * steps
           + forward_operations(model, prompt_length, decoding))
    return StepTime(phases, ops, 2 * read)


def evaluation_seconds(model: ModelInfo, training: TrainingConfig, speed: Speed, width: int) -> float:
    """One validation batch: a forward pass of batch_size rows `width` tokens wide."""
    rows = training.batch_size // training.hosts
    return max(_forward_seconds(model, max(min(width, training.max_seq_length) - 1, 1), rows, speed),
               _floor(model, training, speed))


def preference_step_time(run, model: ModelInfo, speed: Speed, length: int | None = None,
                         prompt_length: int | None = None) -> StepTime:
    """A step of an mlx_lm_lora.train run (model/preference.py PreferenceRun): DPO's policy
    over chosen and rejected rows and its reference's forwards, CPO's and ORPO's policy
    alone, GRPO's generation of group_size completions token by token, the reference's
    forward and the policy's step. `length`: the widest pair (DPO, CPO, ORPO);
    `prompt_length`: GRPO's longest prompt (default: max_seq_length)."""
    if run.spec.rollout:
        prompt = min(prompt_length or run.training.max_seq_length, run.training.max_seq_length)
        return grpo_step_time(model, run.training, speed, prompt, run.group_size, run.max_completion_length)
    return dpo_step_time(model, run.training, speed, length, reference=run.has_reference)
