"""Preference and RL runs (mlx-lm-lora's `mlx_lm_lora.train --train-mode ...`), in its words.

mlx-lm trains SFT only; DPO, CPO, ORPO and GRPO are mlx-lm-lora's. This module holds
what of mlx-lm-lora changes memory: its defaults (a recorded copy, so that the
estimate works without the package; tests/test_preference.py pins every value
against the installed mlx_lm_lora.train), how its flags, YAML and defaults combine,
and the widest batch of a --data folder as its own dataset classes and batch
iterators build it (that part needs the package).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..errors import BadInput, MlxfitError
from ..files import read_text
from ..modes import DEFAULT, get_mode, listed, of_trainer
from ..modes.base import MLX_LM_LORA
from .training import TrainingConfig

MODES = listed()  # covered here (one module each in mlxfit/modes/); mlx-lm-lora has more
# mlx_lm_lora/train.py run(): load_reference_model for these modes (of those covered),
# a second full copy of --model unless --reference-model-path names another model.
REFERENCE_MODES = tuple(n for n in MODES if get_mode(n).reference)
EXTRA = "pip install 'mlxfit[rl]'"  # installs mlx-lm-lora

# mlx_lm_lora/train.py CONFIG_DEFAULTS, the keys that change memory.
CONFIG_DEFAULTS = {
    "train_type": "lora",
    "train_mode": DEFAULT,
    "optimizer": "adam",
    "num_layers": -1,
    "batch_size": 1,
    "gradient_accumulation_steps": 1,
    "max_seq_length": 2048,
    "grad_checkpoint": False,
    "efficient_long_context": False,
    "lora_parameters": {"rank": 8, "dropout": 0.0, "scale": 10.0},
    "fuse": True,
    "beta": 0.1,
    "reference_model_path": None,
    "group_size": 4,
    "max_completion_length": 512,
    "load_in_4bits": False,
    "load_in_6bits": False,
    "load_in_8bits": False,
    # train_model() seeds MLX's generator with it before training: the first step's
    # peak differs with the generator seeded or not (measured, ±10% on a tiny
    # model), so the measuring child seeds it too.
    "seed": 0,
}
# mlx_lm_lora/train.py build_parser(): flags whose argparse default is not None.
# main() copies a YAML value only where the parsed flag is None, so for these keys
# the flag's default wins over the YAML file (a YAML group_size is ignored).
PARSER_DEFAULTS = {
    "gradient_accumulation_steps": 1,
    "group_size": 4,
    "max_completion_length": 512,
}
# mlx_lm_lora/train.py run(): --load-in-Nbits quantizes after loading, group 128.
LOAD_IN_GROUP_SIZE = 128
LOAD_IN_BITS = {"load_in_4bits": 4, "load_in_6bits": 6, "load_in_8bits": 8}
# mlx_lm_lora/train.py: seq_step_size=512 if args.efficient_long_context else None.
EFFICIENT_STEP = 512
# mlx_lm_lora/trainer/grpo_trainer.py GRPOTrainingArgs: sampling defaults used by the rollout
# (temperature also mlx_lm_lora/train.py CONFIG_DEFAULTS').
GRPO_SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 20}


@dataclass(frozen=True)
class PreferenceRun:
    """One mlx_lm_lora.train run: the SFT-shaped part (TrainingConfig, in mlx-lm's
    names) and what the mode adds."""

    mode: str
    training: TrainingConfig
    beta: float = 0.1
    reference_model_path: str | None = None
    group_size: int = 4
    max_completion_length: int = 512
    efficient_long_context: bool = False
    prompt_length: int | None = None  # GRPO: the longest prompt (from --data); None: unknown
    notes: tuple[str, ...] = field(default=())

    @property
    def spec(self):
        """The mode (mlxfit/modes/): its trainer, phases, changes and range."""
        return get_mode(self.mode)

    @property
    def has_reference(self) -> bool:
        return self.spec.reference

    @property
    def compiled(self) -> bool:
        return self.spec.compiled

    def to_dict(self) -> dict:
        data = asdict(self)
        data["training"] = self.training.to_dict()
        data["notes"] = list(self.notes)
        return data


_LORA_MODES = of_trainer(MLX_LM_LORA)
MODE_WORDS = ", ".join(_LORA_MODES[:-1]) + " or " + _LORA_MODES[-1]  # the --train-mode values that are mlx_lm_lora.train's
# mlx_lm_lora.train's own settings beyond mlx-lm's, as probe's flags name them.
RUN_FLAGS = ("beta", "reference_model_path", "max_completion_length", "efficient_long_context", "load_in_4bits",
             "load_in_6bits", "load_in_8bits", "prompt_length")


def refuse_mode_flags(pref: dict) -> None:
    """mlx_lm_lora.train's own flags on an sft run (mlx_lm.lora) would change nothing: say so."""
    given = [name for name, value in pref.items() if name != "train_mode" and value is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise BadInput(f"{flag} is mlx_lm_lora.train's: add --train-mode {MODE_WORDS}")


def refuse_sft_flags(mode: str, method_given: bool, bits_given: bool) -> None:
    """mlx_lm.lora's --method and --bits mean nothing to mlx_lm_lora.train: say so rather
    than estimate a run the user did not ask for."""
    if method_given:
        raise BadInput(f"--method is mlx_lm.lora's: with --train-mode {mode} use --train-type (lora, dora, full) "
                       "and --load-in-4bits")
    if bits_given:
        raise BadInput("--bits is mlx_lm.lora's: mlx_lm_lora.train quantizes with --load-in-4bits, -6bits or -8bits")


def mode_from(flag: str | None, config: dict) -> str:
    mode = flag or config.get("train_mode") or CONFIG_DEFAULTS["train_mode"]
    return get_mode(mode).name  # BadInput for a mode not covered


def read_yaml(path: Path | None) -> dict:
    if path is None:
        return {}
    from .runconfig import load_yaml

    return load_yaml(path)


def resolve_run(mode: str, flags: dict, config: dict) -> PreferenceRun:
    """Flags, then the YAML file, then mlx-lm-lora's defaults, as mlx_lm_lora.train
    main() combines them (a flag with a non-None argparse default beats the YAML)."""
    notes = []

    def pick(key, flag_value=None):
        if flag_value is not None:
            return flag_value
        if key in PARSER_DEFAULTS:
            if key in config and config[key] != PARSER_DEFAULTS[key]:
                notes.append(f"{key}: {config[key]} in the YAML file is ignored by mlx_lm_lora.train "
                             f"(its flag's default {PARSER_DEFAULTS[key]} wins); pass --{key.replace('_', '-')}")
            return PARSER_DEFAULTS[key]
        if key in config and config[key] is not None:
            return config[key]
        return CONFIG_DEFAULTS.get(key)

    lora = {**CONFIG_DEFAULTS["lora_parameters"], **(config.get("lora_parameters") or {})}
    for key in ("rank", "dropout"):
        if flags.get(key) is not None:
            lora[key] = flags[key]
    chosen = [key for key in LOAD_IN_BITS if pick(key, True if flags.get(key) else None)]
    if len(chosen) > 1:  # mlx_lm_lora.train would quietly take the first of them
        raise BadInput(f"{' with '.join('--' + k.replace('_', '-') for k in chosen)}: give one "
                       "(mlx-lm-lora quantizes the base once)")
    bits = LOAD_IN_BITS[chosen[0]] if chosen else None
    if config.get("load_in_mxfp4") or flags.get("load_in_mxfp4"):
        raise BadInput("--load-in-mxfp4 is not covered by the estimate (use --load-in-4bits, -6bits or -8bits)")
    fine_tune_type = pick("train_type", flags.get("fine_tune_type"))
    if bits and fine_tune_type == "full":
        # utils.py from_pretrained: no LoRA config, nothing frozen, then nn.quantize, whose
        # QuantizedLinear / QuantizedEmbedding freeze their weight, scales and biases.
        notes.append("--train-type full on a base quantized at load trains only what mlx-lm-lora leaves "
                     "unquantized (the norms, and any biases): nn.quantize freezes every layer it quantizes")
    num_layers = pick("num_layers", flags.get("num_layers"))
    if fine_tune_type == "full" and not bits and num_layers not in (None, -1):
        # train.py build_lora_config: no LoRA config for full, so --num-layers is never read.
        notes.append(f"--num-layers {num_layers} does not limit --train-type full in mlx-lm-lora: every "
                     "parameter trains, the embedding and head included")
    optimizer = pick("optimizer", flags.get("optimizer"))
    if optimizer not in ("adam", "adamw", "muon"):
        raise BadInput(f"mlx_lm_lora.train's optimizers are adam, adamw and muon, got {optimizer!r}")
    training = TrainingConfig(
        fine_tune_type=fine_tune_type,
        optimizer=optimizer,
        num_layers=num_layers,
        batch_size=pick("batch_size", flags.get("batch_size")),
        max_seq_length=pick("max_seq_length", flags.get("max_seq_length")),
        grad_checkpoint=bool(pick("grad_checkpoint", flags.get("grad_checkpoint"))),
        grad_accumulation_steps=pick("gradient_accumulation_steps", flags.get("grad_accumulation_steps")),
        rank=int(lora["rank"]),
        scale=float(lora["scale"]),
        dropout=float(lora["dropout"]),
        quantize=bits is not None,
        bits=bits or 4,
        group_size=LOAD_IN_GROUP_SIZE,
        quantized_frozen=bits is not None and fine_tune_type == "full",
    )
    run = PreferenceRun(
        mode=mode,
        training=training,
        beta=float(pick("beta", flags.get("beta"))),
        reference_model_path=pick("reference_model_path", flags.get("reference_model_path")),
        group_size=int(pick("group_size", flags.get("rl_group_size"))),
        max_completion_length=int(pick("max_completion_length", flags.get("max_completion_length"))),
        efficient_long_context=bool(pick("efficient_long_context", flags.get("efficient_long_context"))),
    )
    for name in ("group_size", "max_completion_length"):
        if getattr(run, name) < 1:
            raise BadInput(f"{name.replace('_', '-')} must be at least 1, got {getattr(run, name)}")
    if run.efficient_long_context and not run.spec.pairs:
        notes.append("--efficient-long-context does nothing for GRPO (mlx-lm-lora: SFT, DPO, CPO, ORPO only)")
    return replace(run, notes=tuple(notes))


def installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx_lm_lora") is not None


def require_extra(what: str) -> None:
    if not installed():
        raise MlxfitError(f"{what} needs mlx-lm-lora, which is not installed: {EXTRA}")


@dataclass(frozen=True)
class PreferenceData:
    file: str
    rows: int
    batches: int
    widest: int  # tokens of the widest batch (DPO/CPO/ORPO: padded width; GRPO: longest prompt)
    kind: str  # "chosen/rejected" or "prompt/answer"
    tokens_counted_by: str = "tokenizer"  # or characters, as mlx-lm's data (mlxfit/model/dataset.py)
    no_tokenizer_reason: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def read_data(data: str, run: PreferenceRun, choice) -> PreferenceData:
    """The widest batch of --data's train.jsonl, built by mlx-lm-lora's own
    create_dataset and its mode's batch iterator (mlx_lm_lora/trainer/), with the
    model's tokenizer (`choice`, a dataset.TokenizerChoice), or without one counted
    by characters as mlx-lm's data is."""
    require_extra("--data with --train-mode " + run.mode)
    import types

    from .transformers_notices import quiet_transformers

    quiet_transformers()
    from mlx_lm_lora.trainer.datasets import create_dataset

    path = Path(data).expanduser()
    file = path / "train.jsonl" if path.is_dir() else path
    if not file.is_file():
        raise BadInput(f"no training data at {file}")
    rows = []
    for n, line in enumerate(read_text(file, error=BadInput).splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise BadInput(f"{file}:{n}: not JSON ({e.msg})") from e
    if not rows:
        raise BadInput(f"{file} has no rows")
    t = run.training
    config = types.SimpleNamespace(train_mode=run.spec.trainer_mode, max_seq_length=t.max_seq_length, mask_prompt=False)
    from .dataset import CharacterTokenizer

    tokenizer = CharacterTokenizer() if choice.approximate else choice.tokenizer
    try:
        dataset = create_dataset(rows, tokenizer, config)
    except (KeyError, ValueError, TypeError) as e:
        raise BadInput(f"{file}: mlx-lm-lora cannot read it for {run.mode}: {type(e).__name__}: {e}") from e
    if len(dataset) < t.batch_size:
        raise BadInput(f"{file}: {len(dataset)} rows, fewer than the batch size {t.batch_size}")
    widths = list(_batch_widths(dataset, run))
    return PreferenceData(str(file), len(dataset), len(widths), max(widths), run.spec.data_kind, choice.counted_by,
                          choice.note if choice.approximate else None)


def _batch_widths(dataset, run: PreferenceRun):
    """Each batch's width as the mode's own batch iterator builds it (mlx_lm_lora/trainer/)."""
    t, spec = run.training, run.spec
    for batch in spec.batch_iterator()(dataset, t.batch_size, t.max_seq_length):
        yield spec.batch_width(batch)
