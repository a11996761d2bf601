"""Will it fit? Estimates per method against the budget, and what to change.

Pure functions over Machine, ModelInfo and TrainingConfig: they return data and
never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .machine import Machine
from .model import ModelInfo
from .rule import RULES, rule_bytes
from .training import TrainingConfig
from .units import GB, format_count, format_gb

TIGHT_FRACTION = 0.90  # above this share of the budget: fits, but leave margin
METHODS = ("lora", "qlora", "full")
TABLE_SIZES_B = (0.5, 1.5, 3, 7, 8, 14, 32, 70)


def verdict(need_bytes: int, usable_bytes: int) -> str:
    if need_bytes > usable_bytes:
        return "does not fit"
    if need_bytes > TIGHT_FRACTION * usable_bytes:
        return "tight"
    return "fits"


@dataclass(frozen=True)
class Estimate:
    method: str
    rule_bytes: int
    usable_bytes: int
    selected: bool = False

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.rule_bytes

    @property
    def verdict(self) -> str:
        return verdict(self.rule_bytes, self.usable_bytes)

    @property
    def fits(self) -> bool:
        return self.rule_bytes <= self.usable_bytes

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "rule_bytes": self.rule_bytes,
            "fits": self.fits,
            "verdict": self.verdict,
            "headroom_bytes": self.headroom_bytes,
            "selected": self.selected,
        }


@dataclass(frozen=True)
class Remedy:
    """One change from the source's list (SPEC §4), in its order."""

    change: str
    why: str
    new_bytes: int | None = None  # None: the rule of thumb cannot tell
    fits: bool | None = None

    def to_dict(self) -> dict:
        return {"change": self.change, "why": self.why, "new_bytes": self.new_bytes, "fits": self.fits}


@dataclass(frozen=True)
class Plan:
    machine: Machine
    model: ModelInfo
    training: TrainingConfig
    estimates: tuple[Estimate, ...]
    remedies: tuple[Remedy, ...] = field(default=())

    @property
    def selected(self) -> Estimate:
        return next(e for e in self.estimates if e.selected)

    def to_dict(self) -> dict:
        return {
            "machine": self.machine.to_dict(),
            "model": self.model.to_dict(),
            "training": self.training.to_dict(),
            "estimates": [e.to_dict() for e in self.estimates],
            "remedies": [r.to_dict() for r in self.remedies],
        }


def largest_fitting_params(method: str, usable_bytes: int) -> int:
    per_billion, fixed = RULES[method]
    return max(0, int((usable_bytes / GB - fixed) / per_billion * 1e9))


def remedies(machine: Machine, model: ModelInfo, training: TrainingConfig) -> tuple[Remedy, ...]:
    """The source's remedies in its order, with the rule's number where it has one."""
    method = training.method
    usable = machine.usable_bytes
    found = [
        Remedy(
            f"--max-seq-length {max(training.max_seq_length // 2, 1)}",
            "frees the most; first check that typical examples still fit "
            "(the rule's fixed part assumes moderate lengths, so it cannot size this)",
        ),
        Remedy(
            f"--batch-size {max(training.batch_size // 2, 1)}",
            "fewer activations held at once (not sized by the rule)",
        ),
    ]
    if method != "qlora":
        need = rule_bytes("qlora", model.params)
        found.append(
            Remedy("--method qlora", "the 4-bit base takes about a quarter of a 16-bit one", need, need <= usable)
        )
    if not training.grad_checkpoint:
        found.append(
            Remedy("--grad-checkpoint", "about 20-30% slower, far less activation memory (not sized by the rule)")
        )
    if method == "full":
        need = rule_bytes("lora", model.params)
        found.append(Remedy("--fine-tune-type lora", "LoRA instead of full fine-tuning", need, need <= usable))
    largest = largest_fitting_params(method, usable)
    if largest > 0:
        need = rule_bytes(method, largest)
        found.append(
            Remedy(f"a model of at most {format_count(largest)} parameters", f"largest that fits {format_gb(usable)} with {method}", need, True)
        )
    else:
        found.append(Remedy("a smaller model", f"even a tiny model does not fit {format_gb(usable)} with {method}"))
    return tuple(found)


def make_plan(machine: Machine, model: ModelInfo, training: TrainingConfig) -> Plan:
    if model.quantized and not training.quantize and training.fine_tune_type != "full":
        training = replace(training, quantize=True)  # LoRA on a quantized base is QLoRA
    estimates = tuple(
        Estimate(m, rule_bytes(m, model.params), machine.usable_bytes, selected=(m == training.method))
        for m in METHODS
    )
    plan = Plan(machine, model, training, estimates)
    if not plan.selected.fits:
        plan = replace(plan, remedies=remedies(machine, model, training))
    return plan


@dataclass(frozen=True)
class FitsTable:
    machine: Machine
    rows: tuple[tuple[float, tuple[Estimate, ...]], ...]

    def to_dict(self) -> dict:
        return {
            "machine": self.machine.to_dict(),
            "rows": [
                {"params": int(size * 1e9), "estimates": [e.to_dict() for e in estimates]}
                for size, estimates in self.rows
            ],
        }


def fits_table(machine: Machine, sizes_b=TABLE_SIZES_B) -> FitsTable:
    rows = tuple(
        (size, tuple(Estimate(m, rule_bytes(m, int(size * 1e9)), machine.usable_bytes) for m in METHODS))
        for size in sizes_b
    )
    return FitsTable(machine, rows)
