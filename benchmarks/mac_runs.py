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
- The step is compiled only from 2024-03-12 to 2024-03-24 and from 2025-03-25 on
  (COMPILED_STEP); "Peak mem" is in GiB before 2024-11-07 (GIB_PEAKS_UNTIL).
- The logged peak is never reset, so it belongs to the widest batch seen up to the
  report: where a row gives only a typical length, the run carries bounds on its
  longest example (`longest`), and the estimate is checked over those bounds.

`RUNS` is the reading, row by row, with why (the once-blind rows of mac_runs_unseen.csv
among them, but for `AT_ALLOCATOR_LIMIT`); `SKIPPED` names the rows that cannot be
reproduced and why. The numbers here are only inputs: benchmarks/mac_evidence.py fits
and cross-validates the Metal coefficients and writes benchmarks/results/mac_evidence.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from mlxfit.model.resolve import ModelInfo, resolve_model
from mlxfit.model.training import TrainingConfig

GB = 10**9
QV = ("self_attn.q_proj", "self_attn.v_proj")  # mlx-lm's default keys before 0.28.2
QKVO = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
ALL_LAYERS_BUG_UNTIL = "2025-02-20"
PAD32_FROM = "2025-03-27"
ALL_LINEAR_KEYS_FROM = "2025-09-30"
# mlx-lm's trainer printed "Peak mem ... GB" as mx.metal.get_peak_memory() / 2**30 from
# mlx-examples PR #528 (which added it: its own logs of 2024-03 too) to PR #1094 (2024-11-07,
# mlx-lm 0.20.0), and / 1e9 since (llms/mlx_lm/tuner/trainer.py).
GIB_PEAKS_UNTIL = "2024-11-07"
# mlx-lm compiled the training step (mx.compile with the state in and out) from mlx-examples PR #528
# (2024-03-12) until PR #608 took it out (2024-03-24), and again from mlx-lm PR #53 (2025-03-25).
COMPILED_STEP = (("2024-03-12", "2024-03-24"), ("2025-03-25", "9999"))


def compiled_step(date: str) -> bool:
    return any(start <= date < end for start, end in COMPILED_STEP)


TRUST_WEIGHT = {"high": 1.0, "medium": 0.5, "low": 0.25}
# A base converted with mlx_lm.convert -q's defaults (4 bits, group 64: '4.501 bits per weight').
CONVERT_Q4 = {"quantization": {"bits": 4, "group_size": 64}}
# The seven linears of a Llama block, given explicitly (a date before mlx-lm 0.28.2 would read q,v otherwise).
LLAMA_ALL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj")


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
    peak_gb: float  # the logged "Peak mem" (GiB before GIB_PEAKS_UNTIL, GB = 10^9 bytes after)
    rounding_gb: float  # half the precision the peak was reported with
    date: str  # ISO date; "2026" style where only the year is known
    mlx: str  # MLX version the run used (where unstated, the one current at its date; every public run
    # predates mlx 0.32.3, whose fused cross-entropy changes the GPU's loss)
    trust: str
    how: str  # how the settings were read
    backend: str = "metal"
    compiled: bool = True
    config: dict = field(default_factory=dict)  # overrides of the catalog config (dtype)
    file: str = "mac_runs.csv"  # the evidence file the row is in (benchmarks/evidence/), "user" for a contribution
    model_config: dict | None = None  # a contributed local model's config.json (it has no id to resolve)

    @property
    def kind(self) -> str:
        """What the run trains, for the ranges: a full fine-tune, DoRA, or LoRA with or
        without checkpointing (their errors differ in size and sign)."""
        from mlxfit.estimate.uncertainty import run_kind

        return run_kind(self.training.get("fine_tune_type", "lora"), bool(self.training.get("grad_checkpoint")))

    @property
    def logged_unit(self) -> int:
        """Bytes of the logged peak's "GB": the mlx-lm of the run's date printed GiB until 2024-11-07."""
        return 2**30 if self.file != "user" and self.date < GIB_PEAKS_UNTIL else 10**9

    @property
    def peak_bytes(self) -> float:
        return self.peak_gb * self.logged_unit

    @property
    def weight(self) -> float:
        return TRUST_WEIGHT[self.trust]

    @property
    def exact_length(self) -> bool:
        """The widest batch known to within 10% (a cap every batch reaches counts)."""
        lo, hi = self.lengths()
        return hi <= 1.1 * lo

    def model_info(self) -> ModelInfo:
        if self.model_config is not None:
            from mlxfit.model.resolve import _from_config

            return _from_config(self.model, "user", self.model_config)
        info = resolve_model(self.model)
        if self.config:
            from mlxfit.model.resolve import _from_config

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
        """Padded batch widths at the two bounds of the longest example (a contributed
        measurement's is the width itself: mlxfit measures batches of exactly that width)."""
        t = self.training_config()
        if self.file == "user":
            return tuple(min(n, t.max_seq_length) for n in self.longest)
        return tuple(padded_length(n, self.date, t.max_seq_length) for n in self.longest)


