"""Measuring by slice against measuring the whole run, and against mlx-lm's own trainer.

    python benchmarks/slices.py              # every configuration; writes results/slices.md and .json
    python benchmarks/slices.py --only 0 3   # some of them (by index)

For each configuration (random weights, MLX's CPU backend): the whole run measured by
`probe --measure`'s child process, the same run through `mlx_lm.tuner.trainer.train`
(tests/trainer_reference.py: the peak mlx-lm's trainer reports), and the slices of
mlxfit/measure/slicing.py, extrapolated. Reported: both errors of the extrapolation, the
slices' own MLX peak as a share of the run's, and the wall time of the slices against
the whole measurement, side by side on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlxfit.measure.parent import measure, request_for  # noqa: E402
from mlxfit.measure.slicing import measure_by_slices  # noqa: E402
from mlxfit.model.resolve import _from_config, catalog  # noqa: E402
from mlxfit.model.training import TrainingConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STEPS = 6
W = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 2,
     "vocab_size": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
ARCHS = {
    "llama-16": {"model_type": "llama", **W, "num_hidden_layers": 16, "tie_word_embeddings": True},
    "llama-16-untied": {"model_type": "llama", **W, "num_hidden_layers": 16, "tie_word_embeddings": False},
    "llama-20": {"model_type": "llama", **W, "num_hidden_layers": 20, "tie_word_embeddings": True},
    "phi3-16": {"model_type": "phi3", **W, "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 16,
                "tie_word_embeddings": False},
    "qwen3moe-16": {"model_type": "qwen3_moe", **W, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128,
                    "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [],
                    "num_hidden_layers": 16, "num_attention_heads": 4, "head_dim": 32, "tie_word_embeddings": False,
                    "norm_topk_prob": True, "rope_theta": 1e6, "max_position_embeddings": 32768},
    "gemma3-24": {"model_type": "gemma3_text", **W, "num_hidden_layers": 24, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "head_dim": 64, "query_pre_attn_scalar": 64, "sliding_window": 128, "sliding_window_pattern": 6},
    "llama-16-bf16": {"model_type": "llama", **W, "num_hidden_layers": 16, "tie_word_embeddings": True,
                      "torch_dtype": "bfloat16"},
    "qwen2.5-0.5b": dict(catalog()["qwen/qwen2.5-0.5b-instruct"][1], torch_dtype="float32"),
    "qwen2.5-1.5b": dict(catalog()["qwen/qwen2.5-1.5b-instruct"][1], torch_dtype="float32"),
}
# (architecture, training flags, batch, max length)
RUNS = [
    ("llama-16", {}, 2, 256),
    ("llama-16", {"num_layers": 8}, 2, 256),
    ("llama-16", {"grad_checkpoint": True}, 2, 512),
    ("llama-16", {"fine_tune_type": "dora"}, 1, 256),
    ("llama-16", {"fine_tune_type": "full"}, 1, 256),
    ("llama-16", {"fine_tune_type": "full", "num_layers": 8}, 1, 256),
    ("llama-16", {"quantize": True}, 1, 128),
    ("llama-16", {"fine_tune_type": "dora", "quantize": True}, 1, 128),
    ("llama-16-untied", {}, 2, 256),
    ("llama-20", {"num_layers": 12, "grad_checkpoint": True}, 2, 256),
    ("phi3-16", {}, 1, 256),
    ("qwen3moe-16", {}, 1, 256),
    ("gemma3-24", {}, 1, 256),
    ("qwen2.5-0.5b", {"num_layers": 16}, 1, 128),
    ("qwen2.5-0.5b", {"grad_checkpoint": True}, 1, 128),
    ("llama-16", {"quantize": True, "num_layers": 8, "grad_checkpoint": True}, 2, 256),
    ("llama-16", {"fine_tune_type": "dora", "num_layers": 8}, 2, 128),
    ("llama-16", {"fine_tune_type": "full", "grad_checkpoint": True}, 2, 256),
    ("llama-16-untied", {"fine_tune_type": "full", "num_layers": 4}, 1, 256),
    ("llama-16", {"fine_tune_type": "dora", "quantize": True, "grad_checkpoint": True}, 1, 256),
    ("phi3-16", {"fine_tune_type": "dora"}, 1, 256),
    ("phi3-16", {"quantize": True, "num_layers": 8}, 1, 256),
    ("qwen3moe-16", {"fine_tune_type": "full"}, 1, 256),
    ("qwen3moe-16", {"quantize": True, "grad_checkpoint": True}, 2, 128),
    ("gemma3-24", {"num_layers": 12, "grad_checkpoint": True}, 1, 256),
    ("gemma3-24", {"quantize": True}, 1, 256),
    ("llama-20", {"rank": 16}, 2, 512),
    ("llama-16-bf16", {}, 1, 128),
    ("qwen2.5-0.5b", {"quantize": True}, 1, 256),
    ("qwen2.5-0.5b", {"fine_tune_type": "dora", "num_layers": 8}, 1, 128),
    ("qwen2.5-1.5b", {"num_layers": 16}, 1, 64),
]


def trainer_peak(request: dict) -> int:
    """The peak mlx-lm's own trainer reports for the same run (GB = 10^9 bytes)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "trainer_reference.py")], input=json.dumps(request),
                          capture_output=True, text=True, env=env, timeout=1800)
    line = next((l for l in done.stdout.splitlines() if l.startswith("PEAKS ")), None)
    if line is None:
        raise RuntimeError(done.stderr[-2000:])
    return int(round(json.loads(line[6:])[-1] * 1e9))


