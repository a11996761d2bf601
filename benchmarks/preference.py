"""DPO, CPO, ORPO and GRPO on this machine's CPU: the estimate against real steps of
mlx-lm-lora's own trainers (train_dpo, train_cpo, train_orpo, train_grpo), run by
mlxfit's measuring child (mlxfit/measure/preference_child.py) on random-weight
models built from a config.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/preference.py \
        [--out benchmarks/results/preference.md] [--json rows.jsonl] [--only 0-5,9]
    python benchmarks/preference.py --rescore benchmarks/results/preference.jsonl   # estimates only
    python benchmarks/preference.py --ranges [--write]   # each mode's range, cross-validated
    python benchmarks/preference.py --mac     # the estimate on the public Mac runs of these modes

Each row: random weights saved as a model folder with a tiny tokenizer and a
train.jsonl; mlx_lm_lora.train's own peak over 3 iterations; --measure's peak (the
trainer run by mlxfit's child on synthesized batches); the estimate at the widest
batch mlx-lm-lora builds from the file. benchmarks/results/preference.jsonl keeps the
measured rows, so --rescore recomputes the estimates without running anything.
benchmarks/results/preference_heldout.jsonl holds 24 more runs measured after the
estimate was fixed (--measure, which agrees with mlx_lm_lora.train on the grid): the
three modes with chosen and rejected sequences, with and without checkpointing, at two
vocabulary sizes on each model. --ranges derives each mode's range from all of them and
says how often a range derived without one set of runs holds that set's peaks.
Needs mlx-lm-lora (pip install 'mlxfit[rl]').
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "llama-tied-8k": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
                      "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192, "rms_norm_eps": 1e-5,
                      "tie_word_embeddings": True},
    "qwen3-16k": {"model_type": "qwen3", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
                  "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 16384,
                  "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 1e6, "tie_word_embeddings": False},
    # Wider models (hidden 384-512, as GRPO's and mlx-lm-lora SFT's misses were), for sets drawn after a change.
    "llama-512-f32": {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
                      "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 16384, "rms_norm_eps": 1e-5,
                      "tie_word_embeddings": True, "torch_dtype": "float32"},
    "qwen3-384-f32": {"model_type": "qwen3", "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 4,
                      "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32768,
                      "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "rope_theta": 1e6,
                      "tie_word_embeddings": False, "torch_dtype": "float32"},
    "llama-256-bf16": {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
                       "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 16384, "rms_norm_eps": 1e-5,
                       "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
}
# (config, mode, words of text per chosen response or prompt, flags for resolve_run)
L8, Q16 = "llama-tied-8k", "qwen3-16k"
GRID = [
    (L8, "dpo", 128, {}),
    (L8, "cpo", 128, {}),
    (L8, "orpo", 128, {}),
    (L8, "grpo", 32, {"rl_group_size": 2, "max_completion_length": 32}),
    (L8, "dpo", 256, {"batch_size": 2}),
    (L8, "dpo", 128, {"fine_tune_type": "dora"}),
    (L8, "dpo", 128, {"load_in_4bits": True}),
    (L8, "dpo", 128, {"fine_tune_type": "full"}),
    (L8, "dpo", 256, {"grad_checkpoint": True}),
    (L8, "dpo", 128, {"num_layers": 4}),
    (Q16, "dpo", 128, {}),
    (Q16, "dpo", 256, {"batch_size": 2, "grad_checkpoint": True}),
    (L8, "cpo", 128, {"fine_tune_type": "full"}),
    (L8, "cpo", 256, {"batch_size": 2}),
    (L8, "cpo", 128, {"fine_tune_type": "dora"}),
    (Q16, "cpo", 256, {"grad_checkpoint": True}),
    (L8, "cpo", 128, {"num_layers": 4}),
    (L8, "orpo", 256, {"grad_checkpoint": True}),
    (L8, "orpo", 128, {"load_in_4bits": True}),
    (L8, "orpo", 128, {"fine_tune_type": "full"}),
    (Q16, "orpo", 128, {"batch_size": 2}),
    (L8, "grpo", 32, {"rl_group_size": 4, "max_completion_length": 64}),
    (L8, "grpo", 16, {"rl_group_size": 8, "max_completion_length": 16}),
    (L8, "grpo", 32, {"rl_group_size": 2, "max_completion_length": 128, "grad_checkpoint": True}),
    (L8, "grpo", 32, {"rl_group_size": 2, "max_completion_length": 64, "beta": 0.0}),
    (L8, "grpo", 32, {"rl_group_size": 2, "max_completion_length": 32, "fine_tune_type": "dora"}),
    (L8, "grpo", 32, {"rl_group_size": 4, "max_completion_length": 32, "load_in_4bits": True}),
    (L8, "grpo", 16, {"rl_group_size": 2, "max_completion_length": 16, "fine_tune_type": "full"}),
    (Q16, "grpo", 32, {"rl_group_size": 2, "max_completion_length": 64}),
    (Q16, "grpo", 32, {"rl_group_size": 4, "max_completion_length": 32, "batch_size": 2}),
]


WORDS = ("the quick brown fox jumps over the lazy dog ; a model learns from data : memory fits "
         "or it does not , user assistant system").split()
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")

# mlx_lm_lora.train as its main() runs it, with the run's own callback reading the
# trainer's peak_memory at full precision, and the two changes the CPU needs.
REAL = r"""
import sys, json
from mlxfit.measure.preference_child import supply_working_set_size
supply_working_set_size()
import mlx.core as mx
if "--train-mode" in sys.argv and sys.argv[sys.argv.index("--train-mode") + 1] == "cpo":
    mx.disable_compile()
