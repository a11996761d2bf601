"""Measure a run by a slice of its model: a few real-width blocks, extrapolated.

Issue 12 item 1, first part (not wired into the CLI yet). A training step's peak
is, block by block, nearly linear in the blocks: the embedding, the final norm,
the lm_head and the logits are paid once; each trained block adds its weights,
its gradients and optimizer state and the activations it keeps for its backward
pass; each frozen block adds its weights only. So three measured slices at the
run's own batch, length and settings pin the line:

    p(1)      one block, trained
    p(2)      two blocks, both trained
    p(2 + 1)  three blocks, the last two trained (only where the run has frozen ones)

and the run with T trained and F frozen blocks peaks near

    p(1) + (T - 1) * (p(2) - p(1)) + F * (p(2 + 1) - p(2)).

Only models whose blocks are alike can be sliced this way: a config with a block
pattern (sliding/global attention, linear/full attention, dense/MoE layers) is
refused with the reason (`SliceRefused`), and the caller falls back to the full
measurement or the estimate.

On the CPU backend a peak also holds the outputs of kernels the main thread has
run ahead of (mlxfit/steps.py evaluate_synchronously): that share does not grow
with the blocks, so a slice measured asynchronously is noisier than a full
measurement by about one buffer per slice; slices default to synchronous steps,
which the extrapolation then predicts (a lower figure than an asynchronous run).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import MlxfitError
from .training import TrainingConfig

# Keys of a config that give blocks different shapes or kinds: a slice of the
# first blocks would not represent the others.
PATTERN_KEYS = (
    "layer_types", "sliding_window_pattern", "mlp_only_layers", "decoder_sparse_step",
    "full_attention_interval", "hybrid_override_pattern", "block_types", "moe_layer_freq",
    "first_k_dense_replace", "attn_layer_indices", "layers_block_type",
)


class SliceRefused(MlxfitError):
    """This model cannot be represented by a slice of alike blocks; says why."""


def _text(config: dict) -> dict:
    return config["text_config"] if isinstance(config.get("text_config"), dict) else config


def depth(config: dict) -> int:
    return int(_text(config)["num_hidden_layers"])


def check_sliceable(config: dict) -> None:
    inner = _text(config)
    found = [k for k in PATTERN_KEYS if inner.get(k) not in (None, [], 0, 1)]  # 1: every block alike
    if found:
        raise SliceRefused(
            f"{config.get('model_type')}: its blocks are not alike ({', '.join(found)}); "
            "a slice of alike blocks cannot represent it"
        )


def slice_config(config: dict, blocks: int) -> dict:
    """The same config with only `blocks` blocks: real widths, vocabulary and head."""
    if blocks < 1 or blocks > depth(config):
        raise MlxfitError(f"a slice takes 1 to {depth(config)} blocks, got {blocks}")
    out = copy.deepcopy(config)
    _text(out)["num_hidden_layers"] = blocks
    return out


@dataclass(frozen=True)
class Slice:
    blocks: int  # blocks built
    trained: int  # of which the last `trained` are trained

    @property
    def name(self) -> str:
        frozen = self.blocks - self.trained
        return f"{self.trained} trained" + (f" + {frozen} frozen" if frozen else "")


def plan(config: dict, training: TrainingConfig) -> tuple[Slice, ...]:
    """The slices that pin the run's line; refuses models it cannot represent."""
    check_sliceable(config)
    total = depth(config)
    trained = training.layers_trained(total)
    if total < 3:
        raise SliceRefused(f"{total} blocks: measure the whole model, a slice would be as large")
    slices = [Slice(1, 1), Slice(2, 2)]
    if trained < total:
        slices.append(Slice(3, 2))
    return tuple(slices)


def extrapolate(peaks: dict[Slice, int], trained: int, frozen: int) -> int:
    """The run's peak from the slices' peaks (see the module's docstring)."""
    one, two = peaks[Slice(1, 1)], peaks[Slice(2, 2)]
    per_trained = two - one
    per_frozen = peaks[Slice(3, 2)] - two if frozen else 0
    return int(one + (trained - 1) * per_trained + frozen * per_frozen)


@dataclass(frozen=True)
class SliceMeasurement:
    peak_with_load_bytes: int  # the whole run's peak, extrapolated
    slices: tuple[Slice, ...]
    peaks_bytes: tuple[int, ...]  # each slice's peak with load
    peak_bytes: int  # the largest MLX peak of a slice process: what the slices needed
    process_peak_bytes: int  # the largest resident high-water mark of a slice process
    seconds: float
    synchronous: bool
    measurements: tuple = field(default=(), repr=False)

    def to_dict(self) -> dict:
        """The `measured` object of issue 12 item 2."""
        return {
            "method": "slice",
            "peak_with_load_bytes": self.peak_with_load_bytes,
            "process_peak_bytes": self.process_peak_bytes,
            "synchronous": self.synchronous,
            "slice": {
                "blocks": [s.name for s in self.slices],
                "peaks_bytes": list(self.peaks_bytes),
                "peak_bytes": self.peak_bytes,
                "seconds": round(self.seconds, 3),
            },
        }


def slice_request(request: dict, piece: Slice) -> dict:
    """The measurement request of one slice, from the whole run's request."""
    training = dict(request["training"], num_layers=piece.trained)
    return dict(request, config=slice_config(request["config"], piece.blocks), folder=None, training=training)


def measure_by_slices(
    request: dict,
    measure: Callable | None = None,
    synchronous: bool = True,
    timeout: float | None = None,
    on_event: Callable[[dict], None] = lambda e: None,
) -> SliceMeasurement:
    """Measure the slices of a run's request (mlxfit.measure.request_for) and
    extrapolate to the whole run. Random weights: a folder's real weights are not
    sliced."""
    if measure is None:
        from .measure import measure
    training = TrainingConfig(**request["training"])
    total = depth(request["config"])
    trained = training.layers_trained(total)
    pieces = plan(request["config"], training)
    tic = time.monotonic()
    results = []
    for piece in pieces:
        on_event({"event": "slice", "slice": piece.name})
        results.append(measure(dict(slice_request(request, piece), synchronous=synchronous), timeout=timeout, on_event=on_event))
    peaks = {piece: m.peak_with_load_bytes for piece, m in zip(pieces, results)}
    return SliceMeasurement(
        peak_with_load_bytes=extrapolate(peaks, trained, total - trained),
        slices=pieces,
        peaks_bytes=tuple(peaks[p] for p in pieces),
        peak_bytes=max(m.peak_with_load_bytes for m in results),
        process_peak_bytes=max(m.process_peak_bytes for m in results),
        seconds=time.monotonic() - tic,
        synchronous=synchronous,
        measurements=tuple(results),
    )
