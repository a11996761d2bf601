"""The public Mac runs, reproduced with their own settings, and what they say about the estimate.

benchmarks/evidence/mac_runs.csv and mac_oom_reports.csv (copied from the shared
evidence folder; its README explains them) hold public mlx-lm fine-tuning runs on
Apple silicon with their logged peaks, and runs that ran out of memory. This
module reads each row the way its mlx-lm of the time ran it:

- LoRA keys: q_proj and v_proj only before mlx-lm 0.28.2 (2025-09-30, PR #515);
  every linear of the adapted blocks after (TrainingConfig.lora_keys).
- mlx-lm before 2025-02-20 adapted every block for any positive --num-layers.
- Padding: 8 * ceil(longest / 8) before 2025-03-27, 1 + 32 * ceil(longest / 32)
  after, capped at max_seq_length; the model sees one token less.
- The cross-entropy is fused on the GPU from mlx 0.32.3; every public run is older
  (mlxfit/runtime.py).
- The logged peak is never reset, so it belongs to the widest batch seen up to the
  report: where a row gives only a typical length, the run carries bounds on its
  longest example (`longest`), and the estimate is checked over those bounds.

`RUNS` is the reading, row by row, with why; `SKIPPED` names the rows that cannot be
reproduced and why. The numbers here are only inputs: benchmarks/mac_evidence.py fits
and cross-validates the Metal coefficients and writes benchmarks/results/mac_evidence.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ..model.resolve import ModelInfo, resolve_model
from ..model.training import TrainingConfig

GB = 10**9
QV = ("self_attn.q_proj", "self_attn.v_proj")  # mlx-lm's default keys before 0.28.2
QKVO = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
ALL_LAYERS_BUG_UNTIL = "2025-02-20"
PAD32_FROM = "2025-03-27"
ALL_LINEAR_KEYS_FROM = "2025-09-30"
TRUST_WEIGHT = {"high": 1.0, "medium": 0.5, "low": 0.25}


def padded_length(longest: int, date: str, max_seq_length: int) -> int:
    """mlx_lm/tuner/trainer.py iterate_batches: the width of a batch whose longest
    example has `longest` tokens, by the padding rule of the run's date."""
    if date >= PAD32_FROM:
        width = 1 + 32 * math.ceil(longest / 32)
    else:
        width = 8 * math.ceil(longest / 8)
    return min(width, max_seq_length)


@dataclass(frozen=True)
class Run:
    key: str
    row: int  # data row of mac_runs.csv (0-based), or of mac_oom_reports.csv for an OomRun
    source: str  # left out together in cross-validation
    model: str  # catalog id or an mlx-community name the catalog resolves
    training: dict  # TrainingConfig fields as the user gave them
    longest: tuple[int, int]  # bounds on the longest example of the widest batch up to the report
    peak_gb: float  # logged mx.get_peak_memory() / 1e9
    rounding_gb: float  # half the precision the peak was reported with
    date: str  # ISO date; "2026" style where only the year is known
    mlx: str  # MLX version the run used (where unstated, the one current at its date; every public run
    # predates mlx 0.32.3, whose fused cross-entropy changes the GPU's loss)
    trust: str
    how: str  # how the settings were read
    backend: str = "metal"
    compiled: bool = True
    config: dict = field(default_factory=dict)  # overrides of the catalog config (dtype)

    @property
    def weight(self) -> float:
        return TRUST_WEIGHT[self.trust]

    @property
    def exact_length(self) -> bool:
        lo, hi = self.longest
        return hi <= 1.1 * lo

    def model_info(self) -> ModelInfo:
        info = resolve_model(self.model)
        if self.config:
            from ..model.resolve import _from_config

            info = _from_config(info.id, info.source, {**info.config, **self.config})
        return info

    def training_config(self) -> TrainingConfig:
        """The run's TrainingConfig as its mlx-lm applied it."""
        t = dict(self.training)
        full = t.get("fine_tune_type") == "full"
        if not full and self.date < ALL_LAYERS_BUG_UNTIL:
            t["num_layers"] = -1
        if not full and "lora_keys" not in t and self.date < ALL_LINEAR_KEYS_FROM:
            t["lora_keys"] = QV
        return TrainingConfig(**t)

    def lengths(self) -> tuple[int, int]:
        """Padded batch widths at the two bounds of the longest example."""
        t = self.training_config()
        return tuple(padded_length(n, self.date, t.max_seq_length) for n in self.longest)


