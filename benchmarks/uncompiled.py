"""What an uncompiled training step keeps on the CPU: the `uncompiled` coefficient.

mlx-lm compiles its step (mx.compile fuses elementwise chains, so their
intermediates are never allocated); mlx-lm-lora's CPO step cannot be compiled on
mlx 0.32.4 and runs without. mlxfit/estimate/detailed.py counts what an uncompiled
step adds as `uncompiled` x the kept activations' bytes (`uncompiled_bytes`). On
Metal the coefficient is fitted on mlx-lm PR #53's baseline; on the CPU it is
measured here: the same SFT runs with and without MLX_DISABLE_COMPILE, evaluated
synchronously (a deterministic peak), the difference over the feature.

    python benchmarks/uncompiled.py          # measure, print the table
    python benchmarks/uncompiled.py --write  # and set cpu.uncompiled in mlxfit/data/coefficients.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from preference import CONFIGS  # noqa: E402  (the grid's two models)

RUNS = [(name, b, n) for name in CONFIGS for b, n in ((1, 144), (2, 272), (4, 144))]
OUT = ROOT / "benchmarks" / "results" / "uncompiled_cpu.md"
COEFFICIENTS = ROOT / "mlxfit" / "data" / "coefficients.json"


def measure_pair(name: str, batch: int, length: int) -> tuple[int, int, int]:
    """(compiled peak, uncompiled peak, uncompiled_bytes feature) of one LoRA run."""
    from mlxfit.estimate.detailed import backend_features, features
    from mlxfit.measure.parent import measure, request_for
    from mlxfit.model.resolve import _from_config
    from mlxfit.model.training import TrainingConfig
    from mlxfit.runtime import Runtime

    model = _from_config(name, "local", CONFIGS[name])
    training = TrainingConfig(batch_size=batch, max_seq_length=length, num_layers=-1)
    peaks = []
    for off in (False, True):
        if off:
            os.environ["MLX_DISABLE_COMPILE"] = "1"  # read by the measuring child's MLX
        try:
            peaks.append(measure(request_for(model, training, length, max_steps=3, synchronous=True), timeout=900).peak_bytes)
        finally:
            os.environ.pop("MLX_DISABLE_COMPILE", None)
    f = backend_features(features(model, training, length), "cpu", Runtime(compiled_step=False), model.architecture.head_dim)
    return peaks[0], peaks[1], f["uncompiled_bytes"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--write", action="store_true", help="set cpu.uncompiled in mlxfit/data/coefficients.json")
    args = p.parse_args()
    lines = ["# An uncompiled step on the CPU", "",
             "Written by `python benchmarks/uncompiled.py`: LoRA on the preference grid's two models, each step",
             "measured compiled and with `MLX_DISABLE_COMPILE=1` (synchronous evaluation), and the difference",
             "divided by the kept activations' bytes (`uncompiled_bytes`, mlxfit/estimate/detailed.py).", "",
             "| model | batch | length | compiled MB | uncompiled MB | difference MB | uncompiled_bytes MB | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for name, batch, length in RUNS:
        compiled, uncompiled, feature = measure_pair(name, batch, length)
        ratios.append((uncompiled - compiled) / feature)
        lines.append(f"| {name} | {batch} | {length} | {compiled / 1e6:.1f} | {uncompiled / 1e6:.1f} | "
                     f"{(uncompiled - compiled) / 1e6:.1f} | {feature / 1e6:.1f} | {ratios[-1]:.3f} |")
        print(lines[-1], flush=True)
    coefficient = round(statistics.median(ratios), 4)
    lines += ["", f"The CPU's `uncompiled` coefficient is their median, {coefficient} (from {min(ratios):.2f} to "
              f"{max(ratios):.2f}). It changes only estimates of uncompiled steps: mlx-lm-lora's CPO."]
    OUT.write_text("\n".join(lines) + "\n")
    if args.write:
        data = json.loads(COEFFICIENTS.read_text())
        data["cpu"]["uncompiled"] = coefficient
        COEFFICIENTS.write_text(json.dumps(data, indent=2) + "\n")
    print(lines[-1])


if __name__ == "__main__":
    main()
