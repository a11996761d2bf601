"""Will it fit? Estimates per method against the budget, and what to change.

Pure functions over Machine, ModelInfo and TrainingConfig: they return data and
never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .estimate import Breakdown, estimate
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
    """One method's need: the detailed breakdown where the architecture is known,
    else the rule of thumb. The verdict follows the detailed figure when there is one."""

    method: str
    rule_bytes: int
    usable_bytes: int
    selected: bool = False
    detailed: Breakdown | None = None

    @property
    def predicted_bytes(self) -> int:
        return self.detailed.peak_bytes if self.detailed else self.rule_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.predicted_bytes

    @property
    def verdict(self) -> str:
        return verdict(self.predicted_bytes, self.usable_bytes)

    @property
    def fits(self) -> bool:
        return self.predicted_bytes <= self.usable_bytes

    def to_dict(self) -> dict:
        data = {
            "method": self.method,
            "rule_bytes": self.rule_bytes,
            "fits": self.fits,
            "verdict": self.verdict,
            "headroom_bytes": self.headroom_bytes,
            "selected": self.selected,
            "predicted_peak_bytes": self.predicted_bytes,
            "basis": "detailed" if self.detailed else "rule",
        }
        if self.detailed:
            data.update(self.detailed.to_dict())  # breakdown, backend, peak_phase
        return data


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
    backend: str = "cpu"
    calibration: object = None  # mlxfit.calibration.Calibration
    length: int | None = None  # the widest batch of the user's data

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
            "backend": self.backend,
            "calibration": (
                {"offset_bytes": self.calibration.offset_bytes, "measurements": self.calibration.count}
                if self.calibration else None
            ),
        }


def largest_fitting_params(method: str, usable_bytes: int) -> int:
    per_billion, fixed = RULES[method]
    return max(0, int((usable_bytes / GB - fixed) / per_billion * 1e9))


def training_for(method: str, training: TrainingConfig) -> TrainingConfig:
    """The user's run, switched to another method (all other settings kept)."""
    if method == "full":
        return replace(training, fine_tune_type="full", quantize=False)
    fine_tune_type = "lora" if training.fine_tune_type == "full" else training.fine_tune_type
    return replace(training, fine_tune_type=fine_tune_type, quantize=(method == "qlora"))


CALIBRATION_PART = "calibration"


def predict(model: ModelInfo, training: TrainingConfig, backend: str, calibration=None, length: int | None = None) -> tuple[int, Breakdown | None]:
    """The detailed estimate where the architecture is known, else the rule.

    `calibration` (from mlxfit.calibration) adds this machine's measured gap;
    `length` is the widest batch of the user's data (capped by max_seq_length)."""
    if model.architecture is None:
        return rule_bytes(training.method, model.params), None
    breakdown = estimate(model, training, backend, length)
    offset = calibration.offset_for(model, training) if calibration is not None else None
    if offset is not None:
        breakdown = breakdown.with_part(CALIBRATION_PART, offset)
    return breakdown.peak_bytes, breakdown


def _halvings(value: int, floor: int) -> list[int]:
    out = []
    while value // 2 >= floor:
        value //= 2
        out.append(value)
    return out


def _first_fitting(model, training, backend, usable, candidates, calibration=None, length=None):
    """The mildest candidate change that fits, else the strongest one tried."""
    tried = None
    for change, why, new_training in candidates:
        need, _ = predict(model, new_training, backend, calibration, length)
        tried = Remedy(change, why, need, need <= usable)
        if tried.fits:
            return tried
    return tried


