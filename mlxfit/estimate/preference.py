"""The peak of a DPO, CPO, ORPO or GRPO run with mlx-lm-lora, phase by phase.

Built on the SFT estimate (mlxfit/estimate/detailed.py) from the lazily built model:
each phase of a step is an SFT-shaped forward and backward with the batch and
length that phase feeds the policy, plus what the mode holds beside it. What the
trainers do (mlx_lm_lora/trainer/, version 5.10.2):

- dpo_trainer.py, cpo_trainer.py, orpo_trainer.py: the chosen and the rejected
  batch (each B x N, padded to the longer of the two) go through the policy in one
  differentiated function, so both sequences' activations are kept for the
  backward pass: the policy step is an SFT step of 2B sequences. DPO and CPO cast
  the logits to float32 before the cross-entropy (get_token_scores), so the logits
  kept for the backward are 4 bytes an element whatever the model's dtype. CPO's
  compiled step fails on mlx 0.32.4, so it runs, and is estimated, uncompiled (the
  `uncompiled` term; on the CPU measured by benchmarks/uncompiled.py).
- How many batch x length x vocabulary buffers that step holds at its loss follows
  MLX's breadth-first evaluation order, so it is counted by running the step on a
  miniature of the model (mlxfit/measure/miniature.py); without one (no
  mlx-lm-lora, a chunked run, a miniature that failed) a fitted count stands in,
  judged on a wider range.
- DPO's reference model (train.py load_reference_model: a second, frozen copy of
  --model unless --reference-model-path names another) scores both sequences
  inside the same step (no gradient): its weights are resident, its forward adds
  float32 logits of one sequence.
- --efficient-long-context (seq_step_size 512): sequences longer than 512 tokens
  are scored and differentiated in 512-token chunks with a KV cache.
- grpo_trainer.py: the rollout generates group_size completions per prompt with
  mlx-lm's BatchGenerator, completion_batch_size=batch_size: at most B sequences
  hold a KV cache at once, each up to prompt + max_completion_length tokens (the
  cache grows in steps of 256). The scoring step then runs microbatches of B
  completions (_grpo_microbatches, chunk size len(prompts)), each an SFT step of
  B sequences of bucket_sequence_length(prompt + completion) tokens, evaluated
  before the next; its logits are not mlx's cross-entropy but a float32
  log-softmax of the completion positions only (grpo_scoring_logits), the
  reference's forward beside it when beta != 0; the gradients of earlier
  microbatches are summed and kept. group_size sets the number of microbatches,
  not their size.
- --load-in-Nbits (utils.py from_pretrained, train.py run()): the policy loads at
  full precision and is quantized lazily, the reference loads beside it: a loading
  phase, the full-precision weights in GRPO's first rollout, and an untied head's
  full-precision weight where it is alive at the first step's peak (lazy_head_bytes).
  --train-type full on such a base trains only what nn.quantize leaves unfrozen
  (unquantized_trainable), and its blocks keep what the norms' backward needs
  (full_on_quantized.py, counted per buffer); its logits are counted on a miniature
  quantized the same way (mlxfit/measure/miniature.py miniature_run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..measure.miniature import logits_buffers, logits_buffers_many
from ..model.preference import EFFICIENT_STEP, PreferenceRun
from ..model.resolve import ModelInfo
from .detailed import Breakdown, counted_totals, dtype_bytes
from .phases import Phase, Phased
from .reference import reference_bytes
from .trained_outside_blocks import outside_blocks, trains_every_parameter, vocabulary_training
from .verdict import Verdict

KV_STEP = 256  # mlx_lm/models/cache.py KVCache.step: the cache grows in these
DEFAULT_PROMPT = 256  # GRPO without --data or --prompt-length: an assumed prompt, said so


def bucket_sequence_length(length: int, alignment: int = 64) -> int:
    """mlx_lm_lora/trainer/online_rl_utils.py bucket_sequence_length (pinned by a test)."""
    if length < 128:
        return length
    rounded = ((length + alignment - 1) // alignment) * alignment
    padding = rounded - length
    return rounded if padding <= max(16, length // 8) else length


@dataclass(frozen=True)
class PreferenceEstimate(Phased):
    run: PreferenceRun
    backend: str
    phases: tuple[Phase, ...]
    length: int  # tokens per sequence in the policy step (GRPO: prompt + completion)
    prompt_length: int | None = None
    prompt_assumed: bool = False
    logits_buffers: float | None = None  # counted on a miniature (mlxfit/measure/miniature.py); None: fitted

    @property
    def range_bytes(self) -> tuple[int, int]:
        """The peak's range on this mode's evidence (mlxfit/estimate/uncertainty.py)."""
        return self.run.spec.evidence_range(self.peak_bytes, self.backend, counted=self.logits_buffers is not None)

    def to_dict(self) -> dict:
        return {
            "train_mode": self.run.mode,
            "backend": self.backend,
            "predicted_peak_bytes": self.peak_bytes,
            "predicted_range_bytes": list(self.range_bytes),
            "peak_phase": self.peak.name,
            "length": self.length,
            "prompt_length": self.prompt_length,
            "prompt_assumed": self.prompt_assumed,
            "logits_buffers_counted": self.logits_buffers,
            "phases": [{"name": p.name, "bytes": p.bytes, "breakdown": dict(p.parts)} for p in self.phases],
        }


def _resident(sft: Breakdown) -> dict:
    keep = ("weights (frozen)", "weights (trainable)", "optimizer state", "framework", "calibration")
    return {k: v for k, v in sft.parts.items() if k in keep and v}


def _step(sft: Breakdown) -> dict:
    keep = ("weights (frozen)", "weights (trainable)", "optimizer state", "framework", "calibration")
    return {k: v for k, v in sft.parts.items() if k not in keep and v}


def kv_cache_bytes(model: ModelInfo, sequences: int, tokens: int) -> int:
    """mlx-lm's KV cache of `sequences` sequences grown to `tokens` (in KV_STEP steps)."""
    arch, s = model.architecture, dtype_bytes(model)
    grown = math.ceil(tokens / KV_STEP) * KV_STEP
    per_token = sum(2 * b.kv_heads * b.head_dim for b in arch.blocks if b.heads)
    return sequences * grown * per_token * s