def _run(key, row, source, model, training, longest, peak_gb, rounding_gb, date, mlx, trust, how, **kw):
    if isinstance(longest, int):
        longest = (longest, longest)
    kw.setdefault("compiled", compiled_step(date))
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

ULTRASCALE = ("https://github.com/TheSwiftKnight/ultrascale-lab/blob/5a299888f139b3292813da800505f8b7ba18d316/"
              "reports/")
GEMMA4 = "mlx-community/gemma-4-e4b-it-4bit"
GEMMA4_HOW = ("mlx-lm 0.31.3 (mlx 0.31, unfused cross-entropy), rank 16, keys q,k,v,o: the last 18 of Gemma 4 E4B's 42 "
              "blocks share the KV of earlier ones and have no k/v projections, so only q and o are adapted there "
              "(2.56M adapter weights at 16 blocks, as the author measured); 30 iterations, seed 42")
GEMMA4_2048 = (1025, 2048)  # the cap-1024 run peaks lower and a cap of 4096 gives the cap-2048 peak: the widest row of
# the first 30 is in (1024, 2048]


def _gemma4(key, row, peak, *, batch=1, cap=2048, layers=16, ckpt=True, how=""):
    longest = GEMMA4_2048 if cap == 2048 else (cap + 1, 2581)  # over half the rows exceed 512 (median 848)
    return _run(key, row, "ultrascale-lab", GEMMA4,
                dict(batch_size=batch, num_layers=layers, rank=16, grad_checkpoint=ckpt, quantize=True,
                     lora_keys=QKVO, max_seq_length=cap),
                longest, peak, 0.0005, "2026-06-01", "0.31.2", "high", GEMMA4_HOW + how,
                file="mac_runs_2026.csv")


RUNS_2026: tuple[Run, ...] = (
    _gemma4("gemma4-ckpt-off", 0, 11.375, ckpt=False, how="; checkpointing off, cap 2048"),
    _gemma4("gemma4-ckpt-on", 1, 7.911, how="; checkpointing on, cap 2048"),
    _gemma4("gemma4-cap512", 2, 5.927, cap=512, how="; every batch 512 wide (capped)"),
    _gemma4("gemma4-cap1024", 3, 7.294, cap=1024, how="; every batch capped at 1024"),
    _gemma4("gemma4-b2", 4, 7.256, batch=2, cap=512, how="; batch 2 x 512"),
    _gemma4("gemma4-b4", 5, 9.672, batch=4, cap=512, how="; batch 4 x 512"),
    _gemma4("gemma4-b8", 6, 14.563, batch=8, cap=512, how="; batch 8 x 512"),
    _gemma4("gemma4-4-layers", 7, 7.81, layers=4, how="; 4 blocks (all KV-shared: q and o only)"),
    _gemma4("gemma4-all-layers", 8, 8.236, layers=-1, how="; all 42 blocks"),
    _run("qwen3-1.7b-ckpt-2048", 9, "code-index 65861638066", "mlx-community/Qwen3-1.7B-bf16",
         dict(batch_size=4, num_layers=16, grad_checkpoint=True), 2048, 15.905, 0.0005, "2026-07-01", "0.31", "high",
         "every linear adapted (4.981M at rank 8, verified), checkpointing, a truncation warning (2313 -> 2048) makes "
         "the widest batch 2048; unfused cross-entropy", file="mac_runs_2026.csv"),
    _run("qwen3-1.7b-all-545", 10, "rayw-lab/MAformac", "mlx-community/Qwen3-1.7B-bf16",
         dict(batch_size=4, num_layers=-1, rank=16, scale=32.0, grad_accumulation_steps=4, max_seq_length=1024),
         (481, 523), 12.280, 0.0005, "2026-06-21", "0.31.1", "medium",
         "all 28 blocks, every linear at rank 16, gradient accumulation 4, not checkpointed; the longest row is 523 "
         "tokens and the peak stops rising at iteration 110 (flat to 600), so the widest batch is close to it",
         file="mac_runs_2026.csv"),
    _run("qwen3-1.7b-all-preflight", 11, "rayw-lab/MAformac", "mlx-community/Qwen3-1.7B-bf16",
         dict(batch_size=4, num_layers=-1, rank=16, scale=32.0, grad_accumulation_steps=4, max_seq_length=1024),
         (32, 523), 3.602, 0.0005, "2026-06-21", "0.31.1", "medium",
         "the same config for one iteration (no optimizer update); its one batch's width is unknown",
         file="mac_runs_2026.csv"),
)

