"""How many logits-sized buffers a DPO, CPO or ORPO step holds, counted by running
mlx-lm-lora's own step on a miniature of the model.

A chosen/rejected step holds some number of B x T x V buffers at its loss (the
policy's logits, their float32 casts, the reference's, their gradients). How many
depends on the order MLX evaluates the step's graph in: mlx/transforms.cpp
eval_impl builds the tape breadth-first, at most MLX_BFS_MAX_WIDTH (20) arrays
wide, so how far the chosen, rejected and reference passes interleave follows the
graph's shape. Counted on llama for DPO (benchmarks/results/preference_depths.json):
13.5, 15.5, 10, 15.5, 9.5, 15, 13.5, 15.5, 10, 13.5 at 2, 3, 4, 6, 8, 10, 12, 16, 24,
32 blocks: no formula of depth.

The order depends on the graph, not on its sizes. A miniature keeps what shapes
the graph (the model type and dtype, its depth, the adapted layers, the mode,
checkpointing, compilation) and shrinks every width; its peak at two vocabulary sizes,
less the weights that grow with the vocabulary, gives the count. The counts are
remembered per graph shape (mlxfit's cache folder) and with the MLX version; the
catalog's ship with mlxfit (mlxfit/measure/shipped_counts.py).

Without mlx-lm-lora (the rl extra), for a chunked run (--efficient-long-context),
or for a model whose miniature mlx-lm cannot build, there is no count: the estimate keeps its fitted one and a wider range.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace

from ..cache import cache_dir
from ..errors import MlxfitError
from ..files import write_atomically
from ..units import format_seconds

# What a miniature's widths become (keys absent from a config are left absent).
WIDTHS = {
    "hidden_size": 32, "intermediate_size": 64, "head_dim": 8, "global_head_dim": 8, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32, "hidden_size_per_layer_input": 8, "num_attention_heads": 4,
}
VOCAB_KEYS = ("vocab_size", "vocab_size_per_layer_input")  # Gemma 3n / 4: per-layer embeddings of the vocabulary
MOST_WEIGHTS = 256 * 10**6  # a miniature whose weights would exceed this is not run (its config kept a width)
VOCABS = (8192, 16384)  # large against the widths, so that the loss is the peak's moment
# Tokens per sequence: long against the hidden width, so that vocabulary x hidden
# arrays (a trained embedding's gradient and optimizer update) weigh a quarter of a
# logits row each and do not become the peak (at 48 tokens and width 64 they made a
# full ORPO fine-tune's count 6.7 instead of 3.3).
LENGTH = 128
SECONDS_EACH = 20  # a miniature takes 1-3 s here (2 CPU cores): its child is stopped well before this
# Said before a count starts: the child's start, each miniature's build, then its two
# steps in proportion to its depth (here, 2 CPU cores: 33 s for 8 miniatures of 28
# blocks, 10 s for 4 of 4 blocks), scaled by how long this machine's last count took.
START_SECONDS = 3.0
SECONDS_PER_MINIATURE = 1.0
SECONDS_PER_BLOCK = 0.1
_remembered: dict = {}


def miniature_config(config: dict, vocab: int) -> dict:
    """The config with every width shrunk and the vocabulary set; the depth and the
    layer pattern kept. Nested text configs (multimodal checkpoints) likewise."""
    out = {k: v for k, v in config.items() if k != "quantization" and k != "quantization_config"}
    for key, width in WIDTHS.items():
        if key in out and isinstance(out[key], int):
            out[key] = width
        elif key in out and isinstance(out[key], list):
            out[key] = [width] * len(out[key])
    if isinstance(out.get("num_key_value_heads"), int):
        kv, heads = config["num_key_value_heads"], config.get("num_attention_heads", 1)
        out["num_key_value_heads"] = WIDTHS["num_attention_heads"] if kv == heads else (1 if kv == 1 else 2)
    for key in VOCAB_KEYS:
        if key in out:
            out[key] = vocab
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = miniature_config(out["text_config"], vocab)
    return out


# The group a miniature of a quantized base is quantized in: its widths (32, 64) are
# multiples of it; the group's size does not change the graph's shape.
MINIATURE_GROUP = 32


def frozen_quantized_base(model, run) -> bool:
    """A full fine-tune of a quantized base (--load-in-Nbits, or a base stored quantized):
    nn.quantize's layers freeze their weights, so only the norms and biases train, and
    the step's graph differs from a full fine-tune's (no gradient for the embedding, the
    head or any projection: the backward of each quantized matmul takes its input's
    gradient only)."""
    t = run.training
    return t.fine_tune_type == "full" and (t.quantize or model.quantized)


def miniature_run(run, model):
    """The run as its miniature trains it: batch 1, room for LENGTH tokens, the base
    unquantized (a LoRA graph's shape is the same either way), but for a full fine-tune
    of a quantized base, which is quantized as mlx-lm-lora's from_pretrained quantizes
    at load (in MINIATURE_GROUP groups): unquantized, it would train every parameter."""
    t = run.training
    quantized = frozen_quantized_base(model, run)
    bits = {"bits": t.bits or 4, "group_size": MINIATURE_GROUP, "quantized_frozen": True} if quantized else {}
    return replace(run, training=replace(t, batch_size=1, quantize=quantized, grad_accumulation_steps=1,
                                         max_seq_length=max(LENGTH, t.max_seq_length), **bits))


def shape_key(model, run, length: int) -> str:
    import mlx.core as mx

    t = run.training
    shape = {
        "config": miniature_config(model.config, 0),
        "mode": run.mode, "reference": run.has_reference, "fine_tune_type": t.fine_tune_type,
        "layers": t.layers_trained(model.architecture.num_layers), "keys": sorted(t.lora_keys or []),
        "grad_checkpoint": t.grad_checkpoint, "device": str(mx.default_device()),
        # A full fine-tune's count no longer takes in its embedding's and head's training.
        **({"vocabulary_trained_apart": True} if t.fine_tune_type == "full" else {}),
        # A full fine-tune of a quantized base: its miniature is quantized (miniature_run).
        **({"quantized_base_frozen": True} if frozen_quantized_base(model, run) else {}),
        "mlx": mx.__version__,
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:24]


def enabled(miniatures: bool) -> bool:
    """Whether counts are used: the caller allows miniatures (the command line unless
    MLXFIT_MINIATURES=0) and mlx-lm-lora is installed to run them."""
    from ..model.preference import installed

    return miniatures and installed()


def _store():
    return cache_dir() / "miniature_counts.json"


def _rate_store():
    return cache_dir() / "miniature_seconds.json"


def recipe() -> str:
    """What makes a miniature, as a digest: shipped counts are used only under the same."""
    return hashlib.sha256(json.dumps([WIDTHS, VOCABS, LENGTH], sort_keys=True).encode()).hexdigest()[:12]


def _known() -> dict:
    from .shipped_counts import counts

    return {**counts(recipe()), **_load(), **_remembered}


def _load() -> dict:
    try:
        return json.loads(_store().read_text())
    except (OSError, ValueError):
        return {}


def _save(counts: dict) -> None:
    try:
        _store().parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({**_load(), **counts}, indent=1, sort_keys=True)
        write_atomically(_store(), lambda f: f.write(text.encode()))
    except OSError:
        pass  # a count not remembered is counted again next time


def _project_seconds(blocks: list[int]) -> float:
    return START_SECONDS + SECONDS_PER_MINIATURE * len(blocks) + SECONDS_PER_BLOCK * sum(blocks)


def expected_seconds(blocks: list[int]) -> float:
    """How long counting miniatures of these depths takes here: as on the project's
    machine, times how much slower this one's last count was."""
    try:
        slower = float(json.loads(_rate_store().read_text())["slower"])
    except (OSError, ValueError, KeyError, TypeError):
        slower = 1.0
    return _project_seconds(blocks) * slower


def _remember_rate(seconds: float, blocks: list[int]) -> None:
    try:
        _rate_store().parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"slower": seconds / _project_seconds(blocks)})
        write_atomically(_rate_store(), lambda f: f.write(text.encode()))
    except OSError:
        pass


