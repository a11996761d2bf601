"""What does `mlxfit probe --measure` cost over the same steps run bare with mlx-lm?
And is building random weights no slower than loading real ones?

    python benchmarks/probe_overhead.py                         # the small model, 5 repeats
    python benchmarks/probe_overhead.py --size tiny --repeat 1  # a quick check that it runs

1. Wall time of `mlxfit probe --measure --json` (a subprocess; a local model given
   by config.json only, so mlxfit builds random weights) against a bare script (a
   subprocess) that builds the same model with `mlxfit.measure.build.build` and calls
   `mlx_lm.tuner.trainer.train` for the same number of steps. Both count the
   interpreter's start and the imports; the ratio is what mlxfit adds (its CLI,
   the child process, the event stream, the peak readings).
2. In fresh processes, after the imports: `mlxfit.measure.build.random_model` evaluated
   against `mlx_lm.utils.load_model` of the same weights saved to disk (read back
   from the page cache: the fast case for loading). The issue requires building
   to be no slower than loading.

Medians over --repeat runs, the two sides alternated. Writes probe_overhead.json
and probe_overhead.md under --results (default benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {
    # hidden 128, 2 blocks: seconds per run; for checking that the script works.
    "tiny": {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "rms_norm_eps": 1e-5,
             "tie_word_embeddings": True, "torch_dtype": "float32"},
    # About 42M parameters (168 MB in float32): big enough that building and loading take real time.
    "small": {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "torch_dtype": "float32"},
}

# The same steps with mlx-lm's own trainer (as tests/trainer_reference.py).
BARE = r"""
import json, sys, tempfile
from pathlib import Path
from mlx_lm.tuner.trainer import TrainingArgs, TrainingCallback, train
from mlxfit.measure.build import build
from mlxfit.measure.steps import full_length_dataset, make_optimizer
from mlxfit.model.training import TrainingConfig

request = json.loads(sys.stdin.read())
training = TrainingConfig(**request["training"])
model = build(request["config"], None, training)
with tempfile.TemporaryDirectory() as tmp:
    args = TrainingArgs(
        batch_size=training.batch_size, iters=request["steps"], steps_per_report=10**9,
        steps_per_eval=10**9, steps_per_save=10**9, max_seq_length=training.max_seq_length,
        adapter_file=str(Path(tmp) / "adapters.safetensors"), grad_checkpoint=training.grad_checkpoint,
    )
    dataset = full_length_dataset(training.batch_size, training.max_seq_length, request["config"]["vocab_size"])
    train(model, make_optimizer(training.optimizer), dataset, None, args=args, training_callback=TrainingCallback())
"""

# One timed operation in a fresh process, after the imports.
BUILD_OR_LOAD = r"""
import json, sys, time
from pathlib import Path
import mlx.core as mx
import mlx_lm.utils
from mlxfit.measure.build import materialize, random_model

mode, folder = sys.argv[1], Path(sys.argv[2])
config = json.loads((folder / "config.json").read_text())
tic = time.perf_counter()
if mode == "build":
    model = random_model(config)
    materialize(model)
else:
    model, _ = mlx_lm.utils.load_model(folder)  # lazy=False: evaluates every weight
mx.synchronize()
print(json.dumps({"seconds": time.perf_counter() - tic}))
"""

SAVE = r"""
import json, sys
from pathlib import Path
import mlx.core as mx
from mlx.utils import tree_flatten
from mlxfit.measure.build import random_model

folder = Path(sys.argv[1])
model = random_model(json.loads((folder / "config.json").read_text()))
mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
"""


def environment(cache: Path) -> dict:
    # Measurements go to a throwaway calibration store, never the user's.
    return dict(os.environ, MLXFIT_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))


CPU_SECONDS: list[float] = []  # CPU time (user + system) of the last timed() command and its children


def timed(cmd: list[str], env: dict, stdin: str | None = None) -> tuple[float, str]:
    """Wall seconds and stdout; the CPU seconds it and every process it waited for
    used go to CPU_SECONDS. On a shared machine the wall moves with the others'
    load (17.8-31.3 s for one side in three runs, against 10.3-10.7 s on a quiet
    one); the CPU time less so."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    tic = time.perf_counter()
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, cwd=ROOT)
    seconds = time.perf_counter() - tic
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_SECONDS.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def probe_vs_bare(folder: Path, config: dict, args, env: dict) -> dict:
    probe_cmd = [
        sys.executable, "-m", "mlxfit", "probe", "--model", str(folder), "--measure", "--json",
        "--num-layers", "-1", "--batch-size", str(args.batch_size), "--max-seq-length", str(args.length),
        "--steps", str(args.steps),
    ]
    probe_seconds, bare_seconds, inside, probe_cpu, bare_cpu = [], [], [], [], []
    steps = None
    for _ in range(args.repeat):
        seconds, out = timed(probe_cmd, env)
        probe_cpu.append(CPU_SECONDS[-1])
        measured = json.loads(out)["measured"]
        steps = measured["steps"]  # probe stops once the peak holds: the bare run takes as many
        probe_seconds.append(seconds)
        inside.append({"steps_seconds": measured["seconds"], "build_seconds": measured["build_seconds"]})
        request = {
            "config": config, "steps": steps,
            "training": {"num_layers": -1, "batch_size": args.batch_size, "max_seq_length": args.length},
        }
        seconds, _ = timed([sys.executable, "-c", BARE], env, stdin=json.dumps(request))
        bare_cpu.append(CPU_SECONDS[-1])
        bare_seconds.append(seconds)
    probe, bare = statistics.median(probe_seconds), statistics.median(bare_seconds)
    return {
        "steps": steps,
        "probe_seconds": probe_seconds,
        "bare_seconds": bare_seconds,
        "probe_median_s": round(probe, 3),
        "bare_median_s": round(bare, 3),
        "ratio": round(probe / bare, 3),
        "probe_cpu_seconds": probe_cpu,
        "bare_cpu_seconds": bare_cpu,
        "probe_cpu_median_s": round(statistics.median(probe_cpu), 3),
        "bare_cpu_median_s": round(statistics.median(bare_cpu), 3),
        "cpu_ratio": round(statistics.median(probe_cpu) / statistics.median(bare_cpu), 3),
        "inside_probe": inside,
    }


