"""Measure a run by a slice of it: a few of its own blocks, at its own width.

A training step's memory is, block by block, nearly linear in the number of
trained blocks: the embedding, the final norm, the lm_head and the logits are
paid once; each trained block adds the same kept activations, adapter or weight
gradients and optimizer state; each frozen block its weights. So real steps of
the run's batch and length through the model's real embedding and head and a
few real-width blocks (one period of its block pattern, then two; and one
frozen period in front where the run has frozen blocks) give the per-block
increase, and the whole run's peak follows. Each slice is measured by the same
child process as a full measurement (mlxfit/child.py), with the model's block
list cut to its last blocks before anything is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .architecture import Architecture, Block
from .errors import MlxfitError
from .training import TrainingConfig


@dataclass(frozen=True)
class Slice:
    blocks: int  # the model's last `blocks` blocks are kept
    trained: int  # of which the last `trained` are trained

    @property
    def frozen(self) -> int:
        return self.blocks - self.trained

    def to_dict(self) -> dict:
        return {"blocks": self.blocks, "trained": self.trained}


@dataclass(frozen=True)
class SlicePlan:
    total: int  # blocks of the model
    trained: int  # blocks the run trains
    period: int  # blocks in one period of the pattern of the trained blocks
    slices: tuple[Slice, ...]

    @property
    def base(self) -> Slice:
        return self.slices[0]

    @property
    def deeper(self) -> Slice | None:
        """The slice with one more period of trained blocks, when the run has more."""
        return next((s for s in self.slices[1:] if s.frozen == 0), None)

    @property
    def with_frozen(self) -> Slice | None:
        return next((s for s in self.slices[1:] if s.frozen), None)

    def extrapolate(self, peaks: list[int]) -> int:
        """The whole run's peak from the slices' peaks (in the order of `slices`)."""
        by = dict(zip(self.slices, peaks))
        base = by[self.base]
        peak = float(base)
        if self.deeper is not None:
            per_trained = (by[self.deeper] - base) / (self.deeper.trained - self.base.trained)
            peak += (self.trained - self.base.trained) * per_trained
        frozen = self.total - self.trained
        if frozen and self.with_frozen is not None:
            per_frozen = (by[self.with_frozen] - base) / self.with_frozen.frozen
            peak += frozen * per_frozen
        return int(round(peak))

    def describe(self) -> str:
        parts = [f"{s.trained} trained" + (f" + {s.frozen} frozen" if s.frozen else "") for s in self.slices]
        return f"slices of {', '.join(parts)} of the {self.total} blocks (period {self.period})"

    def to_dict(self) -> dict:
        return {"period": self.period, "total_blocks": self.total, "trained_blocks": self.trained,
                "blocks": [s.to_dict() for s in self.slices]}


def _signature(block: Block) -> tuple:
    return (block.kind, block.heads, block.kv_heads, block.head_dim, block.qkv, block.intermediate, block.experts,
            block.experts_per_token, block.expert_intermediate, block.recurrent,
            tuple((l.path, l.in_features, l.out_features, l.bias, l.experts) for l in block.linears))


def period(blocks: tuple[Block, ...]) -> int:
    """The smallest p such that the blocks repeat every p (len(blocks) if none)."""
    sig = [_signature(b) for b in blocks]
    n = len(sig)
    for p in range(1, n + 1):
        if all(sig[i] == sig[i + p] for i in range(n - p)):
            return p
    return n


MIN_BLOCKS = 2


def plan_slices(arch: Architecture, training: TrainingConfig) -> SlicePlan:
    total = arch.num_layers
    n = training.layers_trained(total)
    trained_blocks = arch.blocks[total - n:]
    p = period(trained_blocks)
    # At least two blocks in the first slice: a one-block slice's peak moves by about
    # a megabyte from run to run on the CPU, and the extrapolation multiplies the
    # difference by the depth.
    base = p * -(-MIN_BLOCKS // p)
    slices = []
    if n >= 2 * base:
        slices += [Slice(base, base), Slice(2 * base, 2 * base)]
    else:  # the trained blocks are measured whole
        slices.append(Slice(n, n))
    first = slices[0]
    frozen = total - n
    if frozen:
        # One period of the frozen blocks in front of the first slice's trained ones.
        kf = min(period(arch.blocks[:frozen]) if frozen > 1 else 1, frozen)
        slices.append(Slice(first.blocks + kf, first.trained))
    if max(s.blocks for s in slices) >= total:
        raise MlxfitError(
            f"a slice of this run would hold all {total} blocks (its trained blocks repeat every {p}): "
            "it can only be measured whole"
        )
    return SlicePlan(total, n, p, tuple(slices))


def slice_training(training: TrainingConfig, s: Slice) -> TrainingConfig:
    return replace(training, num_layers=s.trained)


def sliced_model(model, s: Slice):
    """The ModelInfo of a slice, for estimating what measuring it needs."""
    arch = replace(model.architecture, blocks=model.architecture.blocks[-s.blocks:])
    return replace(model, architecture=arch, params=arch.params, slice_blocks=s.blocks)


def measure_by_slices(model, training: TrainingConfig, length: int | None, max_steps: int, timeout=None,
                      on_event=lambda e: None):
    """Measure each slice in its own child process; the whole run's figures are
    extrapolated (mlxfit.measure.Measurement with method "slice")."""
    from .measure import Measurement, measure, request_for

    plan = plan_slices(model.architecture, training)
    measured = []
    for i, s in enumerate(plan.slices, 1):
        on_event({"event": "slice", "index": i, "of": len(plan.slices), **s.to_dict()})
        request = request_for(model, slice_training(training, s), length=length, max_steps=max_steps)
        request["slice_blocks"] = s.blocks
        measured.append(measure(request, timeout=timeout, on_event=on_event))
    steps_peak = plan.extrapolate([m.peak_bytes for m in measured])
    with_load = plan.extrapolate([m.peak_with_load_bytes for m in measured])
    seconds = sum(m.seconds + m.build_seconds for m in measured)
    return Measurement(
        peak_bytes=steps_peak,
        peak_with_load_bytes=max(with_load, steps_peak),
        cache_bytes=max(m.cache_bytes for m in measured),
        process_peak_bytes=max(m.process_peak_bytes for m in measured),
        steps=max(m.steps for m in measured),
        seconds=seconds,
        build_seconds=sum(m.build_seconds for m in measured),
        backend=measured[0].backend,
        tokens_per_step=measured[0].tokens_per_step,
        method="slice",
        slice={
            **plan.to_dict(),
            "peaks_bytes": [m.peak_with_load_bytes for m in measured],
            "peak_bytes": max(m.peak_with_load_bytes for m in measured),
            "seconds": round(seconds, 2),
            "how": plan.describe(),
        },
    )