import yaml
from mlx_lm_lora import train
from mlx_lm.tuner.callbacks import TrainingCallback
args = train.build_parser().parse_args(sys.argv[1:])
with open(args.config) as f:
    for k, v in yaml.load(f, Loader=train.yaml_loader).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
for k, v in train.CONFIG_DEFAULTS.items():
    if getattr(args, k, None) is None:
        setattr(args, k, v)
peaks, lengths = [], []
class CB(TrainingCallback):
    def on_train_loss_report(self, info):
        peaks.append(info["peak_memory"])
        if "train_max_generated_tokens" in info:
            lengths.append(float(info["train_max_generated_tokens"]))
    def on_val_loss_report(self, info):
        pass
train.run(args, training_callback=CB())
print("RESULT " + json.dumps({"peaks_gb": peaks, "lengths": lengths}))
"""


def make_model_folder(folder: Path, config: dict) -> None:
    """Random weights saved as a model folder, and a tiny BPE tokenizer with a chat template."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from mlxfit.measure.build import random_model

    model = random_model(config)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS)], trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def make_data(folder: Path, mode: str, n: int, rows: int) -> None:
    """Rows of about n tokens (the chosen/rejected pair, or the prompt for GRPO)."""
    import random

    rng = random.Random(0)

    def text(k):
        return " ".join(rng.choice(WORDS) for _ in range(k))

    folder.mkdir(exist_ok=True)
    lines = []
    for _ in range(rows):
        if mode == "grpo":
            lines.append({"prompt": text(max(n - 12, 1)), "answer": "4"})
        elif mode == "lora_sft":
            lines.append({"text": text(n)})
        else:
            lines.append({"prompt": text(8), "chosen": text(n), "rejected": text(n // 2)})
    (folder / "train.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def real_run(model_dir: Path, data_dir: Path, mode: str, run, workdir: Path) -> dict:
    """mlx_lm_lora.train on the folders, 3 iterations; its reported peaks."""
    import os
    import subprocess

    t = run.training
    config = workdir / "run.yaml"
    config.write_text(json.dumps({"fuse": False, "lora_parameters": {"rank": t.rank, "dropout": 0.0, "scale": t.scale}}))
    argv = ["--model", str(model_dir), "--train", "--data", str(data_dir), "--train-mode", run.spec.trainer_mode,
            "--train-type", t.fine_tune_type, "--batch-size", str(t.batch_size), "--iters", "3",
            "--steps-per-report", "1", "--steps-per-eval", "1000", "--save-every", "1000",
            "--adapter-path", str(workdir / "adapters"), "--max-seq-length", str(t.max_seq_length),
            "--num-layers", str(t.num_layers), "--beta", str(run.beta), "-c", str(config)]
    if t.grad_checkpoint:
        argv.append("--grad-checkpoint")
    if t.quantize:
        argv.append(f"--load-in-{t.bits}bits")
    if mode == "grpo":
        argv += ["--group-size", str(run.group_size), "--max-completion-length", str(run.max_completion_length)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", REAL, *argv], capture_output=True, text=True, cwd=workdir, env=env,
                         timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError((out.stderr or out.stdout).strip().splitlines()[-1])


def one(name, mode, n, flags, tmp: Path) -> dict:
    """One configuration: build the folders, read the data as mlx-lm-lora batches it,
    estimate, measure (mlxfit's child), and run mlx_lm_lora.train."""
    from mlxfit.estimate.preference import estimate_run
    from mlxfit.measure.preference import measure
    from mlxfit.model.dataset import load_tokenizer
    from mlxfit.model.preference import read_data, resolve_run
    from mlxfit.model.resolve import resolve_model

    model_dir = tmp / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(CONFIGS[name]))
    make_model_folder(model_dir, CONFIGS[name])
    run = resolve_run(mode, dict(flags), {})
    make_data(tmp / "data", mode, n, max(4, 2 * run.training.batch_size))
    model = resolve_model(str(model_dir))
    width = read_data(str(tmp / "data"), run, load_tokenizer(model)).widest
    if mode == "grpo":
        e = estimate_run(model, run, "cpu", prompt_length=width, miniatures=True)
        m = measure(model, run, e.length, prompt_length=width, steps=3, timeout=900)
    elif mode == "lora_sft":
        e = estimate_run(model, run, "cpu", length=width, miniatures=True)
        m = measure(model, run, width, steps=3, timeout=900)
    else:
        e = estimate_run(model, run, "cpu", length=width, miniatures=True)
        m = measure(model, run, width, steps=3, timeout=900)
    fitted = estimate_run(model, run, "cpu", **({"prompt_length": width} if mode == "grpo" else {"length": width}))
    real = real_run(model_dir, tmp / "data", mode, run, tmp)
    out = {"config": name, "mode": mode, "width": width, "flags": flags, "estimate": e.peak_bytes,
           "estimate_fitted": fitted.peak_bytes, "phase": e.peak.name, "measured": m.peak_bytes,
           "measured_completions": list(m.completion_lengths), "compiled": m.compiled,
           "real": round(max(real["peaks_gb"]) * 1e9), "real_completions": real["lengths"]}
    if e.logits_buffers is not None:  # so that --rescore uses the count the estimate used
        out["logits_buffers"] = e.logits_buffers
    return out


RESULTS = Path(__file__).resolve().parent / "results"
RANGES = Path(__file__).resolve().parents[1] / "mlxfit" / "data" / "preference_ranges.json"
# A range is the widest error seen per mode (quantiles 0 and 1): with 10-17 runs a
# mode, the 5%-95% quantiles held only 41 of 54 runs left out one at a time.
TAIL = 0.0


def run_sets(kind: str = "counted") -> dict:
    """Three sets of runs, each (mode, measured / predicted) with today's estimate: the
    grid against mlx_lm_lora.train, and the held-out runs of each model. `kind`:
    "counted" (the logits buffers counted on miniatures, as recorded in the rows) or
    "fitted" (the estimate without mlx-lm-lora)."""
    sets = {}
    for line in (RESULTS / "preference.jsonl").read_text().splitlines():
        r = rescore(json.loads(line))
        sets.setdefault("grid (mlx_lm_lora.train)", []).append((r["mode"], r["real"] / r[ESTIMATE[kind]]))
    for line in (RESULTS / "preference_heldout.jsonl").read_text().splitlines():
        r = rescore(json.loads(line))
        sets.setdefault(f"held out, {r['config']} (--measure)", []).append((r["mode"], r["measured"] / r[ESTIMATE[kind]]))
    return sets


ESTIMATE = {"counted": "estimate", "fitted": "estimate_fitted"}


def mode_ranges(ratios: list) -> dict:
    from mlxfit.estimate.uncertainty import quantile

    out = {}
    for mode in sorted({m for m, _ in ratios}):
        xs = [x for m, x in ratios if m == mode]
        out[mode] = {"low": round(quantile(xs, TAIL), 4), "high": round(quantile(xs, 1 - TAIL), 4), "runs": len(xs)}
    return out


def ranges(write: bool) -> list[str]:
    """Each mode's range from every run, for both estimates, and its promise tested:
    each set's peaks against the ranges derived from the other sets alone (markdown lines)."""
    lines, final = [], {}
    for kind, title in (("counted", "Logits buffers counted on miniatures (mlx-lm-lora installed)"),
                        ("fitted", "The fitted count (without mlx-lm-lora)")):
        sets = run_sets(kind)
        every = [x for rows in sets.values() for x in rows]
        final[kind] = mode_ranges(every)
        if kind == "counted":
            final[kind] = {m: e for m, e in final[kind].items() if m != "grpo"}  # GRPO has no miniature
        lines += [f"{title}:", "", "| mode | runs | range (measured / predicted) | width |", "|---|---|---|---|"]
        for mode, e in final[kind].items():
            lines.append(f"| {mode} | {e['runs']} | {e['low']:.3f}–{e['high']:.3f} | {(e['high'] - e['low']) * 100:.0f}% |")
        every = [(m, x) for m, x in every if m in final[kind]]
        loo = 0
        for i, (mode, x) in enumerate(every):
            rest = mode_ranges([y for j, y in enumerate(every) if j != i]).get(mode)
            loo += bool(rest and rest["low"] <= x <= rest["high"])
        hits = total = 0
        lines += ["", f"Each run against the range of the other {len(every) - 1}: {loo}/{len(every)} = {loo / len(every):.0%} inside.",
                  "", "| set left out | runs | inside the range derived without it |", "|---|---|---|"]
        for name, rows in sets.items():
            rows = [(m, x) for m, x in rows if m in final[kind]]
            others = mode_ranges([x for other, rs in sets.items() if other != name for x in rs if x[0] in final[kind]])
            inside = [m in others and others[m]["low"] <= x <= others[m]["high"] for m, x in rows]  # no range: outside
            hits, total = hits + sum(inside), total + len(inside)
            lines.append(f"| {name} | {len(rows)} | {sum(inside)}/{len(rows)} |")
        lines += [f"| all | {total} | {hits}/{total} = {hits / total:.0%} |", ""]
    if write:
        RANGES.write_text(json.dumps({
            "_comment": "Measured / predicted peak spread of DPO, CPO, ORPO and GRPO runs on the CPU: an estimate's range "
                        "is [low, high] times it. Written by benchmarks/preference.py --ranges --write; see "
                        "benchmarks/results/preference.md.",
            "basis": "the lowest and highest measured / predicted of each mode over the CPU runs (mlx_lm_lora.train, "
                     "and --measure on runs chosen after the estimate was fixed); 'counted': with the logits buffers "
                     "counted on miniatures (mlxfit/measure/miniature.py), 'modes': with the fitted count",
            "modes": final["fitted"],
            "counted": final["counted"],
        }, indent=2) + "\n")
    return lines


# The public Mac runs of benchmarks/evidence/mac_preference_runs.csv whose settings are
# known well enough to estimate (source, catalog config it shares, 4-bit, mode, flags,
# width or longest prompt, logged peak in GB, what differs from mlx-lm-lora 5.10.2).
MAC_RUNS = [
    ("alokraj01/embedding_model_training, GRPO (peak per step, GiB)", "qwen/qwen2.5-3b-instruct", True, "grpo",
     {"batch_size": 4, "rl_group_size": 4, "max_completion_length": 256, "max_seq_length": 1024, "grad_checkpoint": True,
      "beta": 0.04, "num_layers": -1, "rank": 8, "scale": 10.0}, 511, (6.7 * 2 ** 30 / 1e9, 8.0 * 2 ** 30 / 1e9),
     "mlx-lm-lora 3.4.3 with --micro-batch-size 1 (one completion per backward; 5.10.2 scores a prompt batch at once); "
     "under a 28 GB memory limit and a 2 GB cache limit"),
    ("alokraj01/embedding_model_training, GRPO smoke test", "qwen/qwen2.5-3b-instruct", True, "grpo",
     {"batch_size": 4, "rl_group_size": 4, "max_completion_length": 52, "max_seq_length": 1024, "grad_checkpoint": False,
      "beta": 0.04, "num_layers": -1, "rank": 8, "scale": 10.0}, 287, (17.946, 17.946),
     "mlx-lm-lora 3.4.x; completions reached 52 of 256 tokens (estimated at 52); micro-batch 4 and no checkpointing inferred"),
    ("mlx-lm-lora examples/r1_full_pipeline.ipynb, GRPO", "qwen/qwen3-1.7b", True, "grpo",
     {"batch_size": 1, "rl_group_size": 2, "max_completion_length": 256, "max_seq_length": 512, "grad_checkpoint": True,
      "beta": 0.1, "num_layers": -1, "rank": 8, "scale": 10.0}, 256, (11.743, 11.743),
     "mlx-lm-lora 0.9.10; the author's comment, not a log; prompt length not stated (256 assumed); reference 4-bit"),
    ("ml-explore/mlx-examples#1209, DPO", "qwen/qwen2.5-0.5b-instruct", True, "dpo",
     {"batch_size": 1, "max_seq_length": 1024, "grad_checkpoint": True, "num_layers": 1}, (271, 541), (2.334, 2.334),
     "the fork before mlx-lm-lora (LoRA on attention); 541 tokens trained in the first step: the wider of the pair "
     "is 271 to 541 tokens"),
    ("ml-explore/mlx-examples#1210, ORPO", "qwen/qwen2.5-0.5b-instruct", True, "orpo",
     {"batch_size": 1, "max_seq_length": 1024, "grad_checkpoint": True, "num_layers": 1}, (271, 541), (1.347, 1.347),
     "the same fork and data (1.347 GB at its second step)"),
]


def mac() -> list[str]:
    from mlxfit.estimate.preference import estimate_run
    from mlxfit.model.preference import resolve_run
    from mlxfit.model.resolve import _from_config, catalog

    lines = ["| run | mode | logged GB | estimate GB (range) | error | inside | differs from mlx-lm-lora 5.10.2 |",
             "|---|---|---|---|---|---|---|"]
    for source, config_id, four_bit, mode, flags, width, (lo, hi), differs in MAC_RUNS:
        config = dict(catalog()[config_id][1])
        if four_bit:
            config["quantization"] = {"group_size": 64, "bits": 4}
        model = _from_config(config_id, "catalog", config)
        run = resolve_run(mode, dict(flags), {})
        shortest, longest = width if isinstance(width, tuple) else (width, width)
        ends = [estimate_run(model, run, "metal", prompt_length=w, miniatures=True) if mode == "grpo"
                else estimate_run(model, run, "metal", length=w, miniatures=True) for w in (shortest, longest)]
        p_lo, p_hi = ends[0].peak_bytes / 1e9, ends[1].peak_bytes / 1e9
        low, high = ends[0].range_bytes[0] / 1e9, ends[1].range_bytes[1] / 1e9
        # Zero error when the logged peak lies between the predictions at the row's bounds (as mac_evidence.py scores).
        err = 0.0 if p_lo <= hi and p_hi >= lo else (min(abs(p_lo - lo), abs(p_hi - hi), abs(p_lo - hi), abs(p_hi - lo))
                                                     * (1 if p_lo > hi else -1) / ((lo + hi) / 2) * 100)
        inside = low <= hi and high >= lo
        shown = f"{lo:.2f}" if lo == hi else f"{lo:.2f}–{hi:.2f}"
        predicted = f"{p_lo:.2f}" if p_lo == p_hi else f"{p_lo:.2f}–{p_hi:.2f}"
        lines.append(f"| {source} | {mode} | {shown} | {predicted} ({low:.2f}–{high:.2f}) | {err:+.0f}% | "
                     f"{'yes' if inside else 'no'} | {differs} |")
    return lines


def heldout_summary() -> str:
    rows = [rescore(json.loads(line)) for line in (RESULTS / "preference_heldout.jsonl").read_text().splitlines()]

    def summary(key):
        def err(r):
            return (r[key] - r["measured"]) / r["measured"] * 100

        parts = []
        for mode in ("dpo", "cpo", "orpo"):
            e = [err(r) for r in rows if r["mode"] == mode]
            parts.append(f"{mode.upper()} {statistics.median(abs(x) for x in e):.1f}% (from {min(e):+.1f}% to {max(e):+.1f}%)")
        return f"median |error| {statistics.median(abs(err(r)) for r in rows):.1f}%; " + ", ".join(parts)

    return (f"The estimate on them, logits buffers counted on miniatures: {summary('estimate')}. With the fitted "
            f"count instead: {summary('estimate_fitted')}.")


HELDOUT_TEXT = """## Held out, and each mode's range

`benchmarks/results/preference_heldout.jsonl`: 24 more runs measured after the estimate was fixed
(`--measure`, which agrees with `mlx_lm_lora.train` on the grid above): DPO, CPO and ORPO, with and
without checkpointing, at vocabularies of 8k and 16k on each model (llama-tied at 1 x 272 tokens,
qwen3 at 1 x 144). {summary}

From the slope of the peak over the vocabulary, the step holds float32-logits-sized buffers
(1 x T x V x 4 bytes) per chosen/rejected pair: DPO 9.5 (llama) and 13.5–15 (qwen3), CPO 5.0 and
5.0–7.5, ORPO 2.0 and 3.5; on llama the same with or without checkpointing, on qwen3 fewer with it.
The count follows depth, not the architecture: the same llama with 6 blocks instead of 8 holds 15
(DPO) and 7.5 (CPO), as qwen3's 6 blocks do, tied embeddings or not, at 144 or 272 tokens. The
mechanism is MLX's evaluation order (mlx/transforms.cpp eval_impl: the graph's tape is built
breadth-first, at most `MLX_BFS_MAX_WIDTH` = 20 arrays wide, then run in reverse), which interleaves
the chosen, rejected and reference passes differently at each depth. Measured on llama-tied at
1 x 144 (DPO, V 8k and 16k), the buffers held and the 8k peak:

| MLX_BFS_MAX_WIDTH | 6 blocks | 8 blocks |
|---|---|---|
| 1 (depth first) | 7.0 (83.7 MB) | 7.0 (97.4 MB) |
| 20 (MLX's default) | 15.0 (118.3 MB) | 9.5 (109.8 MB) |
| 200 | 15.0 (119.8 MB) | 13.5 (126.8 MB) |

A count fitted at one depth does not carry to another. The tape's order depends on the graph's
shape, not its sizes, so the estimate counts the buffers on a miniature of the model instead
(`mlxfit/measure/miniature.py`): the same model type, depth, adapted layers, mode and checkpointing,
every width shrunk (hidden 32, 128 tokens, batch 1: a weight row of the vocabulary is a quarter of a
logits row), mlx-lm-lora's own step run at vocabularies of
8k and 16k; the slope of its peak, less the weights that grow with the vocabulary, is the count.
On both grid models it gives the full-size counts above to within 0.01 (the "logits buffers"
column), and `tests/test_measure_miniature.py` checks it against the full-size model each run. Counted
this way for llama at other depths (DPO / CPO / ORPO, buffers per pair):

{depths}

Depth-first order held 29% less here (83.7 against 118.3 MB); whether `MLX_BFS_MAX_WIDTH=1` is
worth its cost in speed on a Mac is not measured.

`python benchmarks/preference.py --ranges --write` derives each mode's range (the lowest and highest
measured / predicted over all runs, for each of the two estimates) into `mlxfit/data/preference_ranges.json`; a preference
verdict is judged on it, and on Metal it is widened by the Mac SFT range (no public Mac run of these
modes was found that ran mlx-lm-lora 5.10.2):
"""

MAC_TEXT = """## Public Mac runs of these modes

`benchmarks/evidence/mac_preference_runs.csv` holds every public Mac run of these modes found with a
peak beside its settings (11 rows with their sources, two of them out-of-memory reports, three of
low trust). None ran mlx-lm-lora 5.10.2: they are an outside check of the estimate, not evidence it
was fitted on. `python benchmarks/preference.py --mac` estimates the five whose settings are known
(Metal, 4-bit bases as stored; a width known only within bounds is estimated at both, and scores
zero error when the logged peak lies between):
"""

MAC_AFTER = """The GRPO runs of older mlx-lm-lora versions differ in mechanism (3.4.3's micro-batches of one
completion; 0.9.10's rollout), so they say little about 5.10.2; they do say that a Mac GRPO run's
peak has varied by version by more than the range here."""


def estimate_for(name, mode, width, flags, folder: Path, counted: float | None = None, miniatures: bool = False):
    from mlxfit.estimate.preference import estimate_run
    from mlxfit.model.preference import resolve_run
    from mlxfit.model.resolve import resolve_model

    model = resolve_model(str(folder))
    run = resolve_run(mode, dict(flags), {})
    if mode == "grpo":
        return estimate_run(model, run, "cpu", prompt_length=width, miniatures=miniatures)
    return estimate_run(model, run, "cpu", length=width, counted=counted, miniatures=miniatures)


def rescore(r: dict, recount: bool = False) -> dict:
    """Both estimates of a recorded run: with its logits buffers counted on miniatures
    (recorded in the row as "logits_buffers"; `recount`: counted again) and with the
    fitted count. GRPO has one estimate."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps({**CONFIGS[r["config"]], **r.get("config_overrides", {})}))
        counted = None if recount else r.get("logits_buffers")
        e = estimate_for(r["config"], r["mode"], r["width"], r["flags"], Path(tmp), counted, miniatures=recount)
        fitted = estimate_for(r["config"], r["mode"], r["width"], r["flags"], Path(tmp))
    out = {**r, "estimate": e.peak_bytes, "estimate_fitted": fitted.peak_bytes, "phase": e.peak.name}
    if e.logits_buffers is not None:
        out["logits_buffers"] = e.logits_buffers
    return out


def row(r: dict) -> str:
    est = (r["estimate"] - r["real"]) / r["real"] * 100
    fit = (r.get("estimate_fitted", r["estimate"]) - r["real"]) / r["real"] * 100
    mea = (r["measured"] - r["real"]) / r["real"] * 100
    comp = ""
    if r["mode"] == "grpo":
        comp = f"{'/'.join(str(int(x)) for x in r['measured_completions'])} vs {'/'.join(str(int(x)) for x in r['real_completions'])}"
    count = f"{r['logits_buffers']:.2f}" if r.get("logits_buffers") is not None else "–"
    return (f"| {r['config']} | {r['mode']}{'' if r['compiled'] else ' (uncompiled)'} | {r['width']} | "
            f"{json.dumps(r['flags']).replace('|', '/')} | {r['real'] / 1e6:.1f} | {count} | {r['estimate'] / 1e6:.1f} | "
            f"{est:+.1f}% | {r.get('estimate_fitted', r['estimate']) / 1e6:.1f} | {fit:+.1f}% | "
            f"{r['measured'] / 1e6:.1f} | {mea:+.1f}% | {r['phase']} | {comp} |")


DEPTHS_FILE = RESULTS / "preference_depths.json"
DEPTHS_AT = (2, 3, 4, 6, 8, 10, 12, 16, 24, 32)


def count_depths() -> None:
    """The miniature's count for llama-tied-8k at other depths, into DEPTHS_FILE."""
    from mlxfit.measure.miniature import logits_buffers_many
    from mlxfit.model.preference import resolve_run
    from mlxfit.model.resolve import _from_config

    items, keys = [], []
    for n in DEPTHS_AT:
        model = _from_config(f"llama-tied-8k, {n} blocks", "local", {**CONFIGS[L8], "num_hidden_layers": n})
        for mode in ("dpo", "cpo", "orpo"):
            items.append((model, resolve_run(mode, {}, {}), 144))
            keys.append((n, mode))
    counts = logits_buffers_many(items, miniatures=True)
    table = {}
    for (n, mode), c in zip(keys, counts):
        table.setdefault(str(n), {})[mode] = c
    DEPTHS_FILE.write_text(json.dumps(table, indent=1) + "\n")


def depths_table() -> str:
    if not DEPTHS_FILE.exists():
        return "(not counted: python benchmarks/preference.py --depths)"
    table = json.loads(DEPTHS_FILE.read_text())
    head = "| blocks | " + " | ".join(table) + " |"
    lines = [head, "|---|" + "---|" * len(table)]
    for mode in ("dpo", "cpo", "orpo"):
        lines.append(f"| {mode.upper()} | " + " | ".join(f"{table[n][mode]:.1f}" for n in table) + " |")
    return "\n".join(lines)


def recount() -> None:
    """Count every recorded run's logits buffers on miniatures again, into its row."""
    for path in (RESULTS / "preference.jsonl", RESULTS / "preference_heldout.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for r in rows:
            n = rescore(r, recount=True).get("logits_buffers")
            if n is not None:
                r["logits_buffers"] = n
            print(r["config"], r["mode"], r["width"], json.dumps(r["flags"]), n, flush=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results/preference.md")
    p.add_argument("--json", help="also write the rows as JSON lines here (appended as they finish)")
    p.add_argument("--only", help="rows to run, e.g. 0-5 or 3,7")
    p.add_argument("--grid", help="a JSON file of [config, mode, words, flags] rows to run instead of GRID")
    p.add_argument("--rescore", help="recompute the estimates of the rows recorded in this JSON-lines file, run nothing")
    p.add_argument("--ranges", action="store_true", help="each mode's range from the recorded runs, cross-validated; run nothing")
    p.add_argument("--write", action="store_true", help="with --ranges: write mlxfit/data/preference_ranges.json")
    p.add_argument("--recount", action="store_true",
                   help="count each recorded run's logits buffers on miniatures again (needs mlx-lm-lora), into the JSON-lines "
                        "files; with --rescore, into the rescored rows")
    p.add_argument("--depths", action="store_true", help="count llama-tied-8k's logits buffers on miniatures at 2-32 blocks")
    p.add_argument("--mac", action="store_true", help="the estimate on the public Mac runs of these modes; run nothing")
    args = p.parse_args()
    if args.recount and not args.rescore:
        recount()
        return
    if args.depths:
        count_depths()
        return
    if args.mac:
        print("\n".join(mac()))
        return
    if args.ranges:
        print("\n".join(ranges(args.write)))
        return
    if args.rescore:
        # With --recount, each row's logits buffers are counted again on miniatures (the model as it is
        # now), and --json writes the rescored rows.
        results = [rescore(json.loads(line), recount=args.recount)
                   for line in Path(args.rescore).read_text().splitlines() if line.strip()]
        if args.json:
            Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in results))
        write(results, [row(r) for r in results], args.out)
        return
    grid = GRID
    if args.grid:
        grid = [tuple(x) for x in json.loads(Path(args.grid).read_text())]
    picks = range(len(grid))
    if args.only:
        picks = [i for part in args.only.split(",") for i in
                 (range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [int(part)])]
    results, lines = [], []
    for i in picks:
        name, mode, n, flags = grid[i]
        tic = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                r = one(name, mode, n, flags, Path(tmp))
            except Exception as ex:  # a failed run is a row, not the end of the table
                lines.append(f"| {name} | {mode} | {n} | {json.dumps(flags)} | failed: {str(ex)[:120]} | | | | | | |")
                print(lines[-1], flush=True)
                continue
        results.append(r)
        lines.append(row(r))
        print(lines[-1], f"{time.time() - tic:.0f}s", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    write(results, lines, args.out)


def write(results, lines, out) -> None:
    head = ["# DPO, CPO, ORPO, GRPO on the CPU: the estimate and --measure against mlx_lm_lora.train", "",
            "Produced by `benchmarks/preference.py` (mlx-lm-lora 5.10.2, mlx 0.32.4, mlx-lm 0.32.2; 2 shared cores).",
            "Each row: random weights saved as a model folder with a tiny BPE tokenizer, a train.jsonl, then",
            "(1) mlxfit's estimate at the widest batch mlx-lm-lora's own dataset classes build from that file,",
            "(2) `--measure` (mlxfit's child running mlx-lm-lora's trainer on synthesized batches of that width),",
            "(3) `mlx_lm_lora.train` itself, 3 iterations, its own reported `peak_memory` (mx.get_peak_memory,",
            "never reset: model loading included). mlx_lm_lora.train needs two changes on Linux, the same the",
            "child makes: `max_recommended_working_set_size` supplied to mx.device_info, and CPO with",
            "compilation off. Width: the chosen/rejected width (DPO, CPO, ORPO) or the longest prompt (GRPO).",
            "GRPO completions: the longest completion per step, --measure (forced to the full length) vs the",
            "real run (a random model may stop early).", "",
            "Logits buffers: B x T x V float32-sized buffers per row the step holds at its loss, counted on",
            "miniatures of the model (mlxfit/measure/miniature.py); the estimate uses them when mlx-lm-lora is",
            "installed, the fitted count otherwise (both shown).", "",
            "| config | mode | width | flags | mlx_lm_lora.train MB | logits buffers | estimate MB | error | "
            "fitted-count estimate MB | error | --measure MB | error | peak phase | GRPO completions |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    tail = [""]
    if results:
        est = [abs(r["estimate"] - r["real"]) / r["real"] * 100 for r in results]
        fit = [abs(r.get("estimate_fitted", r["estimate"]) - r["real"]) / r["real"] * 100 for r in results]
        mea = [abs(r["measured"] - r["real"]) / r["real"] * 100 for r in results]
        tail.append(f"{len(results)} runs. Estimate |error| against mlx_lm_lora.train: median {statistics.median(est):.1f}%, "
                    f"worst {max(est):.1f}% (with the fitted count: median {statistics.median(fit):.1f}%, worst "
                    f"{max(fit):.1f}%). --measure: median {statistics.median(mea):.1f}%, worst {max(mea):.1f}%.")
        for mode in ("dpo", "cpo", "orpo", "grpo", "lora_sft"):
            e = [x for x, r in zip(est, results) if r["mode"] == mode]
            if e:
                tail.append(f"- {mode}: {len(e)} runs, estimate median {statistics.median(e):.1f}%, worst {max(e):.1f}%")
    sections = ["", HELDOUT_TEXT.format(summary=heldout_summary(), depths=depths_table()), *ranges(write=False), "", MAC_TEXT, *mac(), "", MAC_AFTER]
    Path(out).write_text("\n".join(head + lines + tail + sections) + "\n")
    print("\n".join(tail))


if __name__ == "__main__":
    sys.exit(main())
