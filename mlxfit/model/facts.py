"""What a config's model is, remembered across runs on this machine.

Building mlx-lm's model lazily and walking it (mlxfit/model/architecture.py,
mlxfit/estimate/detailed.py) gives the same answer every time for one config
under one mlx / mlx-lm and one mlxfit: the architecture and the counted weights
and trainable arrays of each kind of run. Those answers are kept in one small
file per config under the cache directory (mlxfit/cache.py), keyed by the
config, the mlx and mlx-lm versions and the source of the modules that compute
them, so a later probe (a plan sizes a few hundred runs, and compares models of
the catalog) builds nothing it has built before. A file that cannot be read or
written is ignored: the answer is then computed, as without a cache.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path

from ..cache import cache_dir

FORMAT = 1
# The modules whose code decides the remembered answers (their source is in the key).
SOURCES = ("model/architecture.py", "model/lazy_model.py", "model/module_tree.py", "model/mlx_lm_modules.py",
           "model/facts.py", "estimate/detailed.py")
_loaded: dict[Path, dict] = {}


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """The versions and source that the answers depend on."""
    import mlx.core as mx

    from .mlx_lm_modules import version

    digest = hashlib.sha256(f"{FORMAT} mlx {mx.__version__} mlx-lm {version()}".encode())
    root = Path(__file__).resolve().parent.parent
    for name in SOURCES:
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


def path_for(config_key: str) -> Path:
    name = hashlib.sha256(f"{fingerprint()}\n{config_key}".encode()).hexdigest()[:40]
    return cache_dir() / "facts" / f"{name}.pickle"


def _load(path: Path) -> dict:
    if path not in _loaded:
        try:
            with open(path, "rb") as f:
                found = pickle.load(f)
            _loaded[path] = found if isinstance(found, dict) else {}
        except Exception:  # absent, unreadable, or written by another version: recompute
            _loaded[path] = {}
    return _loaded[path]


def _store(path: Path, facts: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=".facts-", delete=False) as tmp:
            pickle.dump(facts, tmp, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp.name, path)
    except Exception:  # a read-only cache, or an answer that cannot be pickled: computed each time
        try:
            os.unlink(tmp.name)
        except (OSError, NameError):
            pass


def recall(config_key: str, name, compute):
    """The answer `name` for this config: remembered, else `compute()` (kept for
    next time). Errors are not remembered."""
    path = path_for(config_key)
    facts = _load(path)
    if name not in facts:
        facts[name] = compute()
        _store(path, facts)
    return facts[name]
