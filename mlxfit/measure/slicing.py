"""Measure a run by a slice of it: a few of its own blocks, at its own width.

A training step's memory is, block by block, nearly linear in the number of
trained blocks: the embedding, the final norm, the lm_head and the logits are
paid once; each trained block adds the same kept activations, adapter or weight
gradients and optimizer state; each frozen block its weights. So real steps of
the run's batch and length through the model's real embedding and head and a
few real-width blocks (one period of its block pattern, then at least three
blocks' worth of periods; and at least two frozen blocks in front where the run
has frozen ones) give the per-block increase, and the whole run's peak follows.

On the CPU backend `mx.eval` runs up to about 100 kernels ahead of the worker
(mlxfit/measure/steps.py evaluated_synchronously), so an mlx-lm peak also holds the
outputs of whatever ops are queued at that moment: tens of megabytes of logits,
more or less, depending on where the peak falls. That part does not grow with
depth but it is not the same from one slice to the next, and the extrapolation
multiplies any difference between slices by the depth. So the per-block increase
is read from slices evaluated synchronously (a deterministic graph), and what
runs ahead from a slice of two periods run as mlx-lm runs it. All slices are measured
in turn by one child process (mlxfit/measure/child.py), each model's block list cut to
its last blocks before anything is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import MlxfitError
from ..model.architecture import Architecture, Block
from ..model.training import TrainingConfig


SYNCHRONOUS_STEPS = 4  # Adam's state exists from the second step: the least of three steps' peaks
SYNCHRONOUS_SPAN = 3  # blocks in the deeper synchronous slice, at least (whole periods)
FROZEN_SPAN = 2  # frozen blocks in front of the base slice, at least (whole periods)


@dataclass(frozen=True)
class Slice:
    blocks: int  # the model's last `blocks` blocks are kept
    trained: int  # of which the last `trained` are trained
    synchronous: bool = True  # evaluated without running ahead: the per-block increase

    @property
    def frozen(self) -> int:
        return self.blocks - self.trained

    def steps(self, training: TrainingConfig) -> int | None:
        """A synchronous slice takes a fixed number of steps (whole accumulation
        cycles): its peak still moves up by what the worker has not yet released
        (mlxfit/measure/child.py measure_once), so the slices are compared by their
        least peak over the same steps. None: until the peak settles."""
        return SYNCHRONOUS_STEPS * training.grad_accumulation_steps if self.synchronous else None

    def label(self) -> str:
        return (f"{self.trained} trained" + (f" + {self.frozen} frozen" if self.frozen else "")
                + ("" if self.synchronous else " run ahead as mlx-lm runs"))

    def to_dict(self) -> dict:
        return {"blocks": self.blocks, "trained": self.trained, "synchronous": self.synchronous}


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
        """The synchronous slice with more trained blocks than the base (at least
        three blocks' worth of periods), when the run has more."""
        return next((s for s in self.slices[1:] if s.synchronous and not s.frozen), None)

    @property
    def with_frozen(self) -> Slice | None:
        return next((s for s in self.slices[1:] if s.frozen), None)

    @property
    def as_run(self) -> Slice:
        """The slice evaluated as mlx-lm runs (ahead of the worker): the anchor of
        the extrapolation."""
        return next(s for s in self.slices if not s.synchronous)

    def extrapolate(self, peaks: list[int]) -> int:
        """The whole run's figure from the slices' (in the order of `slices`): the
        slice run as mlx-lm runs, plus the synchronous slices' increase per block
        for each trained and frozen block it lacks."""
        by = dict(zip(self.slices, peaks))
        anchor = self.as_run
        peak = float(by[anchor])
        if self.deeper is not None:
            per_trained = (by[self.deeper] - by[self.base]) / (self.deeper.trained - self.base.trained)
            peak += (self.trained - anchor.trained) * per_trained
        frozen = self.total - self.trained
        if frozen and self.with_frozen is not None:
            per_frozen = (by[self.with_frozen] - by[self.base]) / self.with_frozen.frozen
            peak += frozen * per_frozen
        return int(round(peak))

    def describe(self) -> str:
        return f"slices of {'; '.join(s.label() for s in self.slices)}, of the {self.total} blocks (period {self.period})"

    def to_dict(self) -> dict:
        return {"period": self.period, "total_blocks": self.total, "trained_blocks": self.trained,
                "blocks": [s.to_dict() for s in self.slices]}


def slice_needed(predicted_bytes: int, here_usable_bytes: int | None, force: bool = False) -> bool:
    """Is a run measured by slice? When its estimate does not fit this machine's own
    budget (a measurement always runs here, whatever budget the plan is for), unless
    --force measures it whole. probe, bench's sweep and bench --max decide with this."""
    return not force and here_usable_bytes is not None and predicted_bytes > here_usable_bytes


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


def plan_slices(arch: Architecture, training: TrainingConfig, least: int = 1) -> SlicePlan:
    """One period of the trained blocks and at least three blocks' worth of whole
    periods, synchronously; two periods as mlx-lm runs them; at least two frozen
    blocks (whole periods) in front of the first where the run has frozen blocks. A
    run with fewer than two periods of trained blocks has them measured whole.
    `least`: the base slice holds at least that many trained blocks (whole periods),
    each slice as many more (a step whose peak is not in its blocks below that depth:
    measure/vision.py)."""
    total = arch.num_layers
    n = training.layers_trained(total)
    p = period(arch.blocks[total - n:])
    frozen = total - n
    base = p * -(-max(least, 1) // p)
    if n >= base + p:
        # A synchronous peak still moves by about one activation from run to run:
        # slices at least two blocks apart halve what that does per block.
        deeper = base - p + p * max(2, -(-SYNCHRONOUS_SPAN // p))
        deeper = deeper if deeper <= n else base + p
        slices = [Slice(base, base), Slice(deeper, deeper), Slice(base + p, base + p, synchronous=False)]
    elif frozen:
        slices = [Slice(n, n), Slice(n, n, synchronous=False)]
    else:
        slices = [Slice(n, n)]
    if frozen:
        # Two frozen blocks at least (whole periods where the frozen ones have a
        # pattern): one block's increase is about the size of the step-to-step noise
        # when the run checkpoints or quantizes.
        pf = period(arch.blocks[:frozen]) if frozen > 1 else 1
        kf = min(pf * -(-FROZEN_SPAN // pf), frozen)
        slices.append(Slice(slices[0].blocks + kf, slices[0].trained))
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
    """Measure the slices in turn in one child process; the whole run's figures are
    extrapolated (mlxfit.measure.parent.Measurement with method "slice")."""
    from .parent import Measurement, request_for, run_child

    plan = plan_slices(model.architecture, training)
    request = request_for(model, training, length=length, max_steps=max_steps)
    request["slices"] = [{**s.to_dict(), "steps": s.steps(training)} for s in plan.slices]
    done = run_child(request, timeout=timeout, on_event=on_event)
    measured = done["slices"]
    # The synchronous slices by their least peak per step, the one run ahead by its peak.
    figures = [m["least_peak_bytes"] if s.synchronous else m["peak_bytes"] for s, m in zip(plan.slices, measured)]
    steps_peak = plan.extrapolate(figures)
    load_peak = plan.extrapolate([m["load_peak_bytes"] for m in measured])
    as_run = measured[plan.slices.index(plan.as_run)]
    seconds = sum(m["seconds"] + m["build_seconds"] for m in measured)
    return Measurement(
        peak_bytes=steps_peak,
        peak_with_load_bytes=max(load_peak, steps_peak),
        load_peak_bytes=load_peak,
        cache_bytes=max(m["cache_bytes"] for m in measured),
        process_peak_bytes=done["process_peak_bytes"],
        steps=max(m["steps"] for m in measured),
        seconds=seconds,
        build_seconds=sum(m["build_seconds"] for m in measured),
        backend=done["backend"],
        tokens_per_step=as_run["tokens_per_step"],  # no step times: a slice's speed is not the run's
        method="slice",
        slice={
            **plan.to_dict(),
            "peaks_bytes": [m["peak_with_load_bytes"] for m in measured],
            "peak_bytes": max(m["peak_with_load_bytes"] for m in measured),
            "seconds": round(seconds, 2),
            "how": plan.describe(),
        },
    )
