"""The logits buffers of a DPO, CPO or ORPO step, counted on a miniature of the model
(mlxfit/measure/miniature.py), and how the estimate, its range and its plans use them."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from mlxfit.estimate import preference as est
from mlxfit.cli.options import MINIATURES
from mlxfit.measure import miniature, shipped_counts
from mlxfit.model import preference as pref
from mlxfit.model.resolve import _from_config, resolve_model

needs_rl = pytest.mark.skipif(not pref.installed(), reason="mlx-lm-lora is not installed (pip install 'mlxfit[rl]')")

# benchmarks/preference.py's llama-tied-8k: its full-size step holds 9.5 float32 logits
# buffers per pair in DPO and 5.0 in CPO (benchmarks/results/preference.md).
LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": True}


@pytest.fixture(autouse=True)
def nothing_shipped(monkeypatch):
    """These tests count (or fake counting): the catalog's shipped counts would answer first."""
    monkeypatch.setattr(shipped_counts, "USE_SHIPPED", False)


@pytest.fixture
def miniatures_on(monkeypatch):
    """Miniatures allowed on the command line (the calls below pass miniatures=True)."""
    monkeypatch.setenv(MINIATURES, "1")
    monkeypatch.setattr(miniature, "_remembered", {})


def test_a_miniature_keeps_the_graph_and_shrinks_the_widths():
    config = {**resolve_model("Qwen/Qwen3-0.6B").config, "quantization": {"group_size": 64, "bits": 4}}
    small = miniature.miniature_config(config, 8192)
    assert small["num_hidden_layers"] == config["num_hidden_layers"]
    assert small["model_type"] == config["model_type"] and small["tie_word_embeddings"] == config["tie_word_embeddings"]
    W = miniature.WIDTHS
    assert (small["hidden_size"], small["head_dim"], small["vocab_size"]) == (W["hidden_size"], W["head_dim"], 8192)
    assert small["num_key_value_heads"] < small["num_attention_heads"]  # grouped-query attention stays grouped
    assert "quantization" not in small
    nested = miniature.miniature_config({"model_type": "x", "text_config": {
        "hidden_size": 2560, "vocab_size": 262144, "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256}}, 99)
    assert nested["text_config"] == {"hidden_size": W["hidden_size"], "vocab_size": 99, "vocab_size_per_layer_input": 99,
                                     "hidden_size_per_layer_input": W["hidden_size_per_layer_input"]}


def test_the_shape_key_follows_what_shapes_the_graph():
    model = resolve_model("Qwen/Qwen3-0.6B")
    run = pref.resolve_run("dpo", {}, {})
    key = miniature.shape_key(model, run, 512)
    t = run.training
    same = [replace(run, training=replace(t, batch_size=4)), replace(run, training=replace(t, quantize=True)),
            replace(run, beta=0.5)]
    assert all(miniature.shape_key(model, r, 2048) == key for r in same)
    other = [replace(run, training=replace(t, grad_checkpoint=True)), replace(run, training=replace(t, num_layers=4)),
             replace(run, mode="orpo"), replace(run, training=replace(t, fine_tune_type="full"))]
    assert len({key, *(miniature.shape_key(model, r, 512) for r in other)}) == 5
    # A full fine-tune of a base quantized at load trains only its norms: another graph.
    full = replace(run, training=replace(t, fine_tune_type="full"))
    on_quantized = replace(run, training=replace(t, fine_tune_type="full", quantize=True, quantized_frozen=True))
    assert miniature.shape_key(model, on_quantized, 512) != miniature.shape_key(model, full, 512)


def _measured_count(config: dict, run, length: int) -> float:
    """The full-size model's logits buffers: its peak's slope over two vocabularies,
    less the weights that grow with the vocabulary (as the miniature counts them)."""
    from mlxfit.estimate.detailed import counted_totals
    from mlxfit.measure.preference import measure

    net = []
    for vocab in (8192, 16384):
        model = _from_config("llama", "local", {**config, "vocab_size": vocab})
        peak = measure(model, run, length, steps=2, timeout=600).peak_bytes
        base, _, _, optimizer = counted_totals(model, run.training)
        net.append(peak - base - optimizer - est.reference_bytes(model, run))
    return (net[1] - net[0]) / ((length - 1) * 8192 * 4)


@needs_rl
def test_the_miniature_counts_what_the_full_size_step_holds(miniatures_on, monkeypatch):
    model = _from_config("llama", "local", LLAMA)
    dpo, cpo = pref.resolve_run("dpo", {}, {}), pref.resolve_run("cpo", {}, {})
    counts = miniature.logits_buffers_many([(model, dpo, 144), (model, cpo, 144)], miniatures=True)
    assert counts[0] == pytest.approx(_measured_count(LLAMA, dpo, 144), abs=0.25)
    assert counts == [pytest.approx(9.5, abs=0.1), pytest.approx(5.0, abs=0.1)]

    # Remembered on disk: no miniature runs again, in this process or another.
    monkeypatch.setattr(miniature, "_remembered", {})
    monkeypatch.setattr(miniature, "_count", lambda todo, on_event: pytest.fail("counted again"))
    assert miniature.logits_buffers(model, dpo, 144, miniatures=True) == counts[0]
    stored = json.loads((miniature.cache_dir() / "miniature_counts.json").read_text())
    assert sorted(stored.values()) == sorted(counts)


@needs_rl
def test_a_full_fine_tune_of_a_quantized_base_is_counted_on_a_quantized_miniature(miniatures_on):
    """mlx-lm-lora's full fine-tune with --load-in-4bits trains only what nn.quantize leaves
    unfrozen (the norms), so its miniature is quantized at load too: unquantized, it trained
    the embedding and head, whose gradients change what the step holds at its loss (a CPO
    run of a tied bfloat16 llama read 7.37 buffers there, 5.0 held: +31%)."""
    model = _from_config("llama", "local", LLAMA)
    cpo = pref.resolve_run("cpo", {"fine_tune_type": "full", "load_in_4bits": True}, {})
    small = miniature.miniature_run(cpo, model).training
    assert small.quantize and small.group_size == miniature.MINIATURE_GROUP and small.fine_tune_type == "full"
    assert not miniature.miniature_run(pref.resolve_run("cpo", {"load_in_4bits": True}, {}), model).training.quantize
    # The full-size step holds 5.0 (_measured_count: 5.00 at 144 tokens, 4.99 at 72; a minute and a
    # half of the suite, so test_the_miniature_counts_what_the_full_size_step_holds alone measures).
    assert miniature.logits_buffers(model, cpo, 144, miniatures=True) == pytest.approx(5.0, abs=0.1)


@needs_rl
def test_a_failed_miniature_leaves_the_fitted_count(miniatures_on, monkeypatch):
    from mlxfit.measure import parent

    def fail(*args, **kwargs):
        raise parent.MeasurementFailed("the child died")

    monkeypatch.setattr(parent, "run_child", fail)
    model = resolve_model("Qwen/Qwen3-0.6B")
    e = est.estimate_run(model, pref.resolve_run("dpo", {}, {}), "cpu", miniatures=True)
    assert e.logits_buffers is None
    assert est.estimate_run(model, pref.resolve_run("dpo", {}, {}), "cpu").peak_bytes == e.peak_bytes


def test_no_miniature_without_the_switch_or_for_grpo_and_chunked_runs(monkeypatch):
    monkeypatch.setattr(miniature, "_count", lambda todo, on_event: pytest.fail("a miniature ran"))
    model = resolve_model("Qwen/Qwen3-0.6B")
    monkeypatch.setattr(pref, "installed", lambda: True)
    monkeypatch.setenv(MINIATURES, "1")  # read by the command line only: the estimate runs none unless told
    assert miniature.logits_buffers(model, pref.resolve_run("dpo", {}, {}), 512) is None
    assert est.estimate_run(model, pref.resolve_run("dpo", {}, {}), "cpu").logits_buffers is None
    chunked = pref.resolve_run("dpo", {"efficient_long_context": True}, {})
    assert miniature.logits_buffers_many([(model, pref.resolve_run("grpo", {}, {}), 512), (model, chunked, 2048)],
                                         miniatures=True) == [None, None]


def test_a_counted_estimate_holds_the_counted_buffers_and_has_its_own_range():
    from mlxfit.estimate.uncertainty import preference_ranges

    model = resolve_model("Qwen/Qwen3-0.6B")
    run = pref.resolve_run("dpo", {"max_seq_length": 1024}, {})
    fitted = est.estimate_run(model, run, "cpu")
    counted = est.estimate_run(model, run, "cpu", counted=9.5)
    V = model.architecture.vocab_size
    assert counted.peak.parts["logits and gradient"] == pytest.approx(9.5 * 1023 * V * 4, rel=1e-6)
    assert "reference scoring" in fitted.peak.parts and "reference scoring" not in counted.peak.parts
    spread = preference_ranges()["counted"]["dpo"]
    low, high = counted.range_bytes
    assert low / counted.peak_bytes == pytest.approx(spread["low"], rel=1e-6)
    assert high / counted.peak_bytes == pytest.approx(spread["high"], rel=1e-6)
    assert counted.to_dict()["logits_buffers_counted"] == 9.5 and fitted.to_dict()["logits_buffers_counted"] is None


def test_a_plan_counts_the_run_and_its_single_changes_in_one_process(monkeypatch):
    calls = []

    def fake_count(todo, on_event):
        calls.append(len(todo))
        return {key: 10.0 for key in todo}

    monkeypatch.setattr(miniature, "_remembered", {})
    monkeypatch.setattr(miniature, "_count", fake_count)
    monkeypatch.setattr(pref, "installed", lambda: True)
    model = resolve_model("Qwen/Qwen2.5-7B-Instruct")
    run = pref.resolve_run("dpo", {}, {})
    plans = est.plan(model, run, 16 * 10**9, "metal", miniatures=True)
    assert plans["combination"], "a 7B DPO run needs several changes together on 16 GB"
    assert calls == [4]  # the run; --train-mode orpo, --grad-checkpoint, --num-layers 14 (same shape: 4-bit, batch, length)


def test_a_miniature_too_large_to_be_small_is_not_run(miniatures_on, monkeypatch):
    from mlxfit.measure import parent

    monkeypatch.setattr(pref, "installed", lambda: True)
    monkeypatch.setattr(parent, "run_child", lambda *a, **k: pytest.fail("a miniature ran"))
    config = {**resolve_model("Qwen/Qwen3-30B-A3B").config, "num_experts": 1024}  # a count no miniature shrinks (within mlxfit's bounds)
    moe = _from_config("many experts", "local", config)
    assert miniature.logits_buffers(moe, pref.resolve_run("dpo", {}, {}), 512, miniatures=True) is None


@needs_rl
def test_ctrl_c_while_counting_says_what_it_stopped(miniatures_on, monkeypatch, model_folder):
    """Ctrl-C while the miniatures were counted said 'interrupted at step 0; the measuring
    process was stopped', though nothing was being measured."""
    from contextlib import contextmanager

    from click.testing import CliRunner

    import mlxfit.answer
    from mlxfit.cli.main import cli

    @contextmanager
    def ctrl_c_at_the_childs_first_event(self):
        def on_event(event):
            if "once per shape" in event.get("stage", ""):
                return  # the announcement, made before the child starts
            raise KeyboardInterrupt  # as Ctrl-C arrives while run_child waits for the child's events

        yield on_event

    monkeypatch.setattr(mlxfit.answer.Silent, "measurement", ctrl_c_at_the_childs_first_event)
    folder = model_folder(LLAMA)
    result = CliRunner().invoke(cli, ["probe", "--model", str(folder), "--train-mode", "dpo", "--json"])
    assert result.exit_code == 130, result.output
    text = " ".join(result.output.split())
    assert re.search(r"interrupted while counting the preference step.s logits buffers on \d+ miniatures of the model", text)
    assert "before any measurement" in text and "at step 0" not in text and "measuring process" not in text


def test_a_count_says_how_long_it_will_take_before_it_starts(monkeypatch):
    """Another model's miniatures take tens of seconds: the first event says about how
    long, from the project machine's rate, then from this machine's own last count."""
    from mlxfit.measure import parent

    events, started = [], []

    def fake_child(request, timeout, on_event, module):
        started.append(len(events))
        for i, _ in enumerate(request["miniatures"]):
            on_event({"event": "stage", "stage": f"counting logits buffers on miniatures of the model ({i + 1} of 2)"})
            on_event({"event": "miniature", "index": i, "peak_bytes": 10**8 * (i + 1)})
        return {"event": "done"}

    monkeypatch.setattr(parent, "run_child", fake_child)
    model = resolve_model("Qwen/Qwen3-0.6B")  # 28 blocks: 2 miniatures
    run = pref.resolve_run("orpo", {}, {})
    miniature._count({"k": (model, run, 512)}, events.append)
    expected = miniature.START_SECONDS + 2 * miniature.SECONDS_PER_MINIATURE + miniature.SECONDS_PER_BLOCK * 2 * 28
    assert started == [1]  # said before the child started
    assert events[0]["stage"] == f"counting logits buffers on 2 miniatures of the model (about {expected:.0f} s, once per shape)"
    assert events[1]["stage"].endswith(f"(1 of 2), about {expected:.0f} s in all")
    # This machine's own speed, remembered from the count just made (a few milliseconds here).
    assert miniature.expected_seconds([28, 28]) < 1


def _shipped_here() -> dict:
    """This device's and these versions' shipped counts, {model id: {key: count}}."""
    here = shipped_counts.section(miniature.recipe())
    section = shipped_counts.read().get(here)
    if not section:
        pytest.skip(f"no counts shipped for {here} (`{shipped_counts.REGENERATE}` ships them)")
    return section


def test_the_shipped_counts_are_the_shapes_a_default_probe_counts():
    """Every shipped model is a catalog model, and its counts are those of the shapes a
    default DPO, CPO and ORPO probe of it counts (a change to the shape key or the plan's
    single changes leaves them unused: regenerate). A model whose miniature mlx-lm cannot
    build here (LFM2) has none: its probe runs no child either."""
    from mlxfit.cli import ship_counts
    from mlxfit.model.resolve import catalog

    ids = {model_id for model_id, _ in catalog().values()}
    wanted = {}
    for model_id, counts in _shipped_here().items():
        assert model_id in ids
        wanted[model_id] = {k for k in miniature._keys(ship_counts.wanted(resolve_model(model_id))) if k}
        assert set(counts) <= wanted[model_id], f"stale: `{shipped_counts.REGENERATE} {model_id}`"
        assert all(c > 0 for c in counts.values())
    assert len(wanted["Qwen/Qwen3-0.6B"]) == 9 and set(_shipped_here()["Qwen/Qwen3-0.6B"]) == wanted["Qwen/Qwen3-0.6B"]


@needs_rl
def test_a_shipped_count_is_what_the_miniature_counts_here():
    """The command's count, made again for one shape of a small catalog model, equals the
    shipped one, to the miniature's own repeatability: MLX frees buffers on its stream's
    thread, so the peak moves with timing (Qwen3-0.6B DPO: 9.497 and 9.513 buffers in two
    counts; with --grad-checkpoint 9.776 and 9.505)."""
    from mlxfit.cli import ship_counts

    model_id = "meta-llama/Llama-3.2-1B-Instruct"  # 16 blocks: the cheapest shipped model to count
    if model_id not in _shipped_here():
        pytest.skip(f"{model_id} has no shipped counts")
    model = resolve_model(model_id)
    item = (model, pref.resolve_run("orpo", {}, {}), 2048)
    key = miniature._keys([item])[0]
    counted = ship_counts.count([item])
    assert counted[key] == pytest.approx(_shipped_here()[model_id][key], rel=0.05)


@needs_rl
def test_a_first_preference_probe_of_a_catalog_model_runs_no_miniature(monkeypatch):
    """An empty cache, miniatures on: the shipped counts answer a default DPO, CPO and
    ORPO probe of Qwen3-0.6B (and its plan's single changes) without a child process."""
    from click.testing import CliRunner

    from mlxfit.cli.main import cli
    from mlxfit.measure import parent

    monkeypatch.setattr(shipped_counts, "USE_SHIPPED", True)
    shipped = _shipped_here().get("Qwen/Qwen3-0.6B")
    if not shipped:
        pytest.skip("Qwen/Qwen3-0.6B has no shipped counts")
    monkeypatch.setenv(MINIATURES, "1")
    monkeypatch.setattr(miniature, "_remembered", {})
    monkeypatch.setattr(parent, "run_child", lambda *a, **k: pytest.fail("a miniature ran"))
    model = resolve_model("Qwen/Qwen3-0.6B")
    for mode in ("dpo", "cpo", "orpo"):
        result = CliRunner().invoke(cli, ["probe", "Qwen/Qwen3-0.6B", "--train-mode", mode, "--memory", "16GB", "--json"])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.output)
        key = miniature._keys([(model, pref.resolve_run(mode, {}, {}), 2048)])[0]
        # Qwen3-1.7B's miniature has the same shape: either model's count may answer.
        assert answer["estimate"]["logits_buffers_counted"] == shipped_counts.counts(miniature.recipe())[key]
        assert answer["estimate"]["logits_buffers_counted"] == pytest.approx(shipped[key], rel=0.05)
    assert not (miniature.cache_dir() / "miniature_counts.json").exists()  # nothing counted, nothing stored


def test_shipped_counts_of_other_versions_are_not_used(monkeypatch, tmp_path):
    """A section counted under another device or other versions stays unused."""
    path = tmp_path / "counts.json"
    monkeypatch.setattr(shipped_counts, "SHIPPED", path)
    monkeypatch.setattr(shipped_counts, "USE_SHIPPED", True)
    shipped_counts.read.cache_clear()
    shipped_counts._flat.cache_clear()
    try:
        path.write_text(json.dumps({"Device(gpu, 0) mlx 0.1 mlx-lm 0.1 mlx-lm-lora 0.1 recipe x": {"m": {"abc": 9.5}}}))
        assert shipped_counts.counts(miniature.recipe()) == {}
        shipped_counts.write({"m": {"abc": 7.0}}, miniature.recipe(), path)
        assert shipped_counts.counts(miniature.recipe()) == {"abc": 7.0}
        assert shipped_counts.counts("another recipe") == {}
        assert len(json.loads(path.read_text())) == 2  # the other section kept
    finally:
        shipped_counts.read.cache_clear()
        shipped_counts._flat.cache_clear()