FOUND = "mac_runs_found.csv"
MISTRAL = "mistralai/Mistral-7B-Instruct-v0.3"  # v0.3 base and instruct share the architecture (vocabulary 32768)
# Run 02 of the same conversion peaks at 8.839 GB, below the 14.5 GB of its weights in bfloat16: the converted
# ./mlx_model is quantized (mlx-lm prints the unquantized parameter count, 7248M, either way); 4 bits, group 64
# (mlx_lm.convert -q's defaults) read.
MISTRAL_4BIT = LLAMA_4BIT = CONVERT_Q4
MISTRAL_HOW = "; the conversion read as 4-bit (Run 02's 8.839 GB is below bfloat16 weights)"
RUNS_FOUND: tuple[Run, ...] = (
    _run("mistral7b-8-layers-2048", 0, "code-index 7373479517", MISTRAL,
         dict(quantize=True, batch_size=4, num_layers=8), 2048, 26.190, 0.0005, "2025-06-01", "0.26", "medium",
         "keys q,v (0.852M verified: before 0.28.2), 8 blocks, a truncation warning before the iteration-10 report "
         "makes the widest batch 2048; 15 validation batches at iteration 1" + MISTRAL_HOW, config=MISTRAL_4BIT, file=FOUND),
    _run("mistral7b-8-layers", 1, "code-index 7373479517", MISTRAL,
         dict(quantize=True, batch_size=4, num_layers=8), (261, 2048), 8.839, 0.0005, "2025-06-01", "0.26", "medium",
         "the peak of the first 110 batches (~261 tokens per row, no truncation warning: every row <= 2048)",
         config=MISTRAL_4BIT, file=FOUND),
    _run("mistral7b-16-layers", 2, "code-index 7373479517", MISTRAL,
         dict(quantize=True, batch_size=4, num_layers=16), (261, 2048), 12.478, 0.0005, "2025-06-01", "0.26", "medium",
         "the same batches as the 8-block run, 16 blocks", config=MISTRAL_4BIT, file=FOUND),
    _run("qwen2.5-3b-cpt", 3, "code-index 57375542890", "mlx-community/Qwen2.5-3B-Instruct-4bit",
         dict(batch_size=1, num_layers=8, quantize=True), (1126, 2048), 7.224, 0.0005, "2026-08-06", "0.31", "medium",
         "every linear (3.326M verified); 3378 tokens in 3 iterations of batch 1 (book chunks, several truncated to "
         "2048), so the longest row is 1126-2048 tokens; MLX version not stated (read as unfused)", file=FOUND),
    _run("qwen2.5-3b-ift", 4, "code-index 57375542890", "mlx-community/Qwen2.5-3B-Instruct-4bit",
         dict(batch_size=1, num_layers=16, quantize=True), (541, 2048), 5.528, 0.0005, "2026-08-06", "0.31", "medium",
         "every linear at 16 blocks (6.652M verified); 1622 tokens in 3 iterations, no truncation warning",
         file=FOUND),
    _run("gemma2-2b-b2", 5, "code-index 69014109280", "mlx-community/gemma-2-2b-it-4bit",
         dict(batch_size=2, num_layers=16, quantize=True), (110, 2048), 4.394, 0.0005, "2026-01-01", "0.30", "medium",
         "every linear (6.390M verified), batch 2 of a small repeated set (~109 tokens per row)", file=FOUND),
    _run("gemma3-4b-pt-b2", 6, "code-index 56270308142", "google/gemma-3-4b-it",
         dict(batch_size=2, num_layers=8), (868, 2048), 25.933, 0.0005, "2026-01-01", "0.30", "low",
         "gemma-3-4b-pt converted with --q-bits 4 --q-group-size 64 but without -q, which mlx_lm.convert needs to "
         "quantize (convert.py: `if quantize:`): a bfloat16 model, the -it text model's architecture; batch 2, 8 "
         "blocks, keys read as every linear; ~868 tokens per row by iteration 399 and rows over 2048 truncated",
         file=FOUND),
    _run("qwen2.5-0.5b-4-layers", 7, "code-index 21315096210", "Qwen/Qwen2.5-0.5B-Instruct",
         dict(batch_size=1, num_layers=4), (70, 2048), 1.740, 0.0005, "2025-06-01", "0.26", "low",
         "batch 1, 4 blocks, ~70 tokens per row (short identity pairs); date and keys not stated (q,v read)",
         file=FOUND),
    *(
        _run(key, row, "code-index 53568198657", "meta-llama/Llama-3.1-8B-Instruct",
             dict(quantize=True, batch_size=batch, num_layers=16, rank=rank, grad_checkpoint=ckpt, max_seq_length=cap),
             longest, peak, 0.05, "2026-02-28", "0.30", trust,
             "Llama 3.1 8B Instruct in 4 bits (group 64), every linear (2026), a project log's rounded peak; " + how,
             config=LLAMA_4BIT, file=FOUND)
        for key, row, batch, rank, ckpt, cap, longest, peak, trust, how in (
            ("llama3.1-8b-b1-1024-ckpt", 8, 1, 8, True, 1024, (1000, 1024), 6.4, "medium",
             "~1000 tokens per iteration at batch 1: rows reach the 1024 cap"),
            ("llama3.1-8b-b1-2048-ckpt-r16", 9, 1, 16, True, 2048, (1025, 2048), 7.8, "low",
             "the same rows at cap 2048 (~1000 tokens on average, the widest 1025-2048)"),
            ("llama3.1-8b-b4-2048", 10, 4, 8, False, 2048, (1025, 2048), 62.4, "low",
             "batch 4, not checkpointed, the peak by iteration 10-20 (it crashed at 20 with a command-buffer error)"),
            ("llama3.1-8b-b2-2048-ckpt", 11, 2, 8, True, 2048, (1025, 2048), 10.6, "low",
             "batch 2, checkpointed, the peak by iteration 70 (a command-buffer timeout ended it)"),
        )
    ),
    _run("qwen2.5-1.5b-fp16-b4", 12, "code-index 70546580339", "Qwen/Qwen2.5-1.5B-Instruct",
         dict(batch_size=4, num_layers=16, rank=16), (32, 2048), 6.7, 0.05, "2026-01-01", "0.30", "low",
         "converted to float16, batch 4, rank 16, 16 blocks, every linear; row lengths not stated (short replies)",
         config={"torch_dtype": "float16"}, file=FOUND),
    # Found in the 2026-12 search (docs/accuracy.md), added before they were predicted.
    _run("qwen2.5-7b-qv-2048-ckpt", 13, "code-index 69429495693", "mlx-community/Qwen2.5-7B-Instruct-4bit",
         dict(batch_size=1, num_layers=16, rank=16, scale=2.0, grad_checkpoint=True, quantize=True, lora_keys=QV),
         (2000, 2048), 7.84, 0.005, "2026-08-26", "0.31", "high",
         "keys q,v and rank 16 stated, 16 blocks, checkpointed; every row <= 2048 and two head-truncated to fit it, so "
         "the widest batch is 2000-2048 (one epoch of 5,736 rows)", file=FOUND),
    *(
        _run(key, row, "code-index 56132696383", "mlx-community/Qwen3-4B-4bit",
             dict(batch_size=1, num_layers=8, grad_checkpoint=True, quantize=True, max_seq_length=cap),
             longest, peak, 0.005, "2026-06-12", "0.31", trust,
             "Qwen3-4B-Instruct-2507 in 4 bits (the Qwen3-4B architecture), mlx-lm 0.31.3, 8 blocks, every linear, "
             "checkpointed; " + how, file=FOUND)
        for key, row, cap, longest, peak, trust, how in (
            ("qwen3-4b-2507-2048", 14, 2048, 2048, 5.45, "high", "rows with 2,159-2,567-token prompts truncated to 2048"),
            ("qwen3-4b-2507-3072", 15, 3072, (2160, 3072), 6.86, "medium",
             "cap 3072 with longer rows dropped and the 2,159+-token ones kept: the widest 2160-3072"),
        )
    ),
    *(
        _run(key, row, "code-index 61705476032", "mlx-community/Qwen2.5-3B-Instruct-4bit",
             dict(batch_size=1, num_layers=16, rank=8, grad_checkpoint=True, quantize=True),
             longest, peak, rounding, "2026-08-15", "0.31", "medium",
             "16 blocks, every linear (112 lora_b tensors), rank 8, checkpointed, on an 8 GB M1; " + how, file=FOUND)
        for key, row, longest, peak, rounding, how in (
            ("qwen2.5-3b-16-layers-trunc", 16, 2048, 4.606, 0.0005,
             "the smoke run of the earlier config, its iteration-10 peak after a truncation warning (2610 -> 2048)"),
            ("qwen2.5-3b-16-layers", 17, (513, 2048), 4.70, 0.005,
             "the main run: 621 rows checked to fit 2048, 91.9% over 512 tokens"),
        )
    ),
)

