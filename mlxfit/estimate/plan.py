"""Will it fit? Estimates per method against the budget, and what to change.

Pure functions over Machine, ModelInfo and TrainingConfig: they return data and
never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..machine import Machine
from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from ..units import GB, format_count, format_gb
from .detailed import Breakdown, estimate
from .rule import RULES, rule_bytes
from .uncertainty import predicted_range, range_basis, verdict as range_verdict

TIGHT_FRACTION = 0.90  # above this share of the budget: fits, but leave margin
METHODS = ("lora", "qlora", "full")
TABLE_SIZES_B = (0.5, 1.5, 3, 7, 8, 14, 32, 70)


def verdict(need_bytes: int, usable_bytes: int) -> str:
    """The rule of thumb's verdict (SPEC §3): its figure against the budget, "tight"
    within 10% of it. Detailed estimates use their range (mlxfit/estimate/uncertainty.py)."""
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
    def predicted_range_bytes(self) -> tuple[int, int]:
        """[low, high]: how far the estimate can be off on this backend (mlxfit/estimate/uncertainty.py)."""
        if self.detailed:
            return predicted_range(self.predicted_bytes, self.detailed.backend)
        return predicted_range(self.predicted_bytes, "rule", basis="rule")

    @property
    def verdict(self) -> str:
        if not self.detailed:
            return verdict(self.predicted_bytes, self.usable_bytes)
        return range_verdict(*self.predicted_range_bytes, self.usable_bytes)

    @property
    def fits(self) -> bool:
        """A promise: the detailed estimate's high end is within the budget (the rule's
        figure for the rule of thumb)."""
        if not self.detailed:
            return self.predicted_bytes <= self.usable_bytes
        return self.verdict == "fits"

    @property
    def basis(self) -> str:
        """rule; approximate (block kinds the fitted terms never saw); detailed."""
        if self.detailed is None:
            return "rule"
        return "approximate" if self.detailed.features.get("unmeasured_kinds") else "detailed"

    def to_dict(self) -> dict:
        data = {
            "method": self.method,
            "rule_bytes": self.rule_bytes,
            "fits": self.fits,
            "verdict": self.verdict,
            "headroom_bytes": self.headroom_bytes,
            "selected": self.selected,
            "predicted_peak_bytes": self.predicted_bytes,
            "predicted_range_bytes": list(self.predicted_range_bytes),
            "range_basis": range_basis(self.detailed.backend if self.detailed else "rule"),
            "basis": self.basis,
        }
        if self.detailed:
            data.update(self.detailed.to_dict())  # breakdown, backend, peak_phase
        return data


@dataclass(frozen=True)
class Remedy:
    """One change on its own, with the new prediction (None: the rule cannot tell)."""

    change: str
    why: str
    new_bytes: int | None = None
    fits: bool | None = None
    verdict: str | None = None  # fits / tight / does not fit, where sized

    def to_dict(self) -> dict:
        return {"change": self.change, "why": self.why, "new_bytes": self.new_bytes, "fits": self.fits,
                "verdict": self.verdict}


@dataclass(frozen=True)
class Reference:
    """A catalog model of about a bare size's parameters, by the detailed estimate:
    what the rule of thumb stands beside."""

    model: ModelInfo
    training: TrainingConfig
    backend: str
    estimates: dict  # method -> predicted peak bytes

    def to_dict(self) -> dict:
        return {
            "model": self.model.id,
            "params": self.model.params,
            "backend": self.backend,
            "batch_size": self.training.batch_size,
            "max_seq_length": self.training.max_seq_length,
            "num_layers": self.training.num_layers,
            "estimates": {m: {"predicted_peak_bytes": b} for m, b in self.estimates.items()},
        }


@dataclass(frozen=True)
class CatalogSize:
    id: str
    params: int
    model_type: str
    moe: bool


@lru_cache(maxsize=1)
def catalog_sizes() -> tuple[CatalogSize, ...]:
    """Every catalog model's size, from the catalog's data (nothing built)."""
    from ..model.resolve import catalog_entries, text_config

    return tuple(
        CatalogSize(e["id"], e["params"], text_config(e["config"]).get("model_type") or e["config"]["model_type"], e["moe"])
        for e in catalog_entries()
    )


@lru_cache(maxsize=None)
def catalog_model(hub_id: str) -> ModelInfo:
    """A catalog model with its architecture, built once per process, when asked."""
    from ..model.resolve import from_catalog

    return from_catalog(hub_id)


def nearest_catalog_model(params: int) -> ModelInfo | None:
    """The dense catalog model whose size is nearest (by ratio) to `params`."""
    import math

    dense = [m for m in catalog_sizes() if not m.moe]
    if not dense or params <= 0:
        return None
    return catalog_model(min(dense, key=lambda m: abs(math.log(m.params / params))).id)


def reference_for(params: int, training: TrainingConfig, backend: str) -> Reference | None:
    """The detailed estimate of a real model of this size at these settings."""
    model = nearest_catalog_model(params)
    if model is None:
        return None
    if training.num_layers != -1 and training.num_layers > model.architecture.num_layers:
        training = replace(training, num_layers=-1)
    return Reference(model, training, backend, {
        m: predict(model, training_for(m, training), backend)[0] for m in METHODS
    })


@dataclass(frozen=True)
class Plan:
    machine: Machine
    model: ModelInfo
    training: TrainingConfig
    estimates: tuple[Estimate, ...]
    remedies: tuple[Remedy, ...] = field(default=())  # each change alone
    options: tuple = field(default=())  # mlxfit.estimate.remedies.Option: the plan, then alternatives
    backend: str = "cpu"
    calibration: object = None  # mlxfit.estimate.calibration.Calibration
    length: int | None = None  # the widest batch of the user's data
    reference: Reference | None = None  # a bare size: a catalog model of that size

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
            "plan": [o.to_dict() for o in self.options],
            "basis": "detailed" if self.model.architecture is not None else "rule",
            "reference": self.reference.to_dict() if self.reference else None,
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


def predict(model: ModelInfo, training: TrainingConfig, backend: str, calibration=None, length: int | None = None,
            runtime=None) -> tuple[int, Breakdown | None]:
    """The detailed estimate where the architecture is known, else the rule.

    `calibration` (from mlxfit.estimate.calibration) adds this machine's measured gap;
    `length` is the widest batch of the user's data (capped by max_seq_length);
    `runtime` the MLX versions' behaviour (mlxfit/runtime.py; None: installed)."""
    if model.architecture is None:
        return rule_bytes(training.method, model.params), None
    breakdown = estimate(model, training, backend, length, runtime)
    offset = calibration.offset_for(model, training, length) if calibration is not None else None
    if offset is not None:
        breakdown = breakdown.with_part(CALIBRATION_PART, offset)
    return breakdown.peak_bytes, breakdown


