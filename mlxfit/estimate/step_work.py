"""The work of a training step besides its matrix products: the elementwise and
reduction passes over the activations, the transcendental functions among them,
and the operations dispatched.

What MLX runs (counted on MLX 0.32's graph of an mlx_lm.lora step of a Llama model,
`mx.export_to_dot` of the loss, gradients and Adam update; benchmarks/step_time.py
says how to count it again):

- per block and token, forward: the two RMS norms and two residual adds (about 20
  passes over the hidden width), RoPE on the queries and keys (about 10 passes over
  their width), SiLU and the gate's product (about 8 passes over the MLP's width),
  and over the heads x T scores the mask, the scale and the softmax (about 6 passes);
  one exp per score and one sigmoid per MLP element;
- a trained block's backward: twice its forward's passes (each elementwise vjp reads
  the gradient and its inputs and writes a gradient), and with --grad-checkpoint its
  forward once more; each LoRA adapter scales and adds its output (5 passes forward,
  10 backward, over the layer's output width);
- the loss over batch x T x vocabulary logits in float32: the cast, the log-sum-exp,
  the softmax of its gradient and the mask (8 passes, 2 exps per logit; `loss_logits`
  says how many, for a machine that times the loss whole at its own rate);
- the optimizer (Adam) over the trainable arrays: read weight, gradient and two
  moments, write three (7 passes), one square root per element (`roots`: MLX's CPU
  backend runs a square root some 15 times faster than an exp, about three adds).

A pass reads or writes one tensor once: `traffic_bytes` is their sum in bytes, timed
at the machine's elementwise rate (a large MLX add here; a Mac's memory bandwidth).
`transcendentals` are timed apart where the machine has a rate for them (MLX's CPU
backend runs exp and sigmoid some 50 times slower than an add; on a Mac's GPU they
are in the traffic); `scores`, the attention's exps among them, at the rate of MLX's
precise softmax where the machine has one (in half precision it converts each score
to float32 and back: about twice an exp on this CPU). `ops` are the kernels dispatched (views not counted), each at
the machine's cost per operation. Pure functions: they return data.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..model.resolve import ModelInfo
from ..model.training import TrainingConfig
from .duration import ATTENTION_KINDS

# Passes per token of a block's forward, over each width (see above).
HIDDEN_PASSES = 20
ROPE_PASSES = 10
MLP_PASSES = 8
SCORE_PASSES = 6
ADAPTER_PASSES = 15  # forward 5 and backward 10, over an adapted layer's output width
LOSS_PASSES = 8  # over the float32 logits, forward and backward (3 forward only)
LOSS_FORWARD_PASSES = 3
LOSS_EXPS = 2  # per logit: the log-sum-exp's and its gradient's softmax
OPTIMIZER_PASSES = 7  # per trainable element
FLOAT32_BYTES = 4  # default_loss casts the logits to float32; LoRA's adapters compute in float32

# Kernels dispatched (MLX 0.32's graph of a Llama step, views not counted).
FORWARD_OPS = 81  # a block's forward
BACKWARD_OPS = 92  # a trained block's backward, its adapters and optimizer apart
ADAPTER_OPS = 10  # a LoRA adapter, forward and backward
# One decoding step of mlx-lm's BatchGenerator (a Llama, its BatchKVCache, GRPO's sampler), the
# operations in MLX's graph of it (mx.export_to_dot; MLX 0.32, mlx-lm 0.32): a block's, and the
# rest (the embedding, the last norm and head, the log-softmax, the sampler's sort and draw).
DECODE_BLOCK_OPS = 132
DECODE_OPS = 64
# A LoRA adapter's forward in a decoding step, counted as the block's are (views included): MLX's graph
# of mlx_lm/tuner/lora.py LoRALinear over (rows, 1, hidden): two products, their flattening and
# unflattening, the scale's broadcast, the multiply and the add, beyond the layer's own.
ADAPTER_FORWARD_OPS = 9
OPTIMIZER_OPS = 12  # Adam's update of one trainable array
LOSS_OPS = 30

ACTIVATION_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Work:
    traffic_bytes: int
    transcendentals: int  # exp, sigmoid: elements
    ops: int  # kernels dispatched
    scores: int = 0  # the attention's softmax exps among the transcendentals
    roots: int = 0  # the optimizer's square roots (not among the transcendentals)
    loss_logits: int = 0  # logits through the cross-entropy forward and backward (their exps and passes counted above)

    def __add__(self, other: "Work") -> "Work":
        return Work(self.traffic_bytes + other.traffic_bytes, self.transcendentals + other.transcendentals,
                    self.ops + other.ops, self.scores + other.scores, self.roots + other.roots,
                    self.loss_logits + other.loss_logits)

    def times(self, n: int) -> "Work":
        return Work(self.traffic_bytes * n, self.transcendentals * n, self.ops * n, self.scores * n, self.roots * n,
                    self.loss_logits * n)

    def loss_apart(self) -> "Work":
        """This work less its loss's counted passes and exps (for a machine that times the
        loss whole: `loss_logits` at its rate)."""
        return replace(self, traffic_bytes=self.traffic_bytes - LOSS_PASSES * FLOAT32_BYTES * self.loss_logits,
                       transcendentals=self.transcendentals - LOSS_EXPS * self.loss_logits, loss_logits=0)


def activation_bytes(model: ModelInfo) -> int:
    """Bytes of one activation element: the checkpoint's float dtype (a quantized base
    computes in bfloat16 unless config.json says otherwise)."""
    config = model.config or {}
    name = config.get("torch_dtype") or config.get("dtype") or model.dtype
    return ACTIVATION_BYTES.get(str(name), 2)


def _scores(block, T: int) -> int:
    """Attention scores per token of a block (its softmax's exps)."""
    return block.heads * T if block.kind in ATTENTION_KINDS else 0


def _block_elements(block, hidden: int, T: int) -> tuple[int, int]:
    """(elements passed over per token of the block's forward, transcendentals per token)."""
    mlp = block.intermediate + block.experts_per_token * block.expert_intermediate
    scores = _scores(block, T)
    rope = (block.heads + block.kv_heads) * block.head_dim
    return HIDDEN_PASSES * hidden + ROPE_PASSES * rope + MLP_PASSES * mlp + SCORE_PASSES * scores, scores + mlp


def _adapted(block, keys) -> list:
    return [l for l in block.linears if keys is None or any(l.path == k or l.path.endswith("." + k) for k in keys)]


def adapted_layers(model: ModelInfo, training: TrainingConfig) -> list:
    """The linear layers LoRA adapts (none in full fine-tuning): the trained blocks' lora_keys."""
    if training.fine_tune_type == "full":
        return []
    arch = model.architecture
    trained = arch.blocks[arch.num_layers - training.layers_trained(arch.num_layers):]
    keys = tuple(training.lora_keys) if training.lora_keys is not None else None
    return [l for b in trained for l in _adapted(b, keys)]


def decode_ops(model: ModelInfo) -> int:
    """The operations of one decoding step of the model, its adapters apart."""
    return DECODE_OPS + DECODE_BLOCK_OPS * len(model.architecture.blocks)


def trainable_arrays(model: ModelInfo, training: TrainingConfig) -> int:
    """The arrays the optimizer updates (each its OPTIMIZER_OPS)."""
    from .detailed import counted

    return len(counted(model, training)[1])


def forward_work(model: ModelInfo, length: int, sequences: int) -> Work:
    """A forward pass alone (an evaluation, a reference model) of `sequences` rows
    `length` tokens wide, as duration.forward_operations."""
    arch = model.architecture
    T = max(length, 1)
    N = sequences * T
    blocks = [_block_elements(b, arch.hidden_size, T) for b in arch.blocks]
    return Work(N * activation_bytes(model) * sum(p for p, _ in blocks)
                + N * arch.vocab_size * FLOAT32_BYTES * LOSS_FORWARD_PASSES,
                N * sum(s for _, s in blocks) + N * arch.vocab_size, LOSS_OPS + FORWARD_OPS * len(blocks),
                N * sum(_scores(b, T) for b in arch.blocks))


def step_work(model: ModelInfo, training: TrainingConfig, length: int | None = None,
              sequences: int | None = None) -> Work:
    """One training step's work besides matrix products; `length` and `sequences` as
    duration.phase_operations."""
    from .detailed import counted_totals

    arch = model.architecture
    width = training.batch_width(length)
    T = max(width - 1, 1)  # mlx-lm's default_loss drops the last token
    rows = training.batch_size // training.hosts if sequences is None else sequences
    N = rows * T
    blocks = [_block_elements(b, arch.hidden_size, T) for b in arch.blocks]
    first = arch.num_layers - training.layers_trained(arch.num_layers)
    trained = arch.blocks[first:]
    trained_passes = sum(p for p, _ in blocks[first:])
    recompute = training.grad_checkpoint
    passes = sum(p for p, _ in blocks) + (3 if recompute else 2) * trained_passes
    transcendental = sum(s for _, s in blocks) + (sum(s for _, s in blocks[first:]) if recompute else 0)
    arrays = trainable_arrays(model, training)
    _, elements, trainable_bytes, _ = counted_totals(model, training)
    adapted = adapted_layers(model, training)
    traffic = (N * activation_bytes(model) * passes
               + N * FLOAT32_BYTES * (ADAPTER_PASSES * sum(l.out_features for l in adapted)
                                      + LOSS_PASSES * arch.vocab_size)
               + OPTIMIZER_PASSES * trainable_bytes)
    ops = (LOSS_OPS + FORWARD_OPS * len(blocks) + len(trained) * (BACKWARD_OPS + (FORWARD_OPS if recompute else 0))
           + len(adapted) * ADAPTER_OPS + arrays * OPTIMIZER_OPS)
    scores = sum(_scores(b, T) for b in arch.blocks) + (sum(_scores(b, T) for b in trained) if recompute else 0)
    return Work(traffic, N * transcendental + LOSS_EXPS * N * arch.vocab_size, ops, N * scores, roots=elements,
                loss_logits=N * arch.vocab_size)