# Mistral-7B-Instruct-v0.2 is v0.3's architecture with a 32,000-word vocabulary.
MISTRAL_V02_4BIT = {**CONVERT_Q4, "vocab_size": 32000}


UNSEEN = "mac_runs_unseen.csv"


def _unseen(key, row, source, model, training, longest, peak_gb, rounding_gb, date, mlx, trust, how, **kw):
    return _run(key, row, source, model, training, longest, peak_gb, rounding_gb, date, mlx, trust, how,
                file=UNSEEN, **kw)


# One Run per row of mac_runs_unseen.csv (row = its 0-based data row), read as its log states; what
# is inferred is in the row's `inferred` column. Scored blind once (docs/accuracy.md), fitted since.
RUNS_UNSEEN: tuple[Run, ...] = (
    _unseen("qwen3-8b-8bit-32-layers", 0, "code-index 53634803270", "mlx-community/Qwen3-8B-8bit",
         dict(batch_size=4, num_layers=32, quantize=True), (241, 2048), 14.808, 0.0005, "2026-04-30", "0.31", "low",
         "32 blocks, every linear (19.399M); batch 4 read; ~241 tokens per row, the longest up to 2048"),
    _unseen("phi3-mini-o-proj-iter10", 1, "code-index 21545102", "microsoft/Phi-3-mini-4k-instruct",
         dict(batch_size=4, num_layers=32, rank=16, scale=20.0, dropout=0.1, grad_checkpoint=True,
              lora_keys=("self_attn.o_proj",)), (151, 2048), 8.924, 0.0005, "2025-08-18", "0.26", "medium",
         "o_proj alone at rank 16 in 32 blocks (3,145,728), checkpointed; ~151 tokens per row by iteration 10"),
    _unseen("phi3-mini-o-proj-iter30", 2, "code-index 21545102", "microsoft/Phi-3-mini-4k-instruct",
         dict(batch_size=4, num_layers=32, rank=16, scale=20.0, dropout=0.1, grad_checkpoint=True,
              lora_keys=("self_attn.o_proj",)), (200, 2048), 11.472, 0.0005, "2025-08-18", "0.26", "medium",
         "the same run's peak at iteration 30"),
    _unseen("mistral7b-v0.2-uniform-210", 3, "code-index 24377332848", MISTRAL,
         dict(batch_size=4, num_layers=-1, quantize=True, lora_keys=QV), (210, 230), 13.351, 0.0005, "2025-02-23",
         "0.23", "medium", "every block adapted (3.408M), q,v; every row 210 tokens (840 a step throughout)",
         config=MISTRAL_V02_4BIT),
    _unseen("mistral7b-v0.2-attempt2", 4, "code-index 24377332848", MISTRAL,
         dict(batch_size=4, num_layers=-1, quantize=True, lora_keys=QV), (65, 2048), 9.553, 0.0005, "2025-02-23",
         "0.23", "low", "~65 tokens per row, the longest unknown", config=MISTRAL_V02_4BIT),
    _unseen("mistral7b-v0.2-attempt3", 5, "code-index 24377332848", MISTRAL,
         dict(batch_size=4, num_layers=-1, quantize=True, lora_keys=QV), (50, 2048), 11.668, 0.0005, "2025-02-23",
         "0.23", "low", "~50 tokens per row; the peak after the validation pass at 200", config=MISTRAL_V02_4BIT),
    _unseen("qwen2.5-7b-4bit-ckpt-b4", 6, "code-index 54206609662", "mlx-community/Qwen2.5-7B-Instruct-4bit",
         dict(batch_size=4, num_layers=16, grad_checkpoint=True, quantize=True), (236, 2048), 12.247, 0.0005,
         "2025-10-01", "0.29", "medium", "every linear (11.534M), checkpointed; answers ~235 tokens, prompts unknown"),
    _unseen("phi4-mini-reasoning-qkv-b4", 7, "code-index 8782186796", "microsoft/Phi-4-mini-instruct",
         dict(batch_size=4, num_layers=16, lora_keys=("self_attn.qkv_proj",)), (597, 2048), 28.763, 0.0005,
         "2025-06-01", "0.26", "medium", "qkv_proj alone (1.049M), mlx-lm's defaults; ~597 tokens per row"),
    _unseen("rlt-7b-4bit-smoke", 8, "code-index 62161699056", "mlx-community/Qwen2.5-7B-Instruct-4bit",
         dict(batch_size=1, num_layers=4, quantize=True, max_seq_length=512), (129, 512), 5.378, 0.0005,
         "2026-01-01", "0.30", "medium", "one step and one validation batch, the row 129-512 tokens"),
    _unseen("qwen2.5-1.5b-4bit-b1-ckpt", 9, "code-index 59607076791", "mlx-community/Qwen2.5-1.5B-Instruct-4bit",
         dict(batch_size=1, num_layers=16, grad_checkpoint=True, quantize=True), (1400, 2048), 3.49, 0.005,
         "2026-01-01", "0.30", "medium", "~1400-token prompts, checkpointed, batch 1"),
    _unseen("qwen2.5-1.5b-4bit-b2-ckpt", 10, "code-index 59607076791", "mlx-community/Qwen2.5-1.5B-Instruct-4bit",
         dict(batch_size=2, num_layers=16, grad_checkpoint=True, quantize=True), (1400, 2048), 5.6, 0.05,
         "2026-01-01", "0.30", "medium", "the same at batch 2"),
    _unseen("phi4-mini-4bit-b1-8-layers-ckpt", 11, "code-index 10464844662", "mlx-community/Phi-4-mini-instruct-4bit",
         dict(batch_size=1, num_layers=8, grad_checkpoint=True, quantize=True), (32, 2048), 3.7, 0.05, "2026-02-19",
         "0.30", "low", "8 blocks, batch 1, checkpointed; row lengths unknown"),
    # Found in a second search (issues), read and committed before they were scored.
    _unseen("llama3.1-8b-bf16-8192-oct", 12, "mlx-examples#1076", "meta-llama/Llama-3.1-8B-Instruct",
         dict(batch_size=1, num_layers=32, rank=32, dropout=0.05, max_seq_length=8192, lora_keys=LLAMA_ALL),
         8192, 121.550, 0.0005, "2024-10-30", "0.19", "medium",
         "every linear at rank 32 in 32 blocks (83.886M), batch 1; a row truncated to 8192 before the report"),
    _unseen("llama3.1-8b-bf16-8192-sep", 13, "mlx-examples#1076", "meta-llama/Llama-3.1-8B-Instruct",
         dict(batch_size=1, num_layers=32, rank=32, dropout=0.05, max_seq_length=8192, lora_keys=LLAMA_ALL),
         8192, 121.504, 0.0005, "2024-09-20", "0.18", "medium", "the same settings a month earlier (19453 -> 8192)"),
    _unseen("llama3-8b-bf16-rank128-iter10", 14, "mlx-examples#724", "meta-llama/Meta-Llama-3-8B-Instruct",
         dict(batch_size=1, num_layers=32, rank=128, max_seq_length=8096, lora_keys=LLAMA_ALL),
         (457, 8096), 28.349, 0.0005, "2024-04-28", "0.11", "low",
         "every linear at rank 128 in 32 blocks (335.544M), batch 1; ~457 tokens per row, the longest up to 8096"),
)

