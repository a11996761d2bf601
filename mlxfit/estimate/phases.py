"""A run's step phase by phase: each phase's named parts in bytes; the run's peak is its
highest phase, judged on the run's range against the budget (estimate/verdict.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .verdict import Verdict, judge


@dataclass(frozen=True)
class Phase:
    name: str
    parts: dict  # name -> bytes, resident parts included

    @property
    def bytes(self) -> int:
        return sum(self.parts.values())


class Phased:
    """What an estimate with `phases` and a `range_bytes` answers: its peak phase, the
    peak's bytes and its verdict (a mix-in of the modes' estimates)."""

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak.bytes

    def verdict(self, usable_bytes: int) -> Verdict:
        return judge(*self.range_bytes, usable_bytes)
