"""The training modes, one module each, as mlx-lm keeps its model types in `models/`:
`sft.py` is mlx-lm's SFT (mlx_lm.lora), `dpo.py`, `cpo.py`, `orpo.py` and `grpo.py`
mlx-lm-lora's (mlx_lm_lora.train), `vlm.py` mlx-vlm's (mlx_vlm.train, taken when the
model has a vision part). Each module holds one `MODE`, a `base.Mode`: what
the rest of mlxfit asks of a mode (its trainer, its phases, its changes, its evidence
range, its measuring step, its flags). A mode is found by its name, importing the module
of that name as mlx-lm's `_get_classes` does; adding a mode is adding one module here.

The modes' facts are plain data; what they delegate to (estimate/, measure/, model/)
is imported when called, so that every stage may ask a mode without an import circle.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from ..errors import BadInput

DEFAULT = "sft"  # mlx_lm_lora/train.py CONFIG_DEFAULTS["train_mode"], and mlx_lm.lora's only mode


@lru_cache(maxsize=None)
def get_mode(name: str):
    """The mode called `name` (its module's MODE); BadInput for a mode not covered."""
    if name not in names():
        raise BadInput(f"train mode {name!r} is not covered (use {', '.join(names())})")
    return importlib.import_module(f"{__name__}.{name}").MODE


@lru_cache(maxsize=None)
def names() -> tuple[str, ...]:
    """Every mode covered, in the order --train-mode lists them (each module's `ORDER`)."""
    found = [m.name for m in pkgutil.iter_modules(__path__) if m.name != "base"]
    modules = [importlib.import_module(f"{__name__}.{n}") for n in found]
    return tuple(m.MODE.name for m in sorted(modules, key=lambda m: m.MODE.order))


def of_trainer(trainer: str) -> tuple[str, ...]:
    """The modes `trainer` (a package: mlx_lm, mlx_lm_lora) runs."""
    return tuple(n for n in names() if get_mode(n).trainer == trainer)


def listed() -> tuple[str, ...]:
    """The modes --train-mode chooses among (a mode the model chooses is not listed)."""
    return tuple(n for n in names() if not get_mode(n).chosen_by_model)


def for_model(config: dict | None, train_mode: str | None) -> str | None:
    """The mode the model itself chooses (a vision part: mlx-vlm's), None where the
    flags choose; BadInput for another --train-mode with such a model."""
    from ..model.vision import has_vision

    if not has_vision(config or {}):
        return None
    chosen = next(n for n in names() if get_mode(n).chosen_by_model)
    if train_mode not in (None, DEFAULT, chosen):
        raise BadInput(f"--train-mode {train_mode} of a vision-language model is not covered: mlxfit sizes "
                       f"{get_mode(chosen).command}'s SFT (leave --train-mode out)")
    return chosen