# Peaks at the Metal allocator's limit: MetalAllocator::malloc (mlx 0.18-0.19) refuses a buffer while
# active + cached + asked >= block_limit (0.95 x the memory: 130.56e9 bytes on 128 GB) and waits for
# running work to free some, so a run that asks for more is held just under it. Both logged 130.5e9
# bytes on a 128 GB M3 Max: their peaks say where the allocator stopped them, not what they asked.
# Read after they were scored (docs/accuracy.md); not fitted.
AT_ALLOCATOR_LIMIT = {
    "llama3.1-8b-bf16-8192-oct": "logged 130.51e9 bytes (121.55 GiB) on a 128 GB Mac, at the Metal allocator's "
                                 "limit (0.95 x the memory, 130.56e9): the peak is where the allocator held it",
    "llama3.1-8b-bf16-8192-sep": "the same run a month earlier, 130.46e9 bytes: at the same limit",
}

RUNS = RUNS + RUNS_2026 + RUNS_FOUND + tuple(r for r in RUNS_UNSEEN if r.key not in AT_ALLOCATOR_LIMIT)

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
           config={"torch_dtype": "float32", **CONVERT_Q4}),
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
           config=CONVERT_Q4),
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


def user_runs(path) -> tuple[list[Run], dict[int, str]]:
    """The runs of a file written by `mlxfit calibration --export` (mlxfit/estimate/export.py),
    and the rows that cannot be reproduced, with why."""
    import csv
    import json
    from pathlib import Path

    from mlxfit.model.training import TrainingConfig

    runs, skipped = [], {}
    name = Path(path).name
    fields = {f for f in TrainingConfig.__dataclass_fields__}
    for i, row in enumerate(csv.DictReader(open(path, newline=""))):
        if row.get("backend") not in ("metal", "cuda"):
            skipped[i] = f"measured on the {row.get('backend') or 'unknown'} backend, not a GPU"
            continue
        if row.get("slice") == "yes":
            skipped[i] = "extrapolated from slices of the model, not a whole run's peak"
            continue
        config = json.loads(row["config"]) if row.get("config") else None
        if row["model_id"].startswith("local ") and config is None:
            skipped[i] = "a local model stored without its config.json (measured before mlxfit kept it)"
            continue
        training = {k: v for k, v in json.loads(row["training"]).items() if k in fields}
        width = int(row["widest_batch"])
        training["max_seq_length"] = max(training.get("max_seq_length", width), width)
        runs.append(_run(f"user {name}:{i}", i, f"user {name}", row["model_id"], training, width + 0, float(row["peak_gb"]),
                         0.0005, row["date"], row.get("mlx_version") or None, row.get("trust") or "high",
                         f"mlxfit --measure on {row.get('chip') or 'a Mac'} ({row.get('memory_gb') or '?'} GB), "
                         f"mlx {row.get('mlx_version')}, mlx-lm {row.get('mlx_lm_version')}",
                         backend=row["backend"], file="user", model_config=config))
    return runs, skipped


