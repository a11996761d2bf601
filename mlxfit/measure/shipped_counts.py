"""The catalog's miniature counts, shipped as package data (mlxfit/data/miniature_counts.json).

A preference probe of a catalog model at mlx-lm-lora's defaults counts the logits
buffers of its run and of each single change of its plan on miniatures
(mlxfit/measure/miniature.py): tens of seconds of child process the first time. The
count is a property of the graph's shape (the miniature's shape key: the shrunk
config, the mode, the adapted layers, checkpointing, the device, the MLX version),
not of the batch, the length or the memory, so one count per shape answers every
such run. Those counts ship here, counted by `python -m mlxfit.cli.ship_counts
--write`, in one section per device and versions they were counted under; a section
that does not match the running device, mlx, mlx-lm, mlx-lm-lora and the miniature's
recipe is not used (the shapes are then counted here, as before).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..files import write_atomically

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "miniature_counts.json"
REGENERATE = "python -m mlxfit.cli.ship_counts --write"
USE_SHIPPED = True  # off while they are generated (and in tests that count)


@lru_cache(maxsize=4)
def section(recipe: str) -> str:
    """The device and versions a count holds for, readable, and the miniature's recipe
    (mlxfit/measure/miniature.py recipe())."""
    from importlib.metadata import PackageNotFoundError, version

    import mlx.core as mx

    from ..model.mlx_lm_modules import version as mlx_lm_version

    try:
        lora = version("mlx-lm-lora")
    except PackageNotFoundError:
        lora = "none"
    return f"{mx.default_device()} mlx {mx.__version__} mlx-lm {mlx_lm_version()} mlx-lm-lora {lora} recipe {recipe}"


@lru_cache(maxsize=1)
def read() -> dict:
    """{section: {model id: {shape key: count}}} as shipped; {} without the file."""
    try:
        found = json.loads(SHIPPED.read_text())
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


@lru_cache(maxsize=1)
def _flat(name: str) -> dict:
    return {key: count for counts in read().get(name, {}).values() for key, count in counts.items()}


def counts(recipe: str) -> dict:
    """{shape key: count} shipped for this device, these versions and this recipe."""
    return _flat(section(recipe)) if USE_SHIPPED else {}


def write(model_counts: dict, recipe: str, path: Path | None = None, replace_all: bool = False) -> int:
    """This section's counts, {model id: {shape key: count}}, merged into the file (or,
    `replace_all`, in place of the section); other sections stay. The file's size."""
    path = path or SHIPPED
    found = {} if not path.exists() else json.loads(path.read_text())
    mine = {} if replace_all else found.get(section(recipe), {})
    found[section(recipe)] = dict(sorted({**mine, **model_counts}.items()))
    text = json.dumps(found, indent=1, sort_keys=True) + "\n"
    write_atomically(path, lambda f: f.write(text.encode()))  # a stopped count leaves the file whole
    read.cache_clear()
    _flat.cache_clear()
    return path.stat().st_size