def estimate_run(model: ModelInfo, run: PreferenceRun, backend: str = "cpu", length: int | None = None,
                 reference: ModelInfo | None = None, prompt_length: int | None = None,
                 count_new: bool = True, counted: float | None = None, *,
                 miniatures: bool = False) -> PreferenceEstimate:
    """`length`: the widest batch (DPO/CPO/ORPO: padded chosen/rejected width) from
    --data, else max_seq_length. GRPO: `prompt_length` the longest prompt.
    `miniatures`: whether the logits buffers may be counted on a miniature of the model
    (mlxfit/measure/miniature.py: shipped, remembered, or counted in a child process);
    False, the fitted count and no child. `count_new` False: no miniature is run, a count
    is used only if already known. `counted`: the logits buffers as a miniature counted
    them before (benchmarks)."""
    t, s = run.training, dtype_bytes(model)
    V = model.architecture.vocab_size
    ref = reference_bytes(model, run, reference)
    if run.spec.rollout:
        return _grpo(model, run, backend, ref, prompt_length)
    if run.spec.step_is_mlx_lm:
        return estimate_lora_sft(model, run, backend, length)
    L = t.batch_width(length)
    chunked = run.efficient_long_context and L > EFFICIENT_STEP
    step_len = EFFICIENT_STEP if chunked else L
    B = t.batch_size
    T = max(step_len - 1, 1)
    count = counted if counted is not None else logits_buffers(model, run, L, count_new, miniatures=miniatures)
    if count is not None:
        # Counted on a miniature of the model (mlxfit/measure/miniature.py): every
        # B x T x V buffer the step holds at its loss, the reference's included.
        sft = _sft(model, replace(t, batch_size=2 * B), backend, step_len, logits=lambda f: 0,
                   kept_logits=int(count * B * T * V * 4), compiled=run.compiled, passes=2)
    elif not run.spec.float32_scores:
        # Measured (benchmarks/results/preference.md): ORPO's two cross-entropies run
        # their backward one sequence at a time: the SFT logits term at B, plus the
        # other sequence's logits, kept.
        sft = _sft(model, replace(t, batch_size=2 * B), backend, step_len, logits=lambda f: f / 2, kept_logits=B * T * V * s,
                   passes=2)
    else:
        # DPO and CPO: get_token_scores casts the logits to float32 before the
        # cross-entropy; measured, both sequences' logits work at once (the SFT
        # logits term at 2B, in float32).
        sft = _sft(model, replace(t, batch_size=2 * B), backend, step_len, logits=lambda f: f * 4 / s,
                   compiled=run.compiled, passes=2)
    resident = _resident(sft)
    if ref:
        resident["reference copy"] = ref
    step = _step(sft)
    if "dora temporaries" in step:
        # dora.py __call__ builds each adapted weight per forward call: the chosen
        # and the rejected pass build their own (an SFT step of 2B builds one).
        step["dora temporaries"] *= 2
    if ref and count is None:
        # The reference's logits and their float32 copy, one sequence at a time (no gradient).
        step["reference scoring"] = B * T * V * (s + 4)
    if chunked:
        caches = kv_cache_bytes(model, 2 * B, L) * (2 if ref else 1)
        step["KV cache (chunks of 512)"] = caches
    name = f"policy step: chosen + rejected, {2 * B} x {step_len} tokens" + (f" (chunks of {L})" if chunked else "")
    if run.spec.lazy_head_at_peak and lazy_head_bytes(model, run):
        step[LAZY_HEAD] = lazy_head_bytes(model, run)
    phases = (*loading_phase(model, run, resident), Phase(name, {**resident, **step}))
    return PreferenceEstimate(run, backend, phases, L, logits_buffers=count)


