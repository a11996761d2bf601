"""The training run being planned, in mlx-lm's words and with mlx-lm's defaults.

This is the one place that holds the defaults (mlx_lm/lora.py: CONFIG_DEFAULTS);
tests/test_model_training.py pins them against the installed mlx-lm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from ..errors import BadInput

FINE_TUNE_TYPES = ("lora", "dora", "full")
OPTIMIZERS = ("adam", "adamw", "muon", "sgd", "adafactor")
GROUP_SIZES = (32, 64, 128)
MAX_DIMENSION = 2**31 - 1  # the longest dimension an MLX array may have (int32 shapes)


def batch_width(length: int | None, max_seq_length: int) -> int:
    """The width one step's batch is padded to: the data's widest batch (`length`,
    None without --data) cut to max_seq_length, else max_seq_length."""
    return min(length, max_seq_length) if length else max_seq_length


@dataclass(frozen=True)
class TrainingConfig:
    fine_tune_type: str = field(default="lora", metadata={"help": "lora, dora or full."})
    optimizer: str = field(default="adam", metadata={"help": "adam, adamw, muon, sgd or adafactor."})
    num_layers: int = field(default=16, metadata={"help": "Blocks to train, counted from the last; -1 for all."})
    batch_size: int = field(default=4, metadata={"help": "Examples per step."})
    max_seq_length: int = field(default=2048, metadata={"help": "Longest example in tokens; longer ones are truncated."})
    grad_checkpoint: bool = field(default=False, metadata={"help": "Recompute activations in the backward pass."})
    grad_accumulation_steps: int = field(default=1, metadata={"help": "Steps accumulated before each optimizer update."})
    rank: int = field(default=8, metadata={"help": "LoRA rank."})
    scale: float = field(default=20.0, metadata={"help": "LoRA scale."})
    dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    quantize: bool = field(default=False, metadata={"help": "QLoRA: quantize the base as mlx_lm.convert -q does."})
    bits: int = field(default=4, metadata={"help": "Bits per weight of the quantized base (mlx_lm.convert -q)."})
    group_size: int = field(default=64, metadata={"help": "Quantization group size (mlx_lm.convert -q)."})
    hosts: int = field(default=1, metadata={"help": "Data-parallel nodes under mlx.launch; each takes batch_size / hosts."})
    # Internal (no flag): the layers LoRA wraps inside each adapted block, as paths
    # within the block ("self_attn.q_proj"), like lora_parameters.keys. None is
    # mlx-lm's default since 0.28.2 (every Linear / SwitchLinear); mlx-lm before
    # 0.28.2 wrapped ("self_attn.q_proj", "self_attn.v_proj") for most architectures,
    # which benchmarks/mac_runs.py needs to reproduce the public Mac runs.
    lora_keys: tuple[str, ...] | None = field(default=None, metadata={"help": "internal: layers LoRA wraps (lora_parameters.keys); None = all."})
    # Internal: mlx-lm-lora's full fine-tune of a base quantized at load (--load-in-Nbits), which
    # trains only what nn.quantize leaves unfrozen (estimate/preference.py unquantized_trainable).
    quantized_frozen: bool = field(default=False, metadata={"help": "internal: full fine-tune of a base quantized at load."})

    def __post_init__(self):
        if self.lora_keys is not None and not isinstance(self.lora_keys, tuple):
            object.__setattr__(self, "lora_keys", tuple(self.lora_keys))  # from JSON or YAML lists
        if self.fine_tune_type not in FINE_TUNE_TYPES:
            raise BadInput(f"unknown fine-tune type {self.fine_tune_type!r} (use {', '.join(FINE_TUNE_TYPES)})")
        if self.optimizer not in OPTIMIZERS:
            raise BadInput(f"unknown optimizer {self.optimizer!r} (use {', '.join(OPTIMIZERS)})")
        for name in ("batch_size", "max_seq_length", "rank", "grad_accumulation_steps", "group_size", "hosts"):
            if getattr(self, name) < 1:
                raise BadInput(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("batch_size", "max_seq_length", "rank"):
            if getattr(self, name) > MAX_DIMENSION:
                # mlx::core::Shape holds int32: no array has a dimension this long.
                raise BadInput(f"{name.replace('_', '-')} must be at most {MAX_DIMENSION:,} (an MLX array's "
                               f"dimension is 32-bit), got {getattr(self, name):,}")
        if not 0 <= self.dropout < 1:
            # mlx/nn/layers/dropout.py: Dropout refuses a probability outside [0, 1).
            raise BadInput(f"lora dropout must be at least 0 and below 1, got {self.dropout}")
        if self.num_layers == 0 or self.num_layers < -1:
            raise BadInput(f"num-layers must be positive or -1 (all), got {self.num_layers}")
        if self.bits not in (2, 3, 4, 5, 6, 8):
            raise BadInput(f"bits must be one of 2, 3, 4, 5, 6, 8, got {self.bits}")
        if self.group_size not in GROUP_SIZES:
            # mlx.core.quantize: affine quantization takes groups of 32, 64 or 128.
            raise BadInput(f"group-size must be one of 32, 64, 128 (MLX quantizes in these groups), got {self.group_size}")
        if self.batch_size % self.hosts:
            # mlx_lm/tuner/trainer.py iterate_batches refuses this too.
            raise BadInput(f"The batch size must be divisible by the number of workers: {self.batch_size} over {self.hosts} hosts")
        if self.lora_keys is not None and (isinstance(self.lora_keys, str) or not self.lora_keys):
            raise BadInput(f"lora keys must be a non-empty list of layer names, got {self.lora_keys!r}")
        if self.quantize and self.fine_tune_type == "full" and not self.quantized_frozen:
            raise BadInput("QLoRA trains adapters on a quantized base: use --fine-tune-type lora or dora")

    @property
    def method(self) -> str:
        """The row of the rule this run belongs to: lora, qlora or full."""
        if self.fine_tune_type == "full":
            return "full"
        return "qlora" if self.quantize else "lora"

    def layers_trained(self, total_layers: int) -> int:
        if self.num_layers == -1:
            return total_layers
        if self.num_layers > total_layers:
            raise BadInput(
                f"Requested to train {self.num_layers} layers but the model only has {total_layers} layers "
                f"(mlx-lm's default is 16): give --num-layers {total_layers} or fewer, or -1 for all"
            )
        return self.num_layers

    def batch_width(self, length: int | None) -> int:
        """The width a step's batch is padded to (batch_width)."""
        return batch_width(length, self.max_seq_length)

    def to_dict(self) -> dict:
        return asdict(self)


def defaults() -> dict:
    return {f.name: f.default for f in fields(TrainingConfig)}
