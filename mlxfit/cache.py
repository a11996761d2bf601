"""Where mlxfit keeps what it remembers on this machine (never in a model's or
data set's folder): MLXFIT_CACHE_DIR, else the platform's cache directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cache_dir() -> Path:
    if override := os.environ.get("MLXFIT_CACHE_DIR"):
        return Path(override)
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "mlxfit"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlxfit"