LAZY_HEAD = "full-precision head (quantized lazily)"
FULL_PRECISION = "weights at full precision (quantized at the first step)"


def lazy_head_bytes(model: ModelInfo, run: PreferenceRun) -> int:
    """mlx_lm_lora/utils.py from_pretrained loads the model evaluated at full precision,
    then quantizes it with --load-in-Nbits (nn.quantize: lazy mx.quantize of each weight):
    a full-precision weight is freed only when the first step's graph evaluates its
    quantization, just before the weight's first use. An untied output head is used last
    in the forward pass, so its full-precision weight (vocabulary x hidden) can still be
    alive at that step's peak. Measured on real mlx_lm_lora.train runs (qwen3 of width 384,
    vocabulary 32k, float32, 4 blocks, the head 50.3 MB; tests/test_preference.py), the
    first step's peak less that of the same run with the model evaluated after loading:
    SFT +51.1 MB, DPO +51.7 MB (the whole head: the modes whose `lazy_head_at_peak` is
    set), ORPO +28.9 MB (its peak falls partly after the head is quantized; counted
    whole, it reads up to the difference high), CPO +3.0 MB (uncompiled: its peak comes
    after the head's quantization; not counted), GRPO: the rollout quantizes every
    weight before the scoring step (loading_phase's rollout). A tied head is the
    embedding, quantized first: +0 to +6 MB on a tied llama, not counted."""
    t = run.training
    if not t.quantize or model.quantized or model.architecture.tied_embeddings:
        return 0
    return model.architecture.vocab_size * model.architecture.hidden_size * dtype_bytes(model)


def full_precision_bytes(model: ModelInfo, run: PreferenceRun) -> int:
    """The policy's weights as mlx_lm.load evaluates them, before --load-in-Nbits quantizes
    them (0 where the run does not quantize at load)."""
    t = run.training
    if not t.quantize or model.quantized:
        return 0
    from .detailed import weight_bytes

    return weight_bytes(model, replace(t, quantize=False, quantized_frozen=False))


