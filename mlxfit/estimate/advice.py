"""Advice from the user's data (examples the limit cuts, a worst batch far wider than the
typical one) and from what was measured before (a run made longer or wider than one that fit).

Pure functions: they take the plan, the data statistics and stored
measurements, and return short sentences with numbers.
"""

from __future__ import annotations

from ..units import format_gb
from .plan import Plan, predict

KEEP_SHARE = 0.95


def data_advice(plan: Plan, stats) -> list[str]:
    """`stats`: mlxfit.model.dataset.DataStats (imported only when there is data)."""
    from ..model.dataset import padded_length, smallest_max_length

    training, model = plan.training, plan.model
    notes: list[str] = []
    if stats.truncated:
        share = 100 * stats.truncated / stats.examples
        cut = (
            f"{stats.truncated} of {stats.examples} examples ({share:.0f}%) are longer than --max-seq-length "
            f"{training.max_seq_length} and lose {stats.tokens_lost:,} tokens in all"
        )
        if training.max_seq_length < stats.p90:
            cut += "; the model will not see the end of many answers (max length is below the 90th percentile)"
        notes.append(cut)
    keep = smallest_max_length(stats.lengths, KEEP_SHARE) if len(stats.lengths) else 0
    if keep:
        notes.append(
            f"the smallest --max-seq-length that keeps {KEEP_SHARE:.0%} of examples whole is {keep}"
        )
    typical = padded_length(stats.p90, training.max_seq_length)
    if model.architecture is not None and stats.worst_batch_tokens > 2 * typical:
        worst_need, _ = predict(model, training, plan.backend, plan.calibration, length=stats.worst_batch_tokens)
        for label, limit in (("99th", stats.p99), ("90th", stats.p90)):
            width = padded_length(limit, training.max_seq_length)
            need, _ = predict(model, training, plan.backend, plan.calibration, length=width)
            dropped = sum(1 for n in stats.lengths if n > limit)
            notes.append(
                f"the worst batch is {stats.worst_batch_tokens} tokens wide against {typical} for typical ones: "
                f"splitting or filtering the {dropped} examples above the {label} percentile ({limit} tokens) "
                f"brings the peak from {format_gb(worst_need)} to {format_gb(need)}"
            )
    return notes


def growth_advice(plan: Plan, measurements: list[dict]) -> list[str]:
    """Warn when this run is bigger than one measured to fit on this machine."""
    training, notes = plan.training, []
    for m in measurements:
        t = m.get("training", {})
        if m.get("model") != plan.model.id or t.get("fine_tune_type") != training.fine_tune_type:
            continue
        if t.get("quantize") != training.quantize:
            continue
        # What was measured and what runs: batch × the widest batch (max_seq_length without data).
        was = m.get("length") or t.get("max_seq_length", 0)
        now = plan.batch_width
        smaller = t.get("batch_size", 0) <= training.batch_size and was <= now
        bigger = (t.get("batch_size"), was) != (training.batch_size, now)
        if smaller and bigger:
            measured = m["measured"]["peak_with_load_bytes"]
            notes.append(
                f"batch {t['batch_size']} × {was} was measured at {format_gb(measured, 2)}; "
                f"this run (batch {training.batch_size} × {now}) needs more "
                f"({format_gb(plan.selected.predicted_bytes, 2)} predicted): a run that fit says little about a bigger one, "
                "measure it again (--measure)"
            )
    return notes[:1]


# Checkpointed full fine-tuning from this width on is the estimate's weakest kind: in the blind
# CPU set (benchmarks/results/accuracy_check_shipped_weak_kinds.md), 3 of its 10 runs at
# 1,024-4,096 tokens read 13-22% low, the rest -3.4% to +4.3% (docs/accuracy-notes.md: in Qwen3 the
# CPU's run-ahead puts the recompute's attention tensors beside the loss's buffers; Phi-3 peaks in
# its last block with more than the fitted activations).
WEAK_FULL_CHECKPOINT_WIDTH = 1024


def weak_kind_advice(plan: Plan) -> list[str]:
    """Say so when the run is of the kind the estimate is least sure of."""
    training, width = plan.training, plan.batch_width
    if plan.selected.detailed is None or training.fine_tune_type != "full" or not training.grad_checkpoint:
        return []
    if width < WEAK_FULL_CHECKPOINT_WIDTH:
        return []
    return [f"checkpointed full fine-tuning at {width:,} tokens is the estimate's least sure kind: on the CPU, 3 of 10 "
            "blind runs from 1,024 tokens read 13–22% below the measured peak (no public Mac run of it was found); "
            "--measure runs real steps and is the way to be sure"]
