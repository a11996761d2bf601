"""How long a training step takes, by phase, and how fast the machine runs one.

A step's time is the operations of its phases (counted in duration.py from the
architecture: the forward pass, the attention, the backward pass, checkpointing's
second forward; a DPO step's reference forwards over chosen and rejected rows; a
GRPO step's generation, token by token) over the machine's operation rate, and
never less than the time to read the weights once at the machine's memory
bandwidth (a small batch on a Mac waits on memory, not on arithmetic).

The rate is a `Speed`: on this machine the matmul rate measured here (the caller
measures it, mlxfit/measure/rate.py, and passes it in: nothing here runs or times
anything); on a named Mac its peak half-precision rate and bandwidth from
mlxfit/data/apple_chips.json, at the efficiency fitted on public mlx-lm logs
(benchmarks/chip_efficiency.py writes it, with its error on the runs the fit did
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

MEASURED_BASIS = "measured matmul rate on this machine"
# The spread of measured over predicted step time on this machine, from
# benchmarks/results/step_time.md (a factor on the predicted seconds): tiny models run
# far slower than their matrix products, which are all that is counted yet.
MEASURED_RANGE = (1.5, 30.0)


@dataclass(frozen=True)
class Chip:
    name: str
    gpu_cores: int
    peak_operations: float  # per second, half precision
    bandwidth: float  # bytes per second
    memory_gb: tuple[int, ...]
    sources: tuple[str, ...]


@lru_cache(maxsize=1)
def chip_table() -> dict:
    from .. import data_text

    return json.loads(data_text("apple_chips.json"))


def chips() -> list[Chip]:
    rows = chip_table()["chips"]
    return [Chip(r["chip"], r["gpu_cores"], r["peak_fp16_tflops"] * 1e12, r["bandwidth_gb_s"] * 1e9,
                 tuple(r["memory_gb"]), tuple(r["source"])) for r in rows]


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

    operations_per_second: float
    bytes_per_second: float | None  # memory bandwidth; None: no floor
    basis: str  # "measured matmul rate on this machine" | "M3 Max, fitted efficiency"
    range: tuple[float, float]  # measured over predicted seconds, lowest and highest expected
    chip: str | None = None

    def to_dict(self) -> dict:
        return {"operations_per_second": self.operations_per_second, "bytes_per_second": self.bytes_per_second,
                "basis": self.basis, "chip": self.chip}


def measured_speed(rate: float) -> Speed:
    """This machine, at the matmul rate the caller measured here."""
    return Speed(rate, None, MEASURED_BASIS, MEASURED_RANGE)


def fitted_efficiency() -> dict:
    """The efficiency fitted on public logs, with its held-out range (apple_chips.json)."""
    fit = chip_table()["efficiency"]
    if not fit.get("fitted"):
        raise BadInput("no efficiency has been fitted for Apple chips (run benchmarks/chip_efficiency.py)")
    return fit


def chip_speed(chip: Chip) -> Speed:
    """A named Mac: its peak at the fitted efficiency, its bandwidth as the floor."""
    fit = fitted_efficiency()
    return Speed(chip.peak_operations * fit["fitted"], chip.bandwidth, f"{chip.name}, fitted efficiency",
                 tuple(fit["range"]), chip=chip.name)


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


def step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, length: int | None = None) -> StepTime:
    """An SFT step (mlx_lm.lora) whose batch is `length` tokens wide (default max_seq_length)."""
    ops = phase_operations(model, training, length)
    rate = speed.operations_per_second
    return StepTime({k: v / rate for k, v in ops.items()}, sum(ops.values()), _floor(model, training, speed))


def dpo_step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, length: int | None = None) -> StepTime:
    """A DPO (or CPO/ORPO) step: the policy's forward and backward over the chosen and
    the rejected rows (2 x batch), and for DPO the reference model's forward of both."""
    rows = 2 * training.batch_size // training.hosts
    policy = phase_operations(model, training, length, sequences=rows)
    width = min(length or training.max_seq_length, training.max_seq_length)
    reference = forward_operations(model, max(width - 1, 1), rows)
    rate = speed.operations_per_second
    phases = {k: v / rate for k, v in policy.items()}
    phases["reference"] = reference / rate
    floor = 2 * _floor(model, training, speed)  # the policy's and the reference's weights
    return StepTime(phases, sum(policy.values()) + reference, floor)


def grpo_step_time(model: ModelInfo, training: TrainingConfig, speed: Speed, prompt_length: int,
                   group_size: int, completion_length: int) -> StepTime:
    """A GRPO step: group_size completions per prompt generated token by token (each
    token a forward of every row, and a read of the weights), then the reference's
    forward and the policy's forward and backward over prompt and completion."""
    rows = training.batch_size // training.hosts * group_size
    width = prompt_length + completion_length
    rate = speed.operations_per_second
    per_token = forward_operations(model, 1, rows) / rate
    read = _floor(model, training, speed)
    generation = completion_length * max(per_token, read)
    generation += forward_operations(model, prompt_length, rows) / rate  # the prompts' prefill
    policy = phase_operations(model, replace(training, max_seq_length=max(training.max_seq_length, width)), width,
                              sequences=rows)
    reference = forward_operations(model, width, rows)
    phases = {"generation": generation, "reference": reference / rate}
    phases.update({k: v / rate for k, v in policy.items()})
    ops = sum(policy.values()) + reference + forward_operations(model, 1, rows) * completion_length
    return StepTime(phases, ops, 2 * read)


def evaluation_seconds(model: ModelInfo, training: TrainingConfig, speed: Speed, width: int) -> float:
    """One validation batch: a forward pass of batch_size rows `width` tokens wide."""
    rows = training.batch_size // training.hosts
    ops = forward_operations(model, max(min(width, training.max_seq_length) - 1, 1), rows)
    return max(ops / speed.operations_per_second, _floor(model, training, speed))
