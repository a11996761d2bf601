"""Every figure the rule of thumb is quoted with (per billion parameters, its reference table,
the 36 GB and 16 GB worked examples), reproduced by the rule and the verdicts."""

import pytest

from mlxfit.estimate.plan import fits_table, largest_fitting_params, make_plan
from mlxfit.estimate.rule import rule_bytes
from mlxfit.estimate.verdict import Verdict, judge
from mlxfit.machine import build_machine
from mlxfit.model.resolve import from_size
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU

GB = 10**9


@pytest.mark.parametrize(
    "size_b, lora_gb, full_gb",
    [(0.5, 4, 10), (1.5, 6, 22), (3, 9, 40), (7, 17, 88), (14, 31, 172)],
)
def test_source_table(size_b, lora_gb, full_gb):
    params = int(size_b * 1e9)
    assert rule_bytes("lora", params) == lora_gb * GB
    assert rule_bytes("full", params) == full_gb * GB


def test_7b_figures():
    params = 7 * 10**9
    # 16 bytes/weight before activations = 112 GB; the rule adds the fixed 4 GB.
    assert rule_bytes("full_fp32_master", params) == (112 + 4) * GB
    assert rule_bytes("qlora", params) == pytest.approx(7.9 * GB)


def test_qlora_figures_of_the_source():
    assert round(rule_bytes("qlora", 8 * 10**9) / GB) == 9
    assert round(rule_bytes("lora", 8 * 10**9) / GB) == 19
    assert round(rule_bytes("qlora", 27 * 10**9) / GB) == 22  # "27-32B ≈ 22-26 GB"
    assert 25 * GB <= rule_bytes("qlora", 32 * 10**9) <= 26 * GB


def laptop():
    return build_machine(LINUX_CPU, memory=36 * GB)


def test_36gb_laptop_has_27gb_usable():
    assert laptop().usable_bytes == 27 * GB


@pytest.mark.parametrize(
    "size, method, fits",
    [
        ("1.5B", "lora", True),
        ("7B", "lora", True),
        ("14B", "lora", False),
        ("32B", "qlora", True),
        ("1.5B", "full", True),
        ("3B", "full", False),
    ],
)
def test_36gb_laptop_verdicts(size, method, fits):
    """The worked example puts the rule's figure against the budget; the row's verdict
    judges the range it shows."""
    plan = make_plan(laptop(), from_size(size), TrainingConfig())
    estimate = next(e for e in plan.estimates if e.method == method)
    assert (estimate.rule_bytes <= estimate.usable_bytes) is fits
    assert estimate.verdict is judge(*estimate.predicted_range_bytes, estimate.usable_bytes)
    assert fits or not estimate.fits  # a figure over the budget never fits


def test_36gb_laptop_limits():
    usable = laptop().usable_bytes
    # "LoRA tops out near 10B, full near 1.5B": between the common sizes that fit
    # (8B LoRA, 1.5B full) and the next ones that do not (14B, 3B).
    assert 8e9 <= largest_fitting_params("lora", usable) < 14e9
    assert 1.5e9 <= largest_fitting_params("full", usable) < 3e9


def test_16gb_gpu_verdicts():
    gpu = build_machine(LINUX_CPU, gpu_memory=16 * GB)
    assert not gpu.unified
    plan = make_plan(gpu, from_size("8B"), TrainingConfig())
    by_method = {e.method: e for e in plan.estimates}
    assert not by_method["lora"].fits and by_method["lora"].rule_bytes > gpu.usable_bytes
    qlora = by_method["qlora"]
    assert qlora.rule_bytes <= gpu.usable_bytes and qlora.verdict is Verdict.TIGHT  # the range reaches past


def test_fits_table_reproduces_the_36gb_example():
    rows = dict(fits_table(laptop()).rows)

    def within(estimates):
        return [e.rule_bytes <= e.usable_bytes for e in estimates]

    assert within(rows[1.5]) == [True, True, True]
    assert within(rows[7]) == [True, True, False]
    assert within(rows[14]) == [False, True, False]
    assert within(rows[32])[1]  # QLoRA


def test_bare_size_remedies_are_what_the_rule_can_size():
    """The rule sizes the method and the model, not lengths or batches: no remedy it cannot size."""
    plan = make_plan(laptop(), from_size("14B"), TrainingConfig())
    changes = [r.change for r in plan.remedies]
    usable = laptop().usable_bytes
    assert changes[0] == "--method qlora" and plan.remedies[0].new_bytes <= usable
    assert "at most" in changes[1] and plan.remedies[1].new_bytes <= usable
    assert all(r.new_bytes is not None for r in plan.remedies)


def test_single_changes_follow_the_source_order():
    from mlxfit.model.resolve import from_catalog

    # At 1,024 tokens a smaller Qwen2.5 fits outright (another model is offered only when a comparable one does).
    plan = make_plan(laptop(), from_catalog("Qwen/Qwen2.5-14B-Instruct"), TrainingConfig(max_seq_length=1024))
    dims = [r.change.split()[0] for r in plan.remedies]
    assert dims == ["--max-seq-length", "--batch-size", "--method", "--grad-checkpoint", "--num-layers", "--model"]


def test_full_remedies_offer_lora():
    plan = make_plan(laptop(), from_size("3B"), TrainingConfig(fine_tune_type="full"))
    lora = next(r for r in plan.remedies if r.change == "--method lora --fine-tune-type lora")
    assert lora.new_bytes == 9 * GB and lora.new_bytes <= laptop().usable_bytes