def rule_remedies(machine: Machine, model: ModelInfo, training: TrainingConfig) -> tuple[Remedy, ...]:
    """Without an architecture only the rule of thumb speaks: it sizes the method
    and the model, not lengths, batches or checkpointing."""
    method, usable = training.method, machine.usable_bytes
    found = []
    if method != "qlora":
        need = rule_bytes("qlora", model.params)
        # With both flags the change pastes onto --method full and --fine-tune-type full alike.
        flags = "--method qlora --fine-tune-type lora" if method == "full" else "--method qlora"
        found.append(Remedy(flags, "by the rule of thumb: the 4-bit base takes about a quarter of a 16-bit one", need, need <= usable, verdict(need, usable)))
    if method == "full":
        need = rule_bytes("lora", model.params)
        found.append(Remedy("--method lora --fine-tune-type lora", "by the rule of thumb: LoRA instead of full fine-tuning", need, need <= usable, verdict(need, usable)))
    largest = largest_fitting_params(method, usable)
    if largest > 0:
        found.append(Remedy(f"a model of at most {format_count(largest)} parameters",
                            f"by the rule of thumb, the largest that fits {format_gb(usable)} with {method}",
                            rule_bytes(method, largest), True, verdict(rule_bytes(method, largest), usable)))
    else:
        found.append(Remedy("a smaller model", f"even a tiny model does not fit {format_gb(usable)} with {method}"))
    return tuple(found)


