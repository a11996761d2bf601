"""One judge: every command calls the same run the same way, on the range it shows."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.plan import METHODS, TABLE_SIZES_B, fits_table, make_plan
from mlxfit.estimate.verdict import Verdict, judge, measured_range
from mlxfit.machine import build_machine
from mlxfit.units import parse_bytes
from conftest import LINUX_CPU, MAC_36GB

MEMORIES = ("8GB", "16GB", "18GB", "24GB", "32GB", "36GiB", "48GB", "64GB", "128GB")


def run_json(*args):
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_the_judge():
    assert judge(8, 10, 10) is Verdict.FITS
    assert judge(8, 11, 10) is Verdict.TIGHT
    assert judge(11, 12, 10) is Verdict.DOES_NOT_FIT
    # A measured peak is judged with its margin: within 90% of the budget it fits.
    assert judge(*measured_range(90), 100) is Verdict.FITS
    assert judge(*measured_range(91), 100) is Verdict.TIGHT
    assert judge(*measured_range(101), 100) is Verdict.DOES_NOT_FIT


@pytest.mark.parametrize("readings", [LINUX_CPU, MAC_36GB], ids=["cpu", "metal"])
def test_fits_and_probe_agree_on_every_cell(readings):
    """9 memory sizes x the table's sizes x 3 methods, on the CPU and on Metal (whose range
    also spans what no Mac run has verified): each cell of fits says what probe
    says of the catalog model it names, at the same settings on the same machine. A
    probe row's figures do not depend on the budget, so each model is planned once (on
    a machine where it fits, with no remedies to search) and its rows are judged
    against each budget as probe's would be."""
    tables = {m: fits_table(build_machine(readings, memory=parse_bytes(m))) for m in MEMORIES}
    first = tables[MEMORIES[0]]
    assert [size for size, _ in first.references] == list(TABLE_SIZES_B)  # every cell on the detailed basis
    roomy = build_machine(readings, memory=10**15)
    rows = {}
    for size, ref in first.references:
        plan = make_plan(roomy, ref.model, ref.training, backend=ref.backend)
        rows[size] = {e.method: e for e in plan.estimates}
    cells = 0
    for memory, table in tables.items():
        usable = table.machine.usable_bytes
        fits_answer = {row["params"]: row["answer"] for row in table.to_dict()["rows"]}
        for size, ref in table.references:
            for method in METHODS:
                probe_row = replace(rows[size][method], usable_bytes=usable).to_dict()
                cell = fits_answer[int(size * 1e9)][method]
                assert (cell["model"], cell["bytes"], cell["verdict"]) == (
                    ref.model.id, probe_row["predicted_peak_bytes"], probe_row["verdict"]), (memory, size, method)
                cells += 1
    assert cells == 9 * len(TABLE_SIZES_B) * 3


def test_fits_cell_is_probes_row_for_qwen_1_5b_on_36gib(platform):
    """The case that disagreed: fits said "26 GB ✓", probe "tight (23.3–31.4)"."""
    platform(LINUX_CPU)
    table = run_json("fits", "--memory", "36GiB")
    row = next(r for r in table["rows"] if r["params"] == int(1.5e9))
    cell = row["answer"]["lora"]
    probe = run_json("probe", cell["model"], "--memory", "36GiB", "--method", "lora")
    estimate = next(e for e in probe["estimates"] if e["selected"])
    assert (cell["bytes"], cell["verdict"]) == (estimate["predicted_peak_bytes"], estimate["verdict"])
    low, high = estimate["predicted_range_bytes"]
    assert estimate["verdict"] == judge(low, high, probe["machine"]["usable_bytes"]).value


@pytest.mark.parametrize("args", [("probe", "7B", "--memory", "16GiB"), ("probe", "70B", "--memory", "64GB"),
                                  ("probe", "7B", "--memory", "36GiB")])
def test_a_rule_of_thumb_row_is_judged_on_the_range_it_shows(platform, args):
    """ "7.9 GB (3.2–39.8) fits" against 12.9 GB was the rule's figure judged alone."""
    platform(LINUX_CPU)
    data = run_json(*args)
    usable = data["machine"]["usable_bytes"]
    for e in data["estimates"]:
        assert e["basis"] == "rule"
        assert e["verdict"] == judge(*e["predicted_range_bytes"], usable).value
        assert e["fits"] is (e["predicted_range_bytes"][1] <= usable)
    for r in data["remedies"]:
        assert r["fits"] is (r["verdict"] == "fits")


def test_the_7b_qlora_row_on_16gib_is_tight_in_text(platform):
    platform(LINUX_CPU)
    result = CliRunner().invoke(cli, ["probe", "7B", "--memory", "16GiB"])
    row = next(line for line in result.output.splitlines() if line.strip().startswith("QLoRA"))
    assert "7.9 GB" in row and "tight" in row and "fits" not in row  # the range shows where the width allows


def test_fits_rule_estimates_are_judged_on_their_range(platform):
    platform(LINUX_CPU)
    table = run_json("fits", "--memory", "36GiB")
    usable = table["machine"]["usable_bytes"]
    for row in table["rows"]:
        for e in row["estimates"]:
            assert e["verdict"] == judge(*e["predicted_range_bytes"], usable).value


@pytest.mark.parametrize("seconds, said", [(40, "40 s"), (12 * 60, "12 min"), (3.1 * 3600, "3.1 h"),
                                            (47 * 3600, "47.0 h"), (100 * 3600, "4.2 days")])
def test_durations_are_said_in_the_unit_a_person_reads(seconds, said):
    from mlxfit.units import format_seconds

    assert format_seconds(seconds) == said
