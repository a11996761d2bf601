"""Will it fit? Estimates per method against the budget, and what to change.

Pure functions over Machine, ModelInfo and TrainingConfig: they return data and
never print.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import MlxfitError
from ..machine import Machine
from ..model.resolve import ModelInfo, original_weights
from ..model.training import TrainingConfig
from ..units import GB, format_count, format_gb
from . import remedies
from .detailed import Breakdown
from .rule import RULES, rule_bytes
# Sizing lives below the plan and its remedies; re-exported for the callers of plan.
from .sizing import FULL_ON_QUANTIZED, CALIBRATION_PART, catalog_model, catalog_sizes, judged, predict, training_for  # noqa: F401
from .uncertainty import predicted_range, range_basis
from .unverified import spanned_range
from .verdict import Verdict, judge

METHODS = ("lora", "qlora", "full")
TABLE_SIZES_B = (0.5, 1.5, 3, 7, 8, 14, 32, 70)


def rule_range(need_bytes: int) -> tuple[int, int]:
    """The rule of thumb's range: its figure against the public Mac runs (no backend)."""
    return predicted_range(need_bytes, "rule", basis="rule")


@dataclass(frozen=True)
class Estimate:
    """One method's need: the detailed breakdown where the architecture is known,
    else the rule of thumb. The verdict follows the detailed figure when there is one."""

    method: str
    rule_bytes: int
    usable_bytes: int
    selected: bool = False
    detailed: Breakdown | None = None
    # Why mlx-lm itself cannot run this method on this model (quantize, LoRA, freeze):
    # the row says so and sizes nothing; the other rows stand.
    cannot: str | None = None
    # What the row sizes where it is not the model as given: full fine-tuning of a
    # quantized base is sized on its original weights (sizing.FULL_ON_QUANTIZED).
    sized_on: str | None = None

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
            return spanned_range(self.predicted_bytes, self.detailed, self.detailed.backend, self.detailed.features.get("range_kind"))
        return rule_range(self.predicted_bytes)

    @property
    def unverified(self) -> tuple:
        """What the estimate counts that no measurement on its backend has verified; its range
        spans each one's presence and absence (mlxfit/estimate/unverified.py)."""
        return self.detailed.features.get("unverified", ()) if self.detailed else ()

    @property
    def verdict(self) -> Verdict:
        """The range this row shows, judged (the rule of thumb's too)."""
        if self.cannot:
            return Verdict.CANNOT
        return judge(*self.predicted_range_bytes, self.usable_bytes)

    @property
    def fits(self) -> bool:
        """A promise: the high end of the range is within the budget."""
        return self.verdict.fits

    @property
    def basis(self) -> str:
        """rule; approximate (block kinds the fitted terms never saw); detailed; cannot."""
        if self.cannot:
            return "cannot"
        if self.detailed is None:
            return "rule"
        return "approximate" if self.detailed.features.get("unmeasured_kinds") else "detailed"

    def to_dict(self) -> dict:
        data = {
            "method": self.method,
            "rule_bytes": self.rule_bytes,
            "fits": self.fits,
            "verdict": self.verdict.value,
            "headroom_bytes": self.headroom_bytes,
            "selected": self.selected,
            "predicted_peak_bytes": self.predicted_bytes,
            "predicted_range_bytes": list(self.predicted_range_bytes),
            "range_basis": range_basis(self.detailed.backend if self.detailed else "rule"),
            "basis": self.basis,
        }
        if self.unverified:
            data["range_spans"] = [u.to_dict() for u in self.unverified]
        if self.cannot:
            data["cannot"] = self.cannot
        if self.sized_on:
            data["sized_on"] = self.sized_on
        if self.detailed:
            data.update(self.detailed.to_dict())  # breakdown, backend, peak_phase
        return data