def loading_phase(model: ModelInfo, run: PreferenceRun, resident: dict) -> tuple[Phase, ...]:
    """train.py run(): from_pretrained (the policy at full precision, its quantization
    lazy), then load_reference_model (a second full-precision copy) while the policy's
    full-precision weights are still alive: both, until the first step quantizes the
    policy. mlx-lm-lora never resets the peak, so this phase counts toward the one it
    reports. None where nothing is quantized at load."""
    full = full_precision_bytes(model, run)
    if not full:
        return ()
    parts = {FULL_PRECISION: full, **{k: v for k, v in resident.items()
                                      if k not in ("weights (frozen)", "optimizer state", "calibration")}}
    words = " and the reference" if "reference copy" in resident else ""
    return (Phase(f"loading: the policy at full precision{words}, before its quantization", parts),)


def estimate_lora_sft(model: ModelInfo, run: PreferenceRun, backend: str = "cpu", length: int | None = None) -> PreferenceEstimate:
    """mlx-lm-lora's own SFT (sft_trainer.py train_sft): its step is mlx-lm's (default_loss,
    the whole step under mx.compile, the same batch padding), so it is the SFT estimate."""
    t = run.training
    L = t.batch_width(length)
    sft = _sft(model, t, backend, L)
    parts = dict(sft.parts)
    if run.spec.lazy_head_at_peak and lazy_head_bytes(model, run):
        parts[LAZY_HEAD] = lazy_head_bytes(model, run)
    phase = Phase(f"training step: {t.batch_size} x {L} tokens", parts)
    return PreferenceEstimate(run, backend, (*loading_phase(model, run, _resident(sft)), phase), L)


def _sft(model: ModelInfo, training, backend: str, length: int, logits=lambda f: f, kept_logits: int = 0,
         fused_cross_entropy: bool | None = None, compiled: bool = True, passes: int = 1,
         accumulated: bool = False) -> Breakdown:
    """detailed.estimate with the logits term changed: `logits` maps the SFT logits
    bytes (what the fitted logits coefficient scales), `kept_logits` adds bytes at
    the loss; `fused_cross_entropy` False where the mode computes its own log-softmax;
    `compiled` False where the mode's step runs without mx.compile (CPO); `passes`: the
    forward passes through the policy in one differentiated function (chosen and rejected: 2);
    `accumulated` where the gradients of earlier microbatches are kept beside the step (GRPO)."""
    from ..runtime import Runtime
    from .detailed import backend_features, coefficients, combine, features

    runtime = Runtime.current(backend)
    frozen_quantized = training.fine_tune_type == "full" and (training.quantize or model.quantized)
    every = trains_every_parameter(model, training)
    if every:
        # Every block trains whatever --num-layers says; the embedding, head and norm are added after.
        training = replace(training, num_layers=-1)
    if frozen_quantized:
        # Sized as a run with nothing adapted (every block's backward still runs), then
        # what is really trainable put in (unquantized_trainable).
        trainable = unquantized_trainable(model, training)
        training = replace(training, fine_tune_type="lora", num_layers=-1, quantized_frozen=False)
    if fused_cross_entropy is not None:
        runtime = replace(runtime, fused_cross_entropy=fused_cross_entropy)
    if not compiled:
        runtime = replace(runtime, compiled_step=False)
    f = backend_features(features(model, training, length), backend, runtime, model.architecture.head_dim)
    c = coefficients()[backend]
    key = "logits_fused_bytes" if f.get("logits_fused_bytes") else "logits_bytes"
    coef = c.get("logits_fused" if key == "logits_fused_bytes" else "logits", 0.0) or 1.0
    f = {**f, key: int(logits(f[key]) + kept_logits / coef)}
    if frozen_quantized:
        from .detailed import optimizer_state_elements
        from .full_on_quantized import kept_bytes, working_bytes

        # What the blocks keep when only their norms train, counted per buffer
        # (full_on_quantized.py), in place of a LoRA run's fitted activations; in a
        # single-pass step (SFT), the working set of the block being differentiated on
        # top: measured on SFT steps, where it is alive with the logits' gradient. The
        # paired modes (their peak at the loss of two passes, counted on a miniature) and
        # GRPO's microbatches read within 5% without it, and 6-13% high with it.
        batch = training.batch_size // training.hosts
        kept, probs = kept_bytes(model, batch, f["tokens"], training.grad_checkpoint)
        if passes == 1 and not accumulated:
            kept += working_bytes(model, batch, f["tokens"])
        f.update(act_h_bytes=kept / c["act_h"], act_qkv_bytes=0, act_inter_bytes=0, scores_bytes=probs / c["scores"])
        trainable_bytes = sum(math.prod(shape) * size for shape, size in trainable)
        f.update(trainable_elements=sum(math.prod(shape) for shape, _ in trainable), trainable_bytes=trainable_bytes,
                 optimizer_bytes=sum(optimizer_state_elements(training.optimizer, [shape]) * size
                                     for shape, size in trainable),
                 base_bytes=f["base_bytes"] - trainable_bytes, adapter_act_bytes=0, dora_act_bytes=0)
    sft = combine(f, c, training, backend)
    if every:
        sft = _with_outside_trained(sft, f, c, model, training, passes, compiled, accumulated)
    return sft


