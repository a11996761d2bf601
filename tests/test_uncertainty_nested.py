"""The Mac range's nested leave-one-source-out (benchmarks/mac_evidence.py `nested`): a held-out
source takes no part in any fit, choice or range that scores it."""

import copy
import statistics
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def me():
    sys.path.insert(0, str(BENCHMARKS))
    import mac_evidence

    return mac_evidence


@pytest.fixture(scope="module")
def few(me):
    """The runs of five sources (a nested fold over all 22 takes half a minute)."""
    metal = [me.Case(r) for r in me.evidence_runs()[0] if r.backend == "metal"]
    keep = ["blog 42730325402", "code-index 7373479517", "mlx-lm#53", "ultrascale-lab", "code-index 53568198657"]
    return [c for c in metal if c.run.source in keep]


def test_the_held_out_source_is_absent_from_every_fit_that_scores_it(me, few):
    seen = []

    def spy(cases, base, under):
        seen.append(frozenset(c.run.source for c in cases))
        return me.fit(cases, base, under)[0]

    cpu_lo, cpu_hi, _ = me.cpu_range()
    folds = me.nested(few, me.base_coefficients(), cpu_lo, cpu_hi, fitter=spy)
    sources = {c.run.source for c in few}
    assert set(folds) == sources
    for s, fold in folds.items():
        assert fold.fits and all(s not in trained_on for trained_on in fold.fits)
        assert set(fold.fits) <= set(seen)
        assert s not in fold.range_from and fold.range_from == sources - {s}
        assert fold.under in me.UNDERS and fold.option in me.RANGE_OPTIONS
        assert set(fold.errors) == {c.run.key for c in few if c.run.source == s}
    assert all(trained_on != sources for trained_on in seen)  # no fit saw every source


def test_a_held_out_sources_own_peaks_change_nothing_it_is_scored_against(me, few):
    """Doubling one source's logged peaks changes its errors, never the weight, the range shape
    or the range its fold chose: those were made without it."""
    cpu_lo, cpu_hi, _ = me.cpu_range()
    base = me.base_coefficients()
    s = "mlx-lm#53"
    before = me.nested(few, base, cpu_lo, cpu_hi)[s]
    doubled = []
    for case in few:
        if case.run.source == s:
            case = copy.copy(case)
            case.meas *= 2
        doubled.append(case)
    after = me.nested(doubled, base, cpu_lo, cpu_hi)[s]
    assert (after.under, after.option, after.range) == (before.under, before.option, before.range)
    assert all(after.errors[k] < before.errors[k] for k in before.errors)


def test_band_is_asymmetric_towards_underestimates(me):
    ratios = [0.8, 0.95, 1.0, 1.0, 1.02]
    low, high = me.band(ratios, 0.0, 0.0, 0.95, 1.05)
    assert low == 0.8 and high == pytest.approx(1.2)  # the high side mirrors the low one at least
    low, high = me.band([0.99, 1.0, 1.3], 0.0, 0.0, 0.95, 1.05)
    assert (low, high) == (0.95, 1.3)


def test_nested_accuracy_meets_the_targets(me):
    """On held-out sources with the form chosen without them (benchmarks/results/mac_evidence.md):
    >= 90% inside the range, median width <= 35% of the estimate, no exact-length run under by more
    than 12% (missed by one run, pinned below). Cross-validated, not blind: the mechanisms were
    designed reading every run."""
    metal = [me.Case(r) for r in me.evidence_runs()[0] if r.backend == "metal"]
    cpu_lo, cpu_hi, _ = me.cpu_range()
    folds = me.nested(metal, me.base_coefficients(), cpu_lo, cpu_hi)
    inside, widths, exact = [], [], {}
    for case in metal:
        fold = folds[case.run.source]
        e = fold.errors[case.run.key]
        lo, hi = me.range_for(fold.range, case.run.kind)
        inside.append(lo <= 1 / (1 + e) <= hi)
        widths.append(hi - lo)
        if case.run.exact_length:
            exact[case.run.key] = e
    assert sum(inside) >= 0.90 * len(metal)
    assert statistics.median(widths) <= 0.35
    # Every exact-length run within 12% but one, a miss the docs state (docs/accuracy.md "The figures"):
    # the 2025-02 Mistral-7B run, uncompiled, at -12.2%.
    missed = {"mistral7b-v0.2-uniform-210"}
    assert len(exact) >= 14 and all(abs(e) <= 0.12 for k, e in exact.items() if k not in missed)
    assert all(-0.13 <= exact[k] < -0.12 for k in missed)
    # and the estimate itself: median |error| at the typical length <= 10%
    assert statistics.median(abs(f.errors[c.run.key]) for c in metal for f in [folds[c.run.source]]) <= 0.10
    assert statistics.median(abs(e) for e in exact.values()) <= 0.05
