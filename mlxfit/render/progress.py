"""probe's progress in words, the interface of mlxfit.answer.Silent: the data's bar, then
the measurement's expected time, its slices and its steps. Each renderer is imported when
first shown, so that a probe that fails before showing anything never loads rich."""

from __future__ import annotations


class ProbeProgress:
    def data(self):
        from .inputs import data_progress

        return data_progress()

    def measurement(self):
        from .measurement import measure_progress

        return measure_progress()

    def expectation(self, expectation) -> None:
        from .measurement import render_expectation

        render_expectation(expectation)

    def slices(self, plan, slices, need: int, usable: int, whole: int | None) -> None:
        from .measurement import render_slices

        render_slices(plan, slices, need, usable, whole)
