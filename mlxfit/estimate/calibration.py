"""Measurements remembered on this machine, to correct later estimates (of memory,
and of time: `speed_corrected`).

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


def tokens(training: dict, length: int | None = None) -> int:
    """The tokens of one step as run: batch_size times the width its batch is padded
    to, the widest batch of the data (`length`, capped by max_seq_length) where there
    is data, else max_seq_length."""
    from ..model.training import batch_width

    return training["batch_size"] * batch_width(length, training["max_seq_length"])


def close(stored_training: dict, training: dict, stored_length: int | None = None, length: int | None = None) -> bool:
    """Whether a measurement of `stored_training` (its widest batch `stored_length`)
    may correct an estimate of `training` (at `length`): the same settings, and the
    tokens of a step as run within a factor of TOKENS_WITHIN."""
    if any(stored_training.get(k) != training.get(k) for k in SAME_SETTINGS):
        return False
    ratio = tokens(training, length) / tokens(stored_training, stored_length)
    return 1 / TOKENS_WITHIN <= ratio <= TOKENS_WITHIN


def _close_entry(entry: dict, training: dict, length: int | None) -> bool:
    return close(entry["training"], training, entry.get("length"), length)


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

    def offset_for(self, model, training, length: int | None = None) -> int | None:
        """The median gap of the measurements close to `training` at `length` (a remedy,
        a swept combination), or None: then the estimate stands uncorrected."""
        if architecture_key(model) != self.architecture:
            return None
        gaps = [_gap(e) for e in self.entries if _close_entry(e, training.to_dict(), length)]
        import statistics

        return int(statistics.median(gaps)) if gaps else None


# A measured step time corrects runs timed at the same rates: the same dtype and bits.
SAME_RATES = ("quantize", "bits", "group_size")


def nearest_timed(entries, training: dict, length: int | None = None) -> dict | None:
    """The stored measurement with a step time (`time`) nearest to `training` at `length`:
    at the same rates (SAME_RATES), the fewest settings apart (SAME_SETTINGS), then the
    nearest tokens a step. None where none was timed."""
    import math

    timed = [e for e in entries if _timed(e) and all(e["training"].get(k) == training.get(k) for k in SAME_RATES)]
    if not timed:
        return None

    def distance(e):
        apart = sum(e["training"].get(k) != training.get(k) for k in SAME_SETTINGS)
        return apart, abs(math.log(tokens(training, length) / tokens(e["training"], e.get("length"))))

    return min(timed, key=distance)


def _timed(entry: dict) -> bool:
    time = entry.get("time")
    return isinstance(time, dict) and all(
        isinstance(time.get(k), (int, float)) and not isinstance(time.get(k), bool) and time[k] > 0
        for k in ("step_seconds", "predicted_step_seconds"))


def speed_corrected(speed, found: Calibration | None, model, training, length: int | None = None):
    """This machine's `speed` (step_time.Speed at its measured rates) scaled by measured
    over predicted step time of the nearest stored measurement of `model`'s architecture
    (its step predicted now, at these rates); `speed` as it is where none applies."""
    from ..errors import MlxfitError
    from ..model.training import TrainingConfig
    from .step_time import corrected, step_time

    if found is None or architecture_key(model) != found.architecture:
        return speed
    entry = nearest_timed(found.entries, training.to_dict(), length)
    if entry is None:
        return speed
    try:
        stored_run = TrainingConfig(**entry["training"])
        predicted = step_time(model, stored_run, speed, entry.get("length")).seconds
    except (MlxfitError, TypeError, ValueError):
        return speed  # a measurement of settings this version cannot read
    if predicted <= 0:
        return speed
    measured = entry["time"]
    t = entry["training"]
    return corrected(speed, measured["step_seconds"] / predicted, {
        "tokens_per_second": measured.get("tokens_per_second"), "step_seconds": measured["step_seconds"],
        "batch_size": t["batch_size"], "width": entry.get("length") or t["max_seq_length"],
        "date": entry.get("date"), "model": entry.get("model")})


def record(model_id: str, training: dict, backend: str, predicted_bytes: int, measured: dict, architecture: dict | None = None,
           *, length: int | None = None, machine: dict | None = None, config: dict | None = None,
           source: str | None = None, time: dict | None = None) -> Path:
    """Store one measurement; the same configuration overwrites its own file.
    `length`: the widest batch of the data it ran (None: max_seq_length), what the
    measurement is then keyed by. `machine` (device_name, total_bytes) and `config` (a
    local model's config.json) let `mlxfit calibration --export` write it as evidence
    (mlxfit/estimate/export.py); `source` (resolve.py's: "local" for a folder) lets it
    tell a relative folder from a Hub id. `time`: the measured pace of a whole run
    (tokens_per_second, step_seconds after the first step, predicted_step_seconds at
    this machine's rates), what later time estimates here are corrected by."""
    import hashlib
    from datetime import date

    from ..files import write_atomically

    entry = {
        "model": model_id,
        "architecture": architecture,
        "training": training,
        "backend": backend,
        "versions": versions(),
        "predicted_peak_bytes": predicted_bytes,
        "measured": measured,
        "date": date.today().isoformat(),
        **({"machine": machine} if machine else {}),
        **({"config": config} if config else {}),
        **({"source": source} if source else {}),
        **({"time": time} if time else {}),
    }
    if length and length < training["max_seq_length"]:
        entry["length"] = length
    key = json.dumps({k: entry[k] for k in ("model", "training", "backend", "versions", "length") if k in entry}, sort_keys=True)
    folder = measurements_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")
    write_atomically(path, lambda f: f.write(json.dumps(entry, indent=2).encode()))
    return path


def stored() -> list[dict]:
    folder = measurements_dir()
    if not folder.is_dir():
        return []
    entries = []
    for path in sorted(folder.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # a damaged file is ignored, not fatal
        if _well_formed(entry):
            entries.append(entry)
    return entries


def _well_formed(entry) -> bool:
    """A stored measurement with every field a lookup or a listing reads (one
    written by hand or by another version may lack some: it is ignored)."""
    def number(value):
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    try:
        t, m = entry["training"], entry["measured"]
        return (isinstance(entry["model"], str) and isinstance(entry["backend"], str)
                and isinstance(entry["versions"], dict) and number(entry["predicted_peak_bytes"])
                and number(m["peak_with_load_bytes"]) and isinstance(t.get("fine_tune_type"), str)
                and number(t["batch_size"]) and t["batch_size"] > 0 and number(t["max_seq_length"]) and t["max_seq_length"] > 0
                and (entry.get("length") is None or (number(entry["length"]) and entry["length"] > 0)))
    except (KeyError, TypeError, AttributeError):
        return False


def calibration(backend: str, model, training=None, length: int | None = None) -> Calibration | None:
    """This backend's and these versions' measurements of `model`'s architecture.
    With `training` (at `length`, the widest batch of the data): None unless one of
    them is close to it. Measurements stored without their architecture correct nothing."""
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
    close_ones = [e for e in entries if _close_entry(e, training.to_dict(), length)]
    if not close_ones:
        return None
    return replace(found, offset_bytes=found.offset_for(model, training, length), count=len(close_ones))


def clear() -> int:
    removed = 0
    for path in measurements_dir().glob("*.json") if measurements_dir().is_dir() else []:
        path.unlink()
        removed += 1
    return removed