def make_plan(machine: Machine, model: ModelInfo, training: TrainingConfig, backend: str | None = None, calibration=None,
              length: int | None = None, data=None, runtime=None) -> Plan:
    """`calibration` only makes sense for the machine it was measured on; `length`
    is the widest batch of the user's data and `data` its statistics
    (mlxfit.model.dataset.DataStats), when they are known."""
    backend = backend or machine.backend
    if model.quantized and not training.quantize and training.fine_tune_type != "full":
        training = replace(training, quantize=True)  # LoRA on a quantized base is QLoRA
    estimates = []
    for method in METHODS:
        if model.quantized and method == "lora":
            continue  # on a quantized base LoRA is QLoRA: one row, not two identical ones
        run = training if method == training.method else training_for(method, training)
        _, breakdown = predict(model, run, backend, calibration, length, runtime)
        estimates.append(Estimate(method, rule_bytes(method, model.params), machine.usable_bytes,
                                  selected=(method == training.method), detailed=breakdown))
    reference = reference_for(model.params, training, backend) if model.architecture is None else None
    plan = Plan(machine, model, training, tuple(estimates), backend=backend, calibration=calibration, length=length,
                reference=reference)
    if not plan.selected.fits:
        if model.architecture is None:
            plan = replace(plan, remedies=rule_remedies(machine, model, training))
        else:
            from . import remedies

            singles = remedies.single_changes(machine, model, training, backend, calibration, length, data)
            plan = replace(
                plan,
                remedies=tuple(Remedy(o.flags, o.changes[-1].costs, o.new_bytes, o.fits, o.verdict) for o in singles),
                options=remedies.search(machine, model, training, backend, calibration, length, data),
            )
    return plan


@dataclass(frozen=True)
class FitsTable:
    machine: Machine
    rows: tuple[tuple[float, tuple[Estimate, ...]], ...]
    references: tuple[tuple[float, Reference], ...] = ()  # size -> a catalog model, detailed

    def cell(self, size: float, method: str) -> dict:
        """What one size and method answer, on one basis: the detailed estimate of the
        catalog model of that size where there is one (its verdict by its range, as a
        probe row's), else the rule of thumb."""
        ref = dict(self.references).get(size)
        usable = self.machine.usable_bytes
        if ref is not None:
            need = ref.estimates[method]
            return {"basis": "detailed", "model": ref.model.id, "bytes": need,
                    "verdict": range_verdict(*predicted_range(need, ref.backend), usable)}
        rule = next(e for e in dict(self.rows)[size] if e.method == method)
        return {"basis": "rule", "model": None, "bytes": rule.rule_bytes, "verdict": rule.verdict}

    def to_dict(self) -> dict:
        refs = dict(self.references)
        return {
            "machine": self.machine.to_dict(),
            "basis": "rule",
            "rows": [
                {"params": int(size * 1e9), "estimates": [e.to_dict() for e in estimates],
                 "reference": refs[size].to_dict() if size in refs else None,
                 "answer": {m: self.cell(size, m) for m in METHODS}}
                for size, estimates in self.rows
            ],
        }


def fits_table(machine: Machine, sizes_b=TABLE_SIZES_B, backend: str | None = None, training: TrainingConfig | None = None) -> FitsTable:
    """The rule of thumb per size and method, each size beside a real model of
    about that size by the detailed estimate (at mlx-lm's defaults unless told)."""
    rows = tuple(
        (size, tuple(Estimate(m, rule_bytes(m, int(size * 1e9)), machine.usable_bytes) for m in METHODS))
        for size in sizes_b
    )
    training = training or TrainingConfig()
    refs = tuple((size, ref) for size in sizes_b
                 if (ref := reference_for(int(size * 1e9), training, backend or machine.backend)) is not None)
    return FitsTable(machine, rows, refs)
