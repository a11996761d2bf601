"""The one shape of probe's answer as JSON (`probe --json`, and `.to_dict()` of the
Python API's answer), whatever the mode: docs/json.md describes it.

Every answer carries `schema` and the same top-level keys (None where a key says
nothing for that mode); the run's own estimate sits under `estimate`, with its peak,
range, verdict and phases in the same places (mlx-lm's SFT is one phase). Keys beyond
these come with what was asked (`data` with --data, `measured` with --measure...)."""

from __future__ import annotations

SCHEMA = 1
KEYS = ("schema", "train_mode", "machine", "model", "training", "run", "estimate", "estimates", "usable_bytes",
        "verdict", "fits", "remedies", "plan", "plans", "basis", "reference", "backend", "calibration", "config",
        "advice", "warnings", "notes", "longest_examples", "time")


def shaped(answer: dict) -> dict:
    """`answer` with `schema` first and every key of the shape (None where absent), its own keys in their order."""
    out = {"schema": SCHEMA, **answer}
    for key in KEYS:
        out.setdefault(key, None)
    return out


def run_estimate(train_mode: str, method: str | None, backend: str, peak_bytes: int, range_bytes, verdict,
                 peak_phase: str | None, phases: list, **more) -> dict:
    """The run's estimate: `phases` as [{"name", "bytes", "breakdown"}], `verdict` a Verdict."""
    return {"train_mode": train_mode, "method": method, "backend": backend, "predicted_peak_bytes": peak_bytes,
            "predicted_range_bytes": list(range_bytes), "verdict": verdict.value, "fits": verdict.fits,
            "peak_phase": peak_phase, **more, "phases": phases}