OUTSIDE_GRADIENTS = "gradients (embedding, head, final norm)"
OUTSIDE_UPDATE = "update of the embedding, head, final norm"
ACCUMULATED = "accumulated gradients"


def outside_update_bytes(model: ModelInfo, training, passes: int, compiled: bool, accumulated: bool = False) -> int:
    """What the update of the embedding, head and final norm holds in flight, beside the
    blocks' (detailed.update_in_flight_bytes, measured on blocks of many small arrays).
    Each is one array updated whole. Compiled (mx.compile over the step and the update),
    a matrix used k times in the forward pass holds its k gradient contributions and
    their sum (a compiled add does not sum in place: two lookups' gradients of one matrix
    peak at 3 of its size, pinned in tests/test_preference.py), then its new optimizer
    state and new weight; the matrices are updated one after another, so the largest such
    matrix is the peak. k is the number of passes (chosen and rejected are two), twice
    that for a tied embedding (its lookup's gradient, a scatter into a matrix of its
    size, and its use as the head). Measured as the slope of a compiled step's peak over
    the vocabulary, less the resident weights and Adam state, in matrices: tied llama ORPO
    7.45 (counted 8; bfloat16 and float32, 4 to 8 blocks), untied 5.6 (counted 6).
    Uncompiled (CPO), the update's elementwise steps reuse their inputs' buffers: the
    gradient contributions only (real runs: 1.8-2.2x per matrix). `accumulated` (GRPO:
    the update, uncompiled, applies the summed gradients of its microbatches, whose
    contributions are summed already): the optimizer's cap on the matrices
    (detailed.UPDATE_IN_FLIGHT: 2.2x for Adam) and one contribution per further use."""
    from .detailed import UPDATE_IN_FLIGHT, optimizer_state_elements

    if not vocabulary_training(model, training)[0]:
        return 0
    arrays = outside_blocks(model)
    tied = model.architecture.tied_embeddings
    uses = passes * (2 if tied else 1)
    total = sum(math.prod(shape) * size for shape, size in arrays)
    if accumulated:
        return int((UPDATE_IN_FLIGHT[training.optimizer][2] + uses - 1) * total)
    if not compiled:
        return uses * total

    def in_flight(shape, size):
        n = math.prod(shape)
        if len(shape) < 2:
            return (1 + optimizer_state_elements(training.optimizer, [shape]) / n + 1) * n * size
        state = optimizer_state_elements(training.optimizer, [shape]) / n
        return (uses + (uses > 1) + state + 1) * n * size

    return int(max(in_flight(shape, size) for shape, size in arrays))