def build_vs_load(folder: Path, args, env: dict) -> dict:
    timed([sys.executable, "-c", SAVE, str(folder)], env)
    weights = (folder / "model.safetensors").stat().st_size
    build_seconds, load_seconds = [], []
    for _ in range(args.repeat):
        for mode, into in (("load", load_seconds), ("build", build_seconds)):
            _, out = timed([sys.executable, "-c", BUILD_OR_LOAD, mode, str(folder)], env)
            into.append(json.loads(out)["seconds"])
    build, load = statistics.median(build_seconds), statistics.median(load_seconds)
    return {
        "weights_bytes": weights,
        "build_seconds": build_seconds,
        "load_seconds": load_seconds,
        "build_median_s": round(build, 4),
        "load_median_s": round(load, 4),
        "build_over_load": round(build / load, 3),
        "build_no_slower": build <= load,
    }


def markdown(result: dict) -> str:
    o, b = result["overhead"], result["build_vs_load"]
    lines = [
        "# `mlxfit probe --measure` against bare mlx-lm",
        "",
        f"{result['platform']}; mlx {result['versions']['mlx']}, mlx-lm {result['versions']['mlx-lm']}. "
        f"Model `{result['size']}` ({result['model']['num_hidden_layers']} blocks, hidden {result['model']['hidden_size']}, "
        f"vocab {result['model']['vocab_size']}, {result['model']['torch_dtype']}); batch {result['batch_size']} x "
        f"{result['length']} tokens, {o['steps']} steps; medians of {result['repeat']} runs.",
        "",
        "| | median wall time (range) | ratio | median CPU time | ratio |",
        "|---|---|---|---|---|",
        f"| `mlxfit probe --measure` (subprocess) | {o['probe_median_s']:.2f} s ({min(o['probe_seconds']):.1f}-{max(o['probe_seconds']):.1f}) "
        f"| {o['ratio']:.2f}x | {o['probe_cpu_median_s']:.2f} s | {o['cpu_ratio']:.2f}x |",
        f"| build + `mlx_lm.tuner.trainer.train` (subprocess) | {o['bare_median_s']:.2f} s ({min(o['bare_seconds']):.1f}-{max(o['bare_seconds']):.1f}) "
        f"| 1.00x | {o['bare_cpu_median_s']:.2f} s | 1.00x |",
        "",
        f"| weights ({b['weights_bytes'] / 1e6:.0f} MB) | median | ratio |",
        "|---|---|---|",
        f"| `mlxfit.measure.build.random_model` + eval | {b['build_median_s']:.3f} s | {b['build_over_load']:.2f}x |",
        f"| `mlx_lm.utils.load_model` (page cache) | {b['load_median_s']:.3f} s | 1.00x |",
        "",
        f"Building random weights is {'no slower than' if b['build_no_slower'] else 'SLOWER than'} loading them.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(MODELS), default="small", help="the model to build")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each side (median)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--length", type=int, default=256, help="tokens per example")
    parser.add_argument("--steps", type=int, default=6, help="most steps (probe may stop earlier; the bare run matches it)")
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="where to write the JSON and markdown")
    args = parser.parse_args()

    from mlxfit.estimate.calibration import versions  # light: reads package metadata only

    config = MODELS[args.size]
    with tempfile.TemporaryDirectory(prefix="mlxfit-bench-") as tmp:
        folder, cache = Path(tmp) / "model", Path(tmp) / "cache"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        env = environment(cache)
        overhead = probe_vs_bare(folder, config, args, env)
        loading = build_vs_load(folder, args, env)
    result = {
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "versions": versions(),
        "size": args.size,
        "model": config,
        "batch_size": args.batch_size,
        "length": args.length,
        "repeat": args.repeat,
        "overhead": overhead,
        "build_vs_load": loading,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "probe_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (args.results / "probe_overhead.md").write_text(text)
    print(text, end="")
    print(f"written to {args.results / 'probe_overhead.json'} and .md")


if __name__ == "__main__":
    main()
