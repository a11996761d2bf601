"""The one judge: a need's range [low, high] against a budget.

Every verdict mlxfit gives (probe's rows and remedies, fits' cells, bench's rows and
--max, every preference mode, every host of a hostfile, a measured peak) is decided by
`judge`, so two commands can never call the same run two ways:

- fits: the high end within the budget;
- tight: the budget inside the range (it may not fit);
- does not fit: the low end above the budget.

A measured peak is not an estimate, but it is judged by the same function with a
margin for its range (`measured_range`): within MEASURED_MARGIN of the budget it is
tight (never plan to the last GB).
"""

from __future__ import annotations

from enum import Enum


class Verdict(Enum):
    FITS = "fits"
    TIGHT = "tight"
    DOES_NOT_FIT = "does not fit"
    CANNOT = "mlx-lm cannot"  # mlx-lm itself cannot run the method on the model: nothing sized to judge

    @property
    def fits(self) -> bool:
        """The promise: the whole range within the budget."""
        return self is Verdict.FITS


MEASURED_MARGIN = 0.90  # a measured peak above this share of the budget is tight


def judge(low_bytes: float, high_bytes: float, usable_bytes: int) -> Verdict:
    if low_bytes > usable_bytes:
        return Verdict.DOES_NOT_FIT
    if high_bytes > usable_bytes:
        return Verdict.TIGHT
    return Verdict.FITS


def measured_range(peak_bytes: int) -> tuple[int, float]:
    """A measured peak's range for the judge: the peak, and the peak with its margin."""
    return peak_bytes, peak_bytes / MEASURED_MARGIN