def _run(key, row, source, model, training, longest, peak_gb, rounding_gb, date, mlx, trust, how, **kw):
    if isinstance(longest, int):
        longest = (longest, longest)
    return Run(key, row, source, model, training, longest, peak_gb, rounding_gb, date, mlx, trust, how, **kw)


BLOG = "blog 42730325402"
BLOG_SHORT = (230, 2048)  # ~230 tokens per iteration at batch 1; the widest batch is unknown, up to max_seq_length
BLOG_HOW = ("mlx-lm ~0.26 (2025-07): LoRA keys q,v (the blog says so), 1 + 32k padding, unfused cross-entropy; "
            "batch 1 of a short chat set (~230 tokens per iteration), the longest example bounded by max_seq_length")

RUNS: tuple[Run, ...] = (
    _run("pr53-pre", 0, "mlx-lm#53", "meta-llama/Llama-3.2-1B-Instruct",
         dict(batch_size=4, num_layers=16), (2022, 2048), 47.302, 0.0005, "2025-03-25", "0.24", "high",
         "80880 tokens in 10 iterations at batch 4: ~2022 tokens per example, near-uniform, so the widest batch is "
         "2022-2048 tokens; multiple-of-8 padding; keys q,v; the step not compiled (the PR's baseline)",
         compiled=False),
    _run("pr53-post", 1, "mlx-lm#53", "meta-llama/Llama-3.2-1B-Instruct",
         dict(batch_size=4, num_layers=16), (2022, 2048), 40.508, 0.0005, "2025-03-25", "0.24", "high",
         "the same run with the whole step compiled (PR #53)"),
    _run("mlx-examples#528", 2, "mlx-examples#528", "mistralai/Mistral-7B-v0.1",
         dict(batch_size=4, num_layers=16), (100, 512), 17.383, 0.0005, "2024-03-04", "0.6", "low",
         "model not named: the LoRA example's Mistral-7B in float16 assumed (the size fits); ~100 tokens per example "
         "(4000 tokens / 10 iterations / batch 4), longest bounded at 512; mlx-lm of the time adapted every block; "
         "not compiled (the PR's baseline)",
         compiled=False, config={"torch_dtype": "float16"}),
    _run("mlx-examples#891", 3, "mlx-examples#891", "mlx-community/Meta-Llama-3-8B-Instruct-4bit",
         dict(fine_tune_type="dora", batch_size=4, num_layers=1), (350, 2048), 17.474, 0.0005, "2024-07-16", "0.16",
         "medium",
         "QDoRA on a 4-bit Llama 3 8B; the peak at iteration 10 (it rises to 21.2 and 26.7 GB as longer batches come); "
         "~1000-1400 tokens per iteration at batch 4, so the longest example is 350 tokens or more, up to "
         "max_seq_length; mlx-lm of the time adapted every block whatever --num-layers said"),
    _run("mlx-lm#1206", 5, "mlx-lm#1206", "mlx-community/Qwen3-4B-4bit",
         dict(batch_size=4, num_layers=16, grad_checkpoint=True, quantize=True), (32, 2048), 7.9, 0.05,
         "2026-08-30", "0.32.1", "high",
         "the control run: every linear adapted (mlx-lm 0.31.3), checkpointing, unfused cross-entropy (mlx 0.32.1); "
         "NL-to-PromQL pairs of unstated length, bounded by max_seq_length"),
    _run("mlx-lm#1206-short", 5, "mlx-lm#1206", "mlx-community/Qwen3-4B-4bit",
         dict(batch_size=4, num_layers=16, grad_checkpoint=True, quantize=True), (32, 2048), 3.8, 0.05,
         "2026-08-30", "0.32.1", "high", "the shorter-prompt variant of the same recipe"),
    _run("blog-qwen3-1.7b-full", 7, BLOG, "Qwen/Qwen3-1.7B",
         dict(fine_tune_type="full", batch_size=1, num_layers=16), BLOG_SHORT, 9.2, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-qwen3-1.7b-dora", 8, BLOG, "Qwen/Qwen3-1.7B",
         dict(fine_tune_type="dora", batch_size=1, num_layers=4), BLOG_SHORT, 3.8, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-qwen3-4b-full", 9, BLOG, "Qwen/Qwen3-4B",
         dict(fine_tune_type="full", batch_size=1, num_layers=16), BLOG_SHORT, 16.5, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW + "; the peak at 100 iterations (200 ran out of memory)"),
    _run("blog-qwen3-4b-dora-4", 10, BLOG, "Qwen/Qwen3-4B",
         dict(fine_tune_type="dora", batch_size=1, num_layers=4), BLOG_SHORT, 8.5, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-qwen3-4b-dora-24", 10, BLOG, "Qwen/Qwen3-4B",
         dict(fine_tune_type="dora", batch_size=1, num_layers=24), BLOG_SHORT, 9.0, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-llama-1b-full", 12, BLOG, "meta-llama/Llama-3.2-1B-Instruct",
         dict(fine_tune_type="full", batch_size=1, num_layers=16), BLOG_SHORT, 9.7, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-llama-1b-dora", 13, BLOG, "meta-llama/Llama-3.2-1B-Instruct",
         dict(fine_tune_type="dora", batch_size=1, num_layers=4), BLOG_SHORT, 2.8, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW),
    _run("blog-llama-3b-full", 14, BLOG, "meta-llama/Llama-3.2-3B-Instruct",
         dict(fine_tune_type="full", batch_size=1, num_layers=16), BLOG_SHORT, 15.0, 0.05, "2025-07-31", "0.26",
         "medium", BLOG_HOW + "; the peak at 100 iterations (200 ran out of memory)"),
    *(
        _run(f"blog-llama-3b-dora-{n}", 15, BLOG, "meta-llama/Llama-3.2-3B-Instruct",
             dict(fine_tune_type="dora", batch_size=1, num_layers=n), BLOG_SHORT, 7.0, 0.5, "2025-07-31", "0.26",
             "medium", BLOG_HOW + "; reported as 7 GB for all four layer counts (1-GB rounding)")
        for n in (4, 8, 16, 24)
    ),
    _run("code-index-57967534697", 16, "code-index 57967534697", "Qwen/Qwen2.5-3B-Instruct",
         dict(batch_size=2, num_layers=16, grad_checkpoint=True), (32, 2048), 10.7, 0.05, "2026-01-01", "0.30", "low",
         "variant unspecified: the bf16 instruct model assumed; every linear adapted (2026); lengths unknown, bounded "
         "by max_seq_length 2048"),
    _run("code-index-56819573627", 17, "code-index 56819573627", "mlx-community/Qwen2.5-7B-Instruct-4bit",
         dict(batch_size=4, num_layers=16, quantize=True, lora_keys=QKVO), (32, 2048), 12.1, 0.05, "2026-01-01", "0.30",
         "low",
         "keys q,k,v,o as stated; 16 blocks inferred from the 2.88M trainable weights (16 x 180,224 at rank 8); "
         "batch not stated (mlx-lm's default 4), lengths unknown up to max_seq_length"),
    _run("code-index-55764734646", 18, "code-index 55764734646", "mlx-community/Qwen2.5-Coder-7B-Instruct-4bit",
         dict(batch_size=4, num_layers=16, quantize=True), (32, 2048), 6.2, 0.05, "2026-06-24", "0.31", "low",
         "mlx-lm's defaults (batch 4, 16 blocks, rank 8, every linear); 72 short code examples of unknown length"),
    _run("code-index-58528548818", 19, "code-index 58528548818", "mlx-community/Qwen2.5-7B-Instruct-4bit",
         dict(batch_size=1, num_layers=2, quantize=True), (238, 476), 5.143, 0.0005, "2026-01-01", "0.31", "low",
         "2 blocks inferred from 1.442M trainable weights (2 x 720,896, every linear at rank 8); 476 tokens in 2 "
         "iterations read as batch 1 with the longer example 238-476 tokens"),
    _run("mlx-lm#330", 21, "mlx-lm#330", "meta-llama/Llama-3.2-3B-Instruct",
         dict(batch_size=4, num_layers=16), (80, 512), 10.588, 0.0005, "2025-07-25", "0.26", "medium",
         "NVIDIA A100 under MLX's CUDA backend, not a Mac: WikiSQL (~80 tokens per example), the settled peak from "
         "iteration 20 on; keys q,v (before 0.28.2)", backend="cuda"),
)