def with_length(run: Run, longest: int) -> Run:
    return replace(run, longest=(longest, longest))


def run_runtime(run: Run):
    from mlxfit.runtime import Runtime, parse_version

    return Runtime.of_versions(run.backend, parse_version(run.mlx) if run.mlx else None, run.compiled)


def run_features(run: Run) -> list[tuple[dict, TrainingConfig]]:
    """The backend's features of the run at both bounds of its longest example."""
    from mlxfit.estimate.detailed import backend_features, features

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
    from mlxfit.estimate.detailed import coefficients as shipped, combine

    c = coefficients if coefficients is not None else shipped()[run.backend]
    feats = feats if feats is not None else run_features(run)
    lo, hi = (combine(f, c, t, run.backend).peak_bytes for f, t in feats)
    return min(lo, hi), max(lo, hi)


def oom_plan(oom: OomRun):
    """mlxfit's plan for an out-of-memory run at its machine's --memory, with the
    run's own settings and MLX version."""
    from mlxfit.machine import build_machine
    from mlxfit.estimate.plan import make_plan

    run = oom.as_run()
    model, training = run.model_info(), run.training_config()
    machine = build_machine(None, memory=int(oom.machine_gb * GB))
    return make_plan(machine, model, training, backend="metal", length=run.lengths()[1], runtime=run_runtime(run))