def _with_outside_trained(sft: Breakdown, f: dict, c: dict, model: ModelInfo, training, passes: int,
                          compiled: bool, accumulated: bool = False) -> Breakdown:
    """The SFT breakdown (every block trained, as detailed.py counts a full fine-tune) with
    the embedding, head and final norm trained too: their weights move from frozen to
    trainable and their optimizer state is resident; the step's peak is then the larger
    of its loss or block moment with their gradients alive, and the update with theirs in
    flight beside the blocks'. `accumulated`: the summed gradients of earlier microbatches
    (GRPO) are alive at the loss and block moments; at the update they are the gradients."""
    from .detailed import MOMENTS, moment_parts, update_in_flight_bytes

    weights, state, gradients = vocabulary_training(model, training)
    parts = dict(sft.parts)
    moved = min(weights, parts.get("weights (frozen)", 0))
    resident = {"weights (frozen)": parts.get("weights (frozen)", 0) - moved,
                "weights (trainable)": parts.get("weights (trainable)", 0) + moved,
                "optimizer state": parts.get("optimizer state", 0) + state, "framework": parts.get("framework", 0)}
    moments = moment_parts(f, c)
    step = max((moments[m] for m in MOMENTS), key=lambda m: sum(m.values()))
    blocks = update_in_flight_bytes(training.optimizer, f["trainable_bytes"], f["trained_blocks"])
    update = {"gradients": min(blocks, f["trainable_bytes"]), "update temporaries": max(blocks - f["trainable_bytes"], 0),
              OUTSIDE_UPDATE: outside_update_bytes(model, training, passes, compiled, accumulated)}
    at_step = {**step, OUTSIDE_GRADIENTS: gradients}
    if accumulated:
        at_step[ACCUMULATED] = resident["weights (trainable)"]
    chosen = max((at_step, update), key=lambda m: sum(m.values()))
    zeroed = dict.fromkeys((k for k in parts if k not in resident), 0)
    return replace(sft, parts={**zeroed, **resident, **chosen},
                   features={**sft.features, "phase": "update" if chosen is update else sft.features.get("phase")})


def unquantized_trainable(model: ModelInfo, training) -> tuple:
    """((shape, itemsize), ...) of what mlx-lm-lora's full fine-tune trains on a quantized
    base: from_pretrained freezes nothing without a LoRA config, and nn.quantize's
    QuantizedLinear / QuantizedEmbedding freeze their own weight, scales and biases when
    built (mlx/nn/layers/quantized.py; from_linear sets a Linear's bias after that, so it
    stays trainable): the norms, the biases and any layer left unquantized, in every block
    whatever --num-layers says (pinned against mlx-lm-lora in tests/test_preference.py)."""
    from ..model import lazy_model
    from .detailed import _qlora_bits

    bits, group = _qlora_bits(model, replace(training, quantized_frozen=True))
    base = lazy_model.model_for_key(model.config_key, bits, group)
    return tuple((tuple(a.shape), a.dtype.size) for name, a in lazy_model.block_arrays(base, None)
                 if not name.endswith((".scales", ".biases")) and not mx_integer(a))


def mx_integer(a) -> bool:
    """A packed quantized weight (uint32)."""
    import mlx.core as mx

    return mx.issubdtype(a.dtype, mx.integer)


def grpo_scoring_logits(B: int, T: int, scored: int, V: int, s: int) -> int:
    """The vocabulary-sized bytes one GRPO microbatch holds per scoring model at its
    peak (grpo_trainer.py _get_token_logps: the model's B x T x V logits, then the
    compiled _select_token_logps over the `scored` positions in float32: the masked
    cast, its max-shift and exp, and the gradient). Measured on the CPU as the slope of
    the scoring step's peak over the vocabulary (tests/test_preference.py), in
    B x V units: T x s + 3 x scored x 4 per model in float32, and half a T x s more in
    a half-precision model (the logits' gradient, cast back and padded to T, is not
    written in place). The reference's forward, when beta is not 0, holds as many
    again: the microbatch's graph is evaluated at once, both forwards side by side.
    Not mlx's cross-entropy, so not the fused one on the GPU."""
    return B * V * (T * s * (1 if s >= 4 else 1.5) + 3 * scored * 4)


