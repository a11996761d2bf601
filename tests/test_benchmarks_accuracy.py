"""benchmarks/accuracy.py's grid spans every training knob, and its held-out checks are new runs."""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import accuracy  # noqa: E402


def test_the_grid_spans_every_knob():
    specs = accuracy.grid()
    assert len(specs) >= 60
    assert len({s["arch"] for s in specs}) >= 6
    assert {s["method"] for s in specs} == {"lora", "dora", "full", "qlora"}
    assert {s["batch_size"] for s in specs} >= {1, 2, 4, 8}
    lengths = {s["max_seq_length"] for s in specs}
    assert min(lengths) <= 64 and max(lengths) >= 4096
    assert {s["rank"] for s in specs} >= {4, 64}
    assert {s["num_layers"] for s in specs} >= {4, 16, -1}
    assert {s["grad_checkpoint"] for s in specs} == {True, False}
    assert {s["dtype"] for s in specs} == {"float32", "bfloat16"}
    models = {s["arch"]: accuracy.model_and_training(s)[0].architecture for s in specs}
    assert any(a.is_moe for a in models.values()) and any(not a.is_moe for a in models.values())
    assert {a.lm_head_params == 0 for a in models.values()} == {True, False}  # tied and untied


def test_every_architecture_is_fitted_and_tested():
    """The fitted architectures are both fitted and held out; the ones added
    after the fit are only ever tested."""
    seen = defaultdict(set)
    for spec in accuracy.grid():
        seen[spec["arch"]].add(accuracy.subset(spec))
    fitted = {a: sets for a, sets in seen.items() if a not in accuracy.NEW_ARCHS}
    assert all({"fit", "held-out"} <= sets for sets in fitted.values()), seen
    assert all(seen[a] == {"new-arch"} for a in accuracy.NEW_ARCHS)
    assert len(accuracy.NEW_ARCHS) >= 4
    assert sum(accuracy.subset(s) == "fresh" for s in accuracy.grid()) == accuracy.FRESH


def test_a_trace_counts_the_frees_of_buffers_made_before_the_step():
    """benchmarks/trace_peak.py replay: an update that frees an old weight (allocated before the
    traced step) while it allocates the new one holds one weight's worth, not two."""
    import numpy as np
    import trace_peak

    log = [(100, 1), (-50, 9), (80, 2), (-100, 1), (30, 3)]  # +100; an old 50 freed; +80; -100; +30
    events = np.array(log, dtype=[("size", "<i8"), ("ptr", "<u8")])
    peak, at, loss_peak, loss_at = trace_peak.replay(events, logits=0)
    assert (peak, at) == (130, 2)  # 180 when the old buffer's free was not counted
    assert loss_at == -1  # no logits-sized buffer was ever alive
    assert trace_peak.alive_at(events, at) == {100: 1, 80: 1}
    # The allocator may add a few bytes to a request: 6408 is logits-sized, 1000 is not.
    logits = np.array([(6400, 1), (6400, 2), (1000, 5), (6408, 3), (-6400, 1), (4000, 6)], dtype=events.dtype)
    assert trace_peak.replay(logits, logits=6400) == (20208, 3, 20208, 3)


def test_each_held_out_check_is_new_configurations():
    """A held-out check never repeats a configuration measured before it (the grid, the first
    fit's check, or an earlier check), so none of its runs was fitted or scored before."""
    seen = {accuracy.spec_key(s) for s in accuracy.grid() + accuracy.first_fit_check()}
    for name, (draw, _) in accuracy.HELDOUT_CHECKS.items():
        keys = [accuracy.spec_key(s) for s in draw()]
        assert len(set(keys)) == len(keys) and not seen & set(keys), name
        seen |= set(keys)
    assert all(set(pooled) < set(accuracy.HELDOUT_CHECKS) for pooled in accuracy.POOLED.values())


def test_every_row_has_its_own_index():
    """trace_peak.py and repeat_peak.py find a configuration by its index among all of them."""
    indices = [s["index"] for s in accuracy.every_row()]
    assert len(set(indices)) == len(indices)
    assert {4020, 5002, 5025} <= set(indices)


def test_every_row_is_read_back_from_the_stored_measurements():
    """benchmarks/results/accuracy_measurements.jsonl holds a measurement (or a failure) for every
    configuration, found by its key, and its rows are tagged with the checks' names."""
    cache = accuracy.load_cache()
    assert all(accuracy.spec_key(s) in cache for s in accuracy.every_row())
    checks = {row["spec"]["check"] for row in cache.values() if "check" in row["spec"]}
    assert checks == set(accuracy.HELDOUT_CHECKS)