@dataclass(frozen=True)
class Remedy:
    """One change on its own, with the new prediction (None: the rule cannot tell)."""

    change: str
    why: str
    new_bytes: int | None = None
    verdict: Verdict | None = None  # where sized
    option: object = field(default=None, repr=False, compare=False)  # remedies.Option: the run it makes, where sized
    run_seconds: float | None = None  # the whole run's time, where a speed is known (plan_time.py)
    iters: int | None = None  # the iterations timed

    @property
    def fits(self) -> bool | None:
        return None if self.verdict is None else self.verdict.fits

    def to_dict(self) -> dict:
        return {"change": self.change, "why": self.why, "new_bytes": self.new_bytes, "fits": self.fits,
                "verdict": None if self.verdict is None else self.verdict.value,
                "run_seconds": None if self.run_seconds is None else round(self.run_seconds, 1),
                "iters": self.iters}


@dataclass(frozen=True)
class Reference:
    """A catalog model of about a bare size's parameters, by the detailed estimate:
    what the rule of thumb stands beside."""

    model: ModelInfo
    training: TrainingConfig
    backend: str
    estimates: dict  # method -> predicted peak bytes
    breakdowns: dict = field(default_factory=dict)  # method -> its Breakdown (what its range spans)

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


def nearest_catalog_model(params: int) -> ModelInfo | None:
    """The dense catalog model whose size is nearest (by ratio) to `params`."""
    import math

    dense = [m for m in catalog_sizes() if not m.moe]
    if not dense or params <= 0:
        return None
    return catalog_model(min(dense, key=lambda m: abs(math.log(m.params / params))).id)


# What stands for a size (a row of `fits`, a bare size such as 7B): the model a user most
# likely means by it. Qwen2.5 and Llama 3 are the catalog's families with a model at most
# sizes (0.5B to 72B); another family only where neither has one within STAND_IN_WITHIN.
STAND_IN_FAMILIES = ("Qwen2.5", "Llama 3.1", "Llama 3.2", "Llama 3.3")
STAND_IN_WITHIN = 1.5
STAND_IN_RULE = "Qwen2.5 or Llama 3 nearest in size (another family where neither is within 1.5×)"


def stand_in(params: int) -> ModelInfo | None:
    """The catalog model that stands for a size, by STAND_IN_FAMILIES, else the nearest."""
    import math

    if params <= 0:
        return None
    mainstream = [m for m in catalog_sizes() if m.family in STAND_IN_FAMILIES and not m.moe]
    near = min(mainstream, key=lambda m: abs(math.log(m.params / params)), default=None)
    if near is not None and 1 / STAND_IN_WITHIN <= near.params / params <= STAND_IN_WITHIN:
        return catalog_model(near.id)
    return nearest_catalog_model(params)


def reference_for(params: int, training: TrainingConfig, backend: str) -> Reference | None:
    """The detailed estimate of the model that stands for this size at these settings."""
    model = stand_in(params)
    if model is None:
        return None
    if training.num_layers != -1 and training.num_layers > model.architecture.num_layers:
        training = replace(training, num_layers=-1)
    predicted = {m: predict(model, training_for(m, training), backend) for m in METHODS}
    return Reference(model, training, backend, {m: p[0] for m, p in predicted.items()},
                     {m: p[1] for m, p in predicted.items()})


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
    run_seconds: float | None = None  # the run as given, where a speed is known (plan_time.py)
    run_iters: int | None = None  # and the iterations it was timed for

    @property
    def selected(self) -> Estimate:
        return next(e for e in self.estimates if e.selected)

    @property
    def batch_width(self) -> int:
        """The width the estimates are for: the data's widest batch (mlx-lm truncates it to
        --max-seq-length), or --max-seq-length without data."""
        return min(self.length, self.training.max_seq_length) if self.length else self.training.max_seq_length

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


