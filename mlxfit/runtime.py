"""What the MLX / mlx-lm versions of a run do that changes its peak, per backend.

The estimate is for the installed versions (`Runtime.current`); the public Mac
runs that check it (benchmarks/mac_runs.py) were made with older ones, so each is
reproduced with the runtime of its own versions (`Runtime.of_versions`). Every
switch is cited from MLX / mlx-lm source (see docs/estimate.md):

- fused_cross_entropy: mlx/nn/losses.py cross_entropy calls mx.fast.cross_entropy
  on the GPU backends (Metal, CUDA) from mlx 0.32.3; the CPU, and the GPU before,
  run the unfused graph (logits - max, take_along_axis, logsumexp).
- compiled_step: mlx-lm compiles the whole training step (mx.compile with state in
  and out), which fuses elementwise chains so their intermediates are never
  allocated (mlx-lm compiled it in 2024-03 and from 2025-03-25, PR #53; the public runs
  outside those windows, and PR #53's baseline, ran uncompiled: benchmarks/mac_runs.py).
Attention needs no switch: Metal trains it unfused from mlx 0.25.0 (PR #2054); the fused
forward of mlx 0.24 (mlx-lm's "causal" mask) recomputed the unfused graph in its VJP, and
the one public run of it (mlx-lm PR #53) logged the probabilities' memory all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

FUSED_CE_MLX = (0, 32, 3)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


@lru_cache(maxsize=1)
def installed_mlx() -> tuple[int, ...] | None:
    try:  # the running MLX's own version (importlib.metadata is slow to import)
        import mlx.core as mx
    except ImportError:
        return None
    return parse_version(mx.__version__)


@dataclass(frozen=True)
class Runtime:
    fused_cross_entropy: bool = True
    compiled_step: bool = True

    @classmethod
    def of_versions(cls, backend: str, mlx: tuple[int, ...] | None, compiled_step: bool = True) -> "Runtime":
        """`mlx` None: a current MLX (the estimate plans for what a user installs now)."""
        gpu = backend in ("metal", "cuda")
        fused_ce = gpu and (mlx is None or mlx >= FUSED_CE_MLX)
        return cls(fused_cross_entropy=fused_ce, compiled_step=compiled_step)

    @classmethod
    def current(cls, backend: str) -> "Runtime":
        return cls.of_versions(backend, installed_mlx())