def run(index: int) -> dict:
    arch, flags, batch, length = RUNS[index]
    flags = dict(flags)
    model = _from_config(arch, "local", ARCHS[arch])
    training = TrainingConfig(batch_size=batch, max_seq_length=length, num_layers=flags.pop("num_layers", -1), **flags)
    tic = time.perf_counter()
    full = measure(request_for(model, training, max_steps=STEPS), timeout=1800)
    full_wall = time.perf_counter() - tic
    request = request_for(model, training, max_steps=full.steps)
    reference = trainer_peak(request)
    tic = time.perf_counter()
    sliced = measure_by_slices(model, training, None, STEPS, timeout=1800)
    slice_wall = time.perf_counter() - tic
    s = sliced.peak_with_load_bytes
    return {
        "index": index, "arch": arch, "blocks": model.architecture.num_layers, "training": training.to_dict(),
        "full_bytes": full.peak_with_load_bytes, "trainer_bytes": reference, "slice_bytes": s,
        "error_vs_full_pct": round(100 * (s - full.peak_with_load_bytes) / full.peak_with_load_bytes, 2),
        "error_vs_trainer_pct": round(100 * (s - reference) / reference, 2),
        "slice_own_peak_share": round(sliced.slice["peak_bytes"] / full.peak_with_load_bytes, 3),
        "wall_ratio": round(slice_wall / full_wall, 2), "slice_wall_s": round(slice_wall, 1), "full_wall_s": round(full_wall, 1),
        "how": sliced.slice["how"],
    }


def describe(r: dict) -> str:
    t = r["training"]
    method = ("q" if t["quantize"] else "") + t["fine_tune_type"]
    layers = "all" if t["num_layers"] == -1 else f"last {t['num_layers']}"
    rank = f", rank {t['rank']}" if t["rank"] != TrainingConfig().rank and t["fine_tune_type"] != "full" else ""
    return f"{method}, {layers}{rank}{', gc' if t['grad_checkpoint'] else ''}, {t['batch_size']} × {t['max_seq_length']}"


def write(rows: list[dict]) -> str:
    import mlx.core as mx

    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "slices.json").write_text(json.dumps(rows, indent=2) + "\n")
    errs = [abs(r["error_vs_full_pct"]) for r in rows] + [abs(r["error_vs_trainer_pct"]) for r in rows]
    deep = [r for r in rows if r["blocks"] >= 16]
    lines = [
        "# Measuring by slice (MLX CPU backend, random weights)",
        "",
        f"mlx {mx.__version__}; Linux x86_64, 2 cores; {STEPS} steps at most per measurement. Error = (slice - reference) / reference.",
        "",
        f"- {len(rows)} configurations; worst |error| against the full measurement "
        f"{max(abs(r['error_vs_full_pct']) for r in rows):.1f}%, against mlx-lm's trainer "
        f"{max(abs(r['error_vs_trainer_pct']) for r in rows):.1f}% (median of both {statistics.median(errs):.1f}%).",
        f"- Slices' own MLX peak, models of 16+ blocks: at most {max(r['slice_own_peak_share'] for r in deep):.0%} of the run's "
        f"(median {statistics.median(r['slice_own_peak_share'] for r in deep):.0%}).",
        f"- Wall time of the slices against the full measurement: median {statistics.median(r['wall_ratio'] for r in rows):.2f}x, "
        f"worst {max(r['wall_ratio'] for r in rows):.2f}x.",
        "",
        "| # | model | blocks | run | full MB | mlx-lm trainer MB | slice MB | vs full | vs trainer | slice peak share | wall ratio | slices |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['index']} | {r['arch']} | {r['blocks']} | {describe(r)} | {r['full_bytes'] / 1e6:.1f} | "
            f"{r['trainer_bytes'] / 1e6:.1f} | {r['slice_bytes'] / 1e6:.1f} | {r['error_vs_full_pct']:+.1f}% | "
            f"{r['error_vs_trainer_pct']:+.1f}% | {r['slice_own_peak_share']:.0%} | {r['wall_ratio']:.2f}x | {r['how']} |"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / "slices.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="*", help="indexes of RUNS to measure")
    args = parser.parse_args()
    kept = {}
    if args.only and (RESULTS / "slices.json").exists():  # measure some again, keep the others
        kept = {r["index"]: r for r in json.loads((RESULTS / "slices.json").read_text())}
    for i in args.only if args.only else range(len(RUNS)):
        kept[i] = run(i)
        print(json.dumps(kept[i]), flush=True)
        text = write([kept[i] for i in sorted(kept)])  # after each run: a long sweep keeps what it measured
    print(text)


if __name__ == "__main__":
    main()