def rule_remedies(machine: Machine, model: ModelInfo, training: TrainingConfig) -> tuple[Remedy, ...]:
    """Without an architecture only the rule of thumb speaks: it sizes the method
    and the model, not lengths, batches or checkpointing."""
    method, usable = training.method, machine.usable_bytes
    found = []
    if method != "qlora":
        need = rule_bytes("qlora", model.params)
        # With both flags the change pastes onto --method full and --fine-tune-type full alike.
        flags = "--method qlora --fine-tune-type lora" if method == "full" else "--method qlora"
        found.append(Remedy(flags, "by the rule of thumb: the 4-bit base takes about a quarter of a 16-bit one", need,
                            judge(*rule_range(need), usable)))
    if method == "full":
        need = rule_bytes("lora", model.params)
        found.append(Remedy("--method lora --fine-tune-type lora", "by the rule of thumb: LoRA instead of full fine-tuning",
                            need, judge(*rule_range(need), usable)))
    largest = largest_fitting_params(method, usable)
    if largest > 0:
        found.append(Remedy(f"a model of at most {format_count(largest)} parameters",
                            f"by the rule of thumb, the largest that fits {format_gb(usable)} with {method}",
                            rule_bytes(method, largest), judge(*rule_range(rule_bytes(method, largest)), usable)))
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
        try:
            _, breakdown = predict(model, run, backend, calibration, length, runtime)
            cannot = None
        except MlxfitError as e:  # mlx-lm cannot quantize, adapt or freeze this model
            breakdown, cannot = None, str(e)
        sized_on = None
        if method == "full" and model.quantized and breakdown is not None:
            original = original_weights(model)
            sized_on = f"the original {original.dtype} weights, not the {model.bits}-bit base: {FULL_ON_QUANTIZED}"
        estimates.append(Estimate(method, rule_bytes(method, model.params), machine.usable_bytes,
                                  selected=(method == training.method), detailed=breakdown, cannot=cannot,
                                  sized_on=sized_on))
    reference = reference_for(model.params, training, backend) if model.architecture is None else None
    plan = Plan(machine, model, training, tuple(estimates), backend=backend, calibration=calibration, length=length,
                reference=reference)
    if not plan.selected.fits:
        if model.architecture is None and plan.selected.cannot is None:
            plan = replace(plan, remedies=rule_remedies(machine, model, training))
        else:
            singles = remedies.single_changes(machine, model, training, backend, calibration, length, data)
            plan = replace(
                plan,
                remedies=tuple(Remedy(o.flags, o.changes[-1].costs, o.new_bytes, o.verdict, option=o) for o in singles),
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
        catalog model of that size where there is one, judged on the range of its kind of
        run as probe's row of that run is, else the rule of thumb. The verdict is a
        Verdict (to_dict gives its words)."""
        ref = dict(self.references).get(size)
        usable = self.machine.usable_bytes
        if ref is not None:
            need = ref.estimates[method]
            return {"basis": "detailed", "model": ref.model.id, "bytes": need,
                    "verdict": judged(need, training_for(method, ref.training), ref.backend, usable,
                                      ref.breakdowns.get(method))}
        rule = next(e for e in dict(self.rows)[size] if e.method == method)
        return {"basis": "rule", "model": None, "bytes": rule.rule_bytes, "verdict": rule.verdict}

    def to_dict(self) -> dict:
        refs = dict(self.references)
        return {
            "machine": self.machine.to_dict(),
            # "answer" is the table; "estimates" the rule of thumb beside it, for a model of that size
            "basis": {"answer": "detailed: the catalog model of each size (the rule of thumb where there is none)",
                      "estimates": "rule: the rule of thumb for a model of that size"},
            "rows": [
                {"params": int(size * 1e9), "estimates": [e.to_dict() for e in estimates],
                 "reference": refs[size].to_dict() if size in refs else None,
                 "answer": {m: _words(self.cell(size, m)) for m in METHODS}}
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


def _words(cell: dict) -> dict:
    return {**cell, "verdict": cell["verdict"].value}