SKIPPED = {
    4: "mlx#3539: Qwen3.5 (qwen3_5, Gated DeltaNet hybrid): its recurrence terms are measured on the CPU "
       "(benchmarks/accuracy.py), not fitted on Macs, and the 8 records' lengths are not stated; its run at 1024 "
       "tokens is an out-of-memory report (OOM_RUNS)",
    6: "mlx-lm#1185: Qwen3.5-27B's batch and lengths are not in the excerpt",
    11: "blog Qwen3-8B QDoRA: the base's bits are unknown and no quantized base reaches the logged 17 GB with "
        "short data (a bf16 base would, but that is not the run described)",
    20: "mlx#3993: the model is not named (the command is truncated)",
}


@dataclass(frozen=True)
class OomRun:
    """A run that ran out of memory on a machine of known size, reproduced like Run."""

    key: str
    row: int
    model: str
    training: dict
    longest: int
    machine_gb: float
    date: str
    mlx: str | None
    how: str
    config: dict = field(default_factory=dict)

    def as_run(self) -> Run:
        return _run(self.key, self.row, self.key, self.model, self.training, self.longest, 0.0, 0.0, self.date,
                    self.mlx, "medium", self.how, config=self.config)


OOM_RUNS: tuple[OomRun, ...] = (
    OomRun("mlx-examples#481", 0, "mlx-community/Mistral-7B-v0.1-4bit",
           dict(batch_size=2, num_layers=16, quantize=True, max_seq_length=4096), 4096, 64, "2024-02-23", "0.4",
           "the lora.py example of the time (Mistral-7B, 4-bit: 1242.56M stored parameters) at batch 2; it warned "
           "about, but did not truncate, sequences over 2048 tokens: the longest is read as 4096"),
    OomRun("mlx-examples#1091", 2, "mistralai/Mistral-Nemo-Instruct-2407",
           dict(batch_size=4, num_layers=20, rank=32, quantize=True, lora_keys=QKVO), 2048, 32, "2024-11-04", "0.19",
           "a 4-bit Mistral-Nemo with float32 scales (and so float32 activations) at batch 4, rank 32, keys q,k,v,o; "
           "lengths unknown (its validation took 8634 s): the default max_seq_length 2048",
           config={"torch_dtype": "float32", "quantization": {"bits": 4, "group_size": 64}}),
    OomRun("blog-qwen3-4b-full-200", 8, "Qwen/Qwen3-4B",
           dict(fine_tune_type="full", batch_size=1, num_layers=16), 2048, 24, "2025-07-31", "0.26",
           "ran out of memory within 200 iterations, after peaking at 16.5 GB by iteration 100: a longer batch, up "
           "to max_seq_length"),
    OomRun("blog-llama-3b-full-200", 8, "meta-llama/Llama-3.2-3B-Instruct",
           dict(fine_tune_type="full", batch_size=1, num_layers=16), 2048, 24, "2025-07-31", "0.26",
           "as above, after 15 GB by iteration 100"),
    OomRun("mlx#3539", 4, "Qwen/Qwen3.5-4B",
           dict(batch_size=1, num_layers=4, grad_checkpoint=True, quantize=True, max_seq_length=1024), 1024, 36,
           "2026-05-13", "0.31.2",
           "mlx-community/Qwen3.5-4B-MLX-4bit (4-bit, group 64) at --max-seq-length 1024, checkpointed: out of memory "
           "(over 32 GB) in the backward pass; the same run at 512 logged 10.92 GB. Gated delta's T^2 backward",
           config={"quantization": {"bits": 4, "group_size": 64}}),
    OomRun("code-index-57967534697", 9, "Qwen/Qwen2.5-3B-Instruct",
           dict(batch_size=2, num_layers=16, grad_checkpoint=True), 2048, 16, "2026-01-01", "0.30",
           "ran out only with an inference server beside it (10.7 GB + 4 GB system + 11 GB swap); checked at "
           "max_seq_length 2048"),
)

