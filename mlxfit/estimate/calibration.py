"""Measurements remembered on this machine, to correct later estimates.

Each `--measure` result is stored as one small JSON file in the user's cache
directory (written atomically), tagged with the mlx and mlx-lm versions and the
backend, and with the architecture it measured. Estimates on the same machine,
backend and versions then add the median gap between measured and predicted
peaks ("calibrated from 3 measurements"), but only from measurements of the same
architecture at close settings (`close`): a gap measured on a 4M-parameter toy
says nothing about a 7B's estimate.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ..cache import cache_dir


def measurements_dir() -> Path:
    return cache_dir() / "measurements"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("mlx", "mlx-lm"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


# Settings that change what a step holds, not just how much: a measurement
# corrects only runs that agree on all of them.
SAME_SETTINGS = ("fine_tune_type", "quantize", "bits", "group_size", "grad_checkpoint", "optimizer", "num_layers", "rank", "hosts")
TOKENS_WITHIN = 2.0  # and batch_size x max_seq_length within this factor


def architecture_key(model) -> dict:
    """What identifies the architecture measured: mlx-lm's model type, the exact
    parameter count and how the weights are stored (ModelInfo.to_dict's fields)."""
    data = model.to_dict()
    return {k: data.get(k) for k in ("model_type", "params", "bits", "dtype", "group_size")}


def close(stored_training: dict, training: dict) -> bool:
    """Whether a measurement of `stored_training` may correct an estimate of `training`."""
    if any(stored_training.get(k) != training.get(k) for k in SAME_SETTINGS):
        return False
    tokens = lambda t: t["batch_size"] * t["max_seq_length"]  # noqa: E731
    ratio = tokens(training) / tokens(stored_training)
    return 1 / TOKENS_WITHIN <= ratio <= TOKENS_WITHIN


def _gap(entry: dict) -> int:
    return entry["measured"]["peak_with_load_bytes"] - entry["predicted_peak_bytes"]


@dataclass(frozen=True)
class Calibration:
    """This machine's measurements of one architecture; `offset_bytes` and `count`
    are those of the run it was looked up for."""

    offset_bytes: int
    count: int
    architecture: dict  # architecture_key of what was measured
    entries: tuple = ()  # the stored measurements of that architecture

    def describe(self) -> str:
        return f"calibrated from {self.count} measurement{'s' if self.count != 1 else ''} on this machine"

    def offset_for(self, model, training) -> int | None:
        """The median gap of the measurements close to `training` (a remedy, a swept
        combination), or None: then the estimate stands uncorrected."""
        if architecture_key(model) != self.architecture:
            return None
        gaps = [_gap(e) for e in self.entries if close(e["training"], training.to_dict())]
        import statistics

        return int(statistics.median(gaps)) if gaps else None


def record(model_id: str, training: dict, backend: str, predicted_bytes: int, measured: dict, architecture: dict | None = None,
           *, length: int | None = None, machine: dict | None = None, config: dict | None = None) -> Path:
    """Store one measurement; the same configuration overwrites its own file. `length` (the
    batch width measured), `machine` (device_name, total_bytes) and `config` (a local model's
    config.json) let `mlxfit calibration --export` write it as evidence (mlxfit/estimate/export.py)."""
    import hashlib
    import tempfile
    from datetime import date

    entry = {
        "model": model_id,
        "architecture": architecture,
        "training": training,
        "backend": backend,
        "versions": versions(),
        "predicted_peak_bytes": predicted_bytes,
        "measured": measured,
        "date": date.today().isoformat(),
        **({"length": length} if length else {}),
        **({"machine": machine} if machine else {}),
        **({"config": config} if config else {}),
    }
    key = json.dumps({k: entry[k] for k in ("model", "training", "backend", "versions")}, sort_keys=True)
    folder = measurements_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as tmp:
        json.dump(entry, tmp, indent=2)
    os.replace(tmp.name, path)
    return path


def stored() -> list[dict]:
    folder = measurements_dir()
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob("*.json")):
        try:
            entries.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a damaged file is ignored, not fatal
    return entries


def calibration(backend: str, model, training=None) -> Calibration | None:
    """This backend's and these versions' measurements of `model`'s architecture.
    With `training`: None unless one of them is close to it. Measurements stored
    without their architecture correct nothing."""
    entries = stored()
    if not entries:
        return None  # nothing measured: no need to read the installed versions
    current = versions()
    arch = architecture_key(model)
    entries = tuple(
        e for e in entries
        if e.get("backend") == backend and e.get("versions") == current and e.get("architecture") == arch
    )
    if not entries:
        return None
    found = Calibration(0, 0, arch, entries)
    if training is None:
        return found
    close_ones = [e for e in entries if close(e["training"], training.to_dict())]
    if not close_ones:
        return None
    return replace(found, offset_bytes=found.offset_for(model, training), count=len(close_ones))


def clear() -> int:
    removed = 0
    for path in measurements_dir().glob("*.json") if measurements_dir().is_dir() else []:
        path.unlink()
        removed += 1
    return removed