def logits_buffers(model, run, length: int, count_new: bool = True, *, miniatures: bool = False) -> float | None:
    """B x T x V float32-sized buffers per row the step holds at its loss, or None.
    `count_new` False: only a count already known (None for a shape not yet counted);
    `miniatures` False: no count at all (the fitted one is used), no child process."""
    return logits_buffers_many([(model, run, length)], count_new=count_new, miniatures=miniatures)[0]


def _keys(items: list) -> list:
    """Each item's shape key; None where no miniature is run: GRPO (its own terms),
    a model with no config, and chunked runs (--efficient-long-context over 512
    tokens), whose miniature would need the full length."""
    from ..model.preference import EFFICIENT_STEP

    keys = []
    for model, run, length in items:
        chunked = run.efficient_long_context and length > EFFICIENT_STEP
        ok = model.config is not None and run.spec.counted_on_miniature and not chunked
        keys.append(shape_key(model, run, length) if ok else None)
    return keys


def uncounted(items: list, *, miniatures: bool = False) -> bool:
    """Whether logits_buffers_many would run miniatures for these (model, run, length)."""
    if not enabled(miniatures):
        return False
    known = _known()
    return any(k and k not in known for k in _keys(items))


def logits_buffers_many(items: list, on_event=lambda e: None, count_new: bool = True, *,
                        miniatures: bool = False) -> list:
    """Counts for several (model, run, length), the ones not yet known measured in one
    child process; `miniatures` False: None for each, nothing run (as logits_buffers)."""
    if not enabled(miniatures):
        return [None] * len(items)
    keys = _keys(items)
    known = _known()
    todo = {}
    for key, (model, run, length) in zip(keys, items):
        if key and key not in known and key not in todo:
            todo[key] = (model, run, length)
    if todo and count_new:
        counted = _count(todo, on_event)
        _remembered.update(counted)
        _save({k: v for k, v in counted.items() if v is not None})
        known.update(counted)
    return [known.get(k) if k else None for k in keys]