def _grpo(model: ModelInfo, run: PreferenceRun, backend: str, ref: int, prompt_length: int | None) -> PreferenceEstimate:
    t, s = run.training, dtype_bytes(model)
    V = model.architecture.vocab_size
    assumed = prompt_length is None
    P = min(prompt_length or DEFAULT_PROMPT, t.max_seq_length)  # prompts are cut to max_seq_length
    C = run.max_completion_length
    B = t.batch_size
    width = max(2, bucket_sequence_length(P + C))
    T = width - 1
    scored = max(min(width - P, T), 1)  # grpo_loss: logits[:, start:], start = the prompt's length - 1
    scoring = grpo_scoring_logits(B, T, scored, V, s)
    accumulated = run.group_size > 1
    sft = _sft(model, replace(t, max_seq_length=max(width, t.max_seq_length)), backend, width,
               logits=lambda f: 0, kept_logits=scoring, fused_cross_entropy=False, accumulated=accumulated)
    resident = _resident(sft)
    if ref:
        resident["reference copy"] = ref
    rollout = {
        **resident,
        "rollout KV cache": kv_cache_bytes(model, B, P + C),
        "sampling logits": B * V * 4,
    }
    full = full_precision_bytes(model, run)
    if full:
        # --load-in-Nbits: the first rollout's forward quantizes the policy (train.py run()
        # leaves it lazy): its full-precision weights are alive in place of the quantized ones.
        rollout[FULL_PRECISION + ", during the first rollout"] = max(full - resident.get("weights (frozen)", 0), 0)
    step = _step(sft)
    if ref and run.beta != 0:
        step["reference scoring"] = scoring  # the same buffers again, alive beside the policy's
    if accumulated and not trains_every_parameter(model, t):
        # The summed gradients of the earlier microbatches (_with_outside_trained counts them
        # for a full fine-tune, where the update can be the peak).
        _, _, trainable_bytes, _ = counted_totals(model, t)
        step[ACCUMULATED] = trainable_bytes
    phases = (
        Phase(f"rollout: {B} x {P + C} tokens of KV cache", rollout),
        Phase(f"scoring step: {run.group_size} microbatches of {B} x {width} tokens", {**resident, **step}),
    )
    return PreferenceEstimate(run, backend, phases, width, P, assumed)


@dataclass(frozen=True)
class Change:
    flags: str  # what to add to the mlx_lm_lora.train command
    cost: str  # what it costs
    bytes: int
    verdict: Verdict  # on the changed run's range, as the run's own verdict

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    def to_dict(self) -> dict:
        return {"flags": self.flags, "cost": self.cost, "bytes": self.bytes, "verdict": self.verdict.value,
                "fits": self.fits}