def remedies(machine: Machine, model: ModelInfo, training: TrainingConfig, backend: str, calibration=None, length=None) -> tuple[Remedy, ...]:
    """The source's remedies in its order (SPEC §4), then mlx-lm's own knobs, each
    with the new prediction. Without an architecture only the rule can speak."""
    method, usable = training.method, machine.usable_bytes
    detailed = model.architecture is not None
    found: list[Remedy] = []

    def need_for(new_training):
        return predict(model, new_training, backend, calibration, length)[0]

    def first_fitting(candidates):
        return _first_fitting(model, training, backend, usable, candidates, calibration, length)

    if detailed:
        found.append(first_fitting([
            (f"--max-seq-length {n}", "frees the most; first check that typical examples still fit", replace(training, max_seq_length=n))
            for n in _halvings(training.max_seq_length, 32)
        ]))
        found.append(first_fitting([
            (f"--batch-size {b} --grad-accumulation-steps {training.batch_size // b * training.grad_accumulation_steps}",
             "fewer activations at once; accumulation keeps the effective batch", replace(training, batch_size=b))
            for b in _halvings(training.batch_size, 1)
        ]))
    else:
        found.append(Remedy(f"--max-seq-length {max(training.max_seq_length // 2, 1)}",
                            "frees the most; first check that typical examples still fit (the rule cannot size this)"))
        found.append(Remedy(f"--batch-size {max(training.batch_size // 2, 1)}", "fewer activations held at once (the rule cannot size this)"))
    if method != "qlora":
        need = need_for(training_for("qlora", training))
        found.append(Remedy("--method qlora", "the 4-bit base takes about a quarter of a 16-bit one", need, need <= usable))
    if not training.grad_checkpoint:
        if detailed:
            need = need_for(replace(training, grad_checkpoint=True))
            found.append(Remedy("--grad-checkpoint", "about 20-30% slower, far less activation memory", need, need <= usable))
        else:
            found.append(Remedy("--grad-checkpoint", "about 20-30% slower, far less activation memory (the rule cannot size this)"))
    if method == "full":
        need = need_for(training_for("lora", training))
        found.append(Remedy("--fine-tune-type lora", "LoRA instead of full fine-tuning", need, need <= usable))
    largest = largest_fitting_params(method, usable)
    if largest > 0:
        found.append(Remedy(f"a model of at most {format_count(largest)} parameters",
                            f"by the rule of thumb, the largest that fits {format_gb(usable)} with {method}",
                            rule_bytes(method, largest), True))
    else:
        found.append(Remedy("a smaller model", f"even a tiny model does not fit {format_gb(usable)} with {method}"))
    if detailed:
        layers = training.layers_trained(model.architecture.num_layers)
        found.append(first_fitting([
            (f"--num-layers {n}", "train fewer of the last blocks (mlx-lm)", replace(training, num_layers=n))
            for n in _halvings(layers, 1)
        ]) or Remedy("--num-layers", "already training a single block"))
        if method != "full":
            found.append(first_fitting([
                (f"--rank {r}", "a smaller adapter (mlx-lm)", replace(training, rank=r)) for r in _halvings(training.rank, 1)
            ]) or Remedy("--rank", "already rank 1"))
    return tuple(r for r in found if r is not None)


def cheapest_fitting(plan: "Plan") -> Remedy | None:
    """The first remedy, in the source's order, that fits (a model change excluded)."""
    for r in plan.remedies:
        if r.fits and "model" not in r.change:
            return r
    return None


def make_plan(machine: Machine, model: ModelInfo, training: TrainingConfig, backend: str | None = None, calibration=None, length: int | None = None) -> Plan:
    """`calibration` only makes sense for the machine it was measured on; `length`
    is the widest batch of the user's data, when it is known."""
    backend = backend or machine.backend
    if model.quantized and not training.quantize and training.fine_tune_type != "full":
        training = replace(training, quantize=True)  # LoRA on a quantized base is QLoRA
    estimates = []
    for method in METHODS:
        run = training if method == training.method else training_for(method, training)
        _, breakdown = predict(model, run, backend, calibration, length)
        estimates.append(Estimate(method, rule_bytes(method, model.params), machine.usable_bytes,
                                  selected=(method == training.method), detailed=breakdown))
    plan = Plan(machine, model, training, tuple(estimates), backend=backend, calibration=calibration, length=length)
    if not plan.selected.fits:
        plan = replace(plan, remedies=remedies(machine, model, training, backend, calibration, length))
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