OOM_SKIPPED = {
    1: "mlx-examples#600: the machine's memory is not stated",
    3: "mlx-examples#664: batch, length and layers are not stated (its own logged 27.4 GB already exceeds the "
       "24 GB budget of a 32 GB Mac)",
    5: "mlx-lm#1206: the lengths are not stated (short NL->PromQL pairs), and the run fails at the first backward "
       "pass whatever the settings",
    6: "mlx-lm#1185: the error is a buffer count (iogpu.rsrc_limit), not bytes; batch and lengths not in the excerpt",
    7: "mlx-lm#828: the model and settings are not stated",
    10: "mlx#3993: the machine's memory is not stated; the symptom is the allocator cache, not the peak",
}


def with_length(run: Run, longest: int) -> Run:
    return replace(run, longest=(longest, longest))


def run_runtime(run: Run):
    from ..runtime import Runtime, parse_version

    return Runtime.of_versions(run.backend, parse_version(run.mlx) if run.mlx else None, run.compiled)


def run_features(run: Run) -> list[tuple[dict, TrainingConfig]]:
    """The backend's features of the run at both bounds of its longest example."""
    from .detailed import backend_features, features

    model, training, runtime = run.model_info(), run.training_config(), run_runtime(run)
    if model.quantized and training.fine_tune_type != "full":
        training = replace(training, quantize=True)  # as mlxfit.estimate.plan.make_plan does
    out = []
    for length in run.lengths():
        f = backend_features(features(model, training, length), run.backend, runtime, model.architecture.head_dim)
        out.append((f, training))
    return out


def predicted(run: Run, coefficients: dict | None = None, feats=None) -> tuple[int, int]:
    """The estimate at the two bounds of the run's longest example, in bytes."""
    from .detailed import coefficients as shipped, combine

    c = coefficients if coefficients is not None else shipped()[run.backend]
    feats = feats if feats is not None else run_features(run)
    lo, hi = (combine(f, c, t, run.backend).peak_bytes for f, t in feats)
    return min(lo, hi), max(lo, hi)


def oom_plan(oom: OomRun):
    """mlxfit's plan for an out-of-memory run at its machine's --memory, with the
    run's own settings and MLX version."""
    from ..machine import build_machine
    from .plan import make_plan

    run = oom.as_run()
    model, training = run.model_info(), run.training_config()
    machine = build_machine(None, memory=int(oom.machine_gb * GB))
    return make_plan(machine, model, training, backend="metal", length=run.lengths()[1], runtime=run_runtime(run))