def _variants(model: ModelInfo, run: PreferenceRun, length: int | None, prompt_length: int | None):
    """(flags, cost, changed run, reference model or None, length) for each knob that
    lowers the peak: the mode's own first, then the SFT ones."""
    t = run.training
    L = t.batch_width(length)
    out = run.spec.own_changes(model, run)  # the mode's own first (mlxfit/modes/), its reference's among them
    if not t.grad_checkpoint:
        out.append(("--grad-checkpoint", "recomputes each block in the backward pass (slower)", replace(run, training=replace(t, grad_checkpoint=True))))
    if not t.quantize and t.fine_tune_type != "full":
        out.append(("--load-in-4bits", "a 4-bit policy base (group 128)", replace(run, training=replace(t, quantize=True, bits=4, group_size=128))))
    if t.fine_tune_type == "full":
        out.append(("--train-type lora", "LoRA adapters instead of full fine-tuning", replace(run, training=replace(t, fine_tune_type="lora"))))
    if t.batch_size > 1:
        out.append(("--batch-size 1", "one example a step (add --gradient-accumulation-steps to keep the batch)",
                    replace(run, training=replace(t, batch_size=1))))
    n = model.architecture.num_layers
    if t.fine_tune_type != "full" and t.layers_trained(n) > 4:
        k = max(4, t.layers_trained(n) // 2)
        out.append((f"--num-layers {k}", f"adapters on the last {k} blocks only", replace(run, training=replace(t, num_layers=k))))
    if run.spec.pairs and L > 512:
        if not run.efficient_long_context:
            out.append(("--efficient-long-context", "scores and differentiates in 512-token chunks (experimental)",
                        replace(run, efficient_long_context=True)))
        half = max(256, L // 2)
        out.append((f"--max-seq-length {half}", "longer pairs are truncated", replace(run, training=replace(t, max_seq_length=half))))
    return out


def shapes(model: ModelInfo, run: PreferenceRun, length: int | None, prompt_length: int | None) -> list:
    """(model, run, length) of the run and of each single change: the miniatures
    (mlxfit/measure/miniature.py) that estimate_run and plan use, to count in one process."""
    L = run.training.batch_width(length)
    changed = [change for _, _, change in _variants(model, run, length, prompt_length) if change != "ref4"]
    return [(model, r, L) for r in [run, *changed]]


def plan(model: ModelInfo, run: PreferenceRun, usable: int, backend: str, length: int | None = None,
         reference: ModelInfo | None = None, prompt_length: int | None = None, *, miniatures: bool = False) -> dict:
    """Single changes with their new peaks, and, when none fits alone, the fewest
    of them (chosen greedily, the largest saving first) that fit together.
    `miniatures`: as for estimate_run."""

    def estimated(r, ref, count_new=True):
        return estimate_run(model, r, backend, length, ref, prompt_length, count_new, miniatures=miniatures)

    def apply(r, ref, change):
        if change == "ref4":
            return r, _quantized_reference(model)
        return change, ref

    logits_buffers_many(shapes(model, run, length, prompt_length), miniatures=miniatures)
    base_estimate = estimated(run, reference)
    base = base_estimate.peak_bytes
    singles = []
    for flags, cost, change in _variants(model, run, length, prompt_length):
        e = estimated(*apply(run, reference, change))
        if e.peak_bytes < base:
            singles.append(Change(flags, cost, e.peak_bytes, e.verdict(usable)))
    combo = []
    if not base_estimate.verdict(usable).fits and not any(c.fits for c in singles):
        r, ref, now = run, reference, base
        for _ in range(6):
            best = None
            for flags, cost, change in _variants(model, r, length, prompt_length):
                if any(flags == c.flags for c in combo) or flags.startswith("--train-mode"):
                    continue  # a plan keeps the user's objective
                r2, ref2 = apply(r, ref, change)
                e = estimated(r2, ref2, count_new=False)  # a shape no single change has: the fitted count
                if e.peak_bytes < now and (best is None or e.peak_bytes < best[0]):
                    best = (e.peak_bytes, flags, cost, r2, ref2, e)
            if best is None:
                break
            now, r, ref = best[0], best[3], best[4]
            option = best[1].split()[0]  # a second value of a flag replaces the first
            combo = [c for c in combo if c.flags.split()[0] != option]
            combo.append(Change(best[1], best[2], now, best[5].verdict(usable)))  # on its own mode's range
            if combo[-1].fits:  # the whole range within the budget
                break
    return {"singles": singles, "combination": combo}


def _quantized_reference(model: ModelInfo) -> ModelInfo:
    """The model as a 4-bit conversion would store it (mlx_lm.convert -q, group 64)."""
    config = {**model.config, "quantization": {"group_size": 64, "bits": 4}}
    from ..model.resolve import _from_config

    return _from_config(model.id + " (4-bit)", "local", config)
