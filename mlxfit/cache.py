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


def remembered(name: str, key: str, compute):
    """The value stored under `key` in the cache's `name`.json, else compute() stored
    there first (a JSON value). A cache that cannot be read or written is recomputed."""
    import json

    path = cache_dir() / f"{name}.json"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    if not isinstance(stored, dict):
        stored = {}
    if key in stored:
        return stored[key]
    value = compute()
    stored[key] = value
    from .files import write_atomically

    text = (json.dumps(stored, indent=1, sort_keys=True) + "\n").encode("utf-8")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda out: out.write(text))
    except OSError:
        pass
    return value