def _count(todo: dict, on_event) -> dict:
    from ..estimate.reference import reference_bytes
    from ..estimate.detailed import counted_totals
    from ..estimate.trained_outside_blocks import trains_every_parameter, vocabulary_training
    from ..model.resolve import _from_config
    from .parent import MeasurementFailed, MeasurementInterrupted, run_child, stopping_children
    from .preference import request_for

    requests, plans, blocks = [], [], []
    for key, (model, run, _) in todo.items():
        small = miniature_run(run, model)
        try:
            minis = [_from_config(f"{model.id} (miniature)", "local", miniature_config(model.config, v)) for v in VOCABS]
        except MlxfitError:
            minis = []
        if len(minis) < 2 or any(m.architecture is None for m in minis):
            plans.append((key, None))
            continue
        sized = []
        for mini in minis:
            trained = small.training
            if trains_every_parameter(mini, trained):
                trained = replace(trained, num_layers=-1)
            base, _, _, optimizer = counted_totals(mini, trained)
            # What else grows with the vocabulary: a full fine-tune's embedding and head
            # (their optimizer state and gradients), counted apart by the estimate.
            _, state, gradients = vocabulary_training(mini, trained)
            sized.append(base + optimizer + state + gradients + reference_bytes(mini, small))
        if max(sized) > MOST_WEIGHTS:
            plans.append((key, None))
            continue
        requests += [request_for(mini, small, LENGTH, None, 2) for mini in minis]
        blocks += [mini.architecture.num_layers for mini in minis]
        plans.append((key, sized))
    counts, seen = {}, {}
    said = f"about {format_seconds(expected_seconds(blocks))}" if blocks else ""

    def event(e):
        if e.get("event") == "miniature":
            seen[e["index"]] = e["peak_bytes"]
        elif e.get("event") == "stage" and e["stage"].startswith("counting"):
            e = {**e, "stage": f"{e['stage']}, {said} in all"}
        elif e.get("event") == "done":
            e = {"event": "stage", "stage": f"logits buffers counted on {len(requests)} miniatures of the model"}
        on_event(e)

    try:
        if requests:
            on_event({"event": "stage", "stage": f"counting logits buffers on {len(requests)} miniatures of the model "
                                                 f"({said}, once per shape)"})
            tic = time.monotonic()
            with stopping_children():  # whoever called: a signal stops the child first
                run_child({"miniatures": requests}, SECONDS_EACH * (len(requests) + 2), event,
                          module="mlxfit.measure.preference_child")
            _remember_rate(time.monotonic() - tic, blocks)
    except MeasurementInterrupted as e:  # a signal ends the command, not just the count: said as what it stopped
        stopped = MeasurementInterrupted(f"interrupted while counting the preference step's logits buffers on "
                                         f"{len(requests)} miniatures of the model, before any measurement; "
                                         "their process was stopped", kind="interrupted")
        stopped.exit_code = e.exit_code
        raise stopped from None
    except MeasurementFailed:
        pass  # what was counted before the failure is kept
    peaks = [seen.get(i) for i in range(len(requests))]
    it = iter(peaks)
    for key, sized in plans:
        if sized is None:
            counts[key] = None
            continue
        p1, p2 = next(it), next(it)
        if p1 is None or p2 is None:
            counts[key] = None
            continue
        unit = (LENGTH - 1) * (VOCABS[1] - VOCABS[0]) * 4
        count = ((p2 - sized[1]) - (p1 - sized[0])) / unit
        counts[key] = round(count, 3) if count > 0 else None  # no logits grew: not a count to trust
    return counts
