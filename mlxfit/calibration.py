"""Measurements remembered on this machine, to correct later estimates.

Each `--measure` result is stored as one small JSON file in the user's cache
directory (written atomically), tagged with the mlx and mlx-lm versions and the
backend. Estimates on the same machine, backend and versions then add the median
gap between measured and predicted peaks ("calibrated from 3 measurements").
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path


def cache_dir() -> Path:
    if override := os.environ.get("MLXFIT_CACHE_DIR"):
        return Path(override)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "mlxfit"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxfit"


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


@dataclass(frozen=True)
class Calibration:
    offset_bytes: int
    count: int

    def describe(self) -> str:
        return f"calibrated from {self.count} measurement{'s' if self.count != 1 else ''} on this machine"


def record(model_id: str, training: dict, backend: str, predicted_bytes: int, measured: dict) -> Path:
    """Store one measurement; the same configuration overwrites its own file."""
    entry = {
        "model": model_id,
        "training": training,
        "backend": backend,
        "versions": versions(),
        "predicted_peak_bytes": predicted_bytes,
        "measured": measured,
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


def calibration(backend: str) -> Calibration | None:
    """The median measured-minus-predicted gap for this backend and these versions."""
    current = versions()
    gaps = [
        e["measured"]["peak_with_load_bytes"] - e["predicted_peak_bytes"]
        for e in stored()
        if e.get("backend") == backend and e.get("versions") == current
    ]
    if not gaps:
        return None
    return Calibration(offset_bytes=int(statistics.median(gaps)), count=len(gaps))


def clear() -> int:
    removed = 0
    for path in measurements_dir().glob("*.json") if measurements_dir().is_dir() else []:
        path.unlink()
        removed += 1
    return removed
