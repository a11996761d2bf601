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

The catalog's models are answered before any run: the answers a probe of each
of them asks at mlx-lm's defaults (its rows, its plan, the models it compares)
ship in mlxfit/data/facts.pickle.xz, computed when the package is built and
used only when their key (the same fingerprint) matches the running mlx, mlx-lm
and source. After changing any of SOURCES or the installed mlx / mlx-lm,
regenerate them with `python -m mlxfit.cli.ship_facts --write`
(tests/test_estimate_plan.py fails while they are stale).
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
SHIPPED = Path(__file__).resolve().parent.parent / "data" / "facts.pickle.xz"
REGENERATE = "python -m mlxfit.cli.ship_facts --write"
USE_SHIPPED = True  # off while they are generated (and in tests that count what is built)


@lru_cache(maxsize=1)
def versions() -> str:
    """The installed versions the answers depend on, as the fingerprint begins."""
    import mlx.core as mx

    from .mlx_lm_modules import version

    return f"mlx {mx.__version__} mlx-lm {version()}"


def fingerprint() -> str:
    """The versions and source that the answers depend on: the versions readable (a
    release of mlx or mlx-lm makes shipped answers unused, not wrong), then a digest."""
    digest = hashlib.sha256(f"{FORMAT} {versions()}".encode())
    root = Path(__file__).resolve().parent.parent
    for name in SOURCES:
        digest.update((root / name).read_bytes())
    return f"{versions()} {digest.hexdigest()}"


def path_for(config_key: str) -> Path:
    name = hashlib.sha256(f"{fingerprint()}\n{config_key}".encode()).hexdigest()[:40]
    return cache_dir() / "facts" / f"{name}.pickle"


def shipped_key(config_key: str) -> str:
    return hashlib.sha256(config_key.encode()).hexdigest()[:40]


@lru_cache(maxsize=1)
def read_shipped() -> tuple[str | None, dict]:
    """(fingerprint, {shipped_key: the pickled answers}) of the package data, (None, {})
    without it. Each config's answers stay pickled until asked for (reading them all
    would take longer than the probe)."""
    import lzma

    try:
        with lzma.open(SHIPPED, "rb") as f:
            found = pickle.load(f)
        return found["fingerprint"], found["facts"]
    except Exception:  # absent or unreadable: everything is computed
        return None, {}


def shipped(config_key: str) -> dict:
    """The package's answers for this config, when computed under this fingerprint."""
    if not USE_SHIPPED:
        return {}
    computed_under, known = read_shipped()
    blob = known.get(shipped_key(config_key)) if computed_under == fingerprint() else None
    try:
        return pickle.loads(blob) if blob else {}
    except Exception:
        return {}


def _load(path: Path, config_key: str) -> dict:
    if path not in _loaded:
        try:
            with open(path, "rb") as f:
                found = pickle.load(f)
            _loaded[path] = found if isinstance(found, dict) else {}
        except Exception:  # absent, unreadable, or written by another version: recompute
            _loaded[path] = {}
            if known := shipped(config_key):  # a catalog model: its answers ship with mlxfit
                _loaded[path] = known
                _store(path, known)
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
    """The answer `name` for this config: remembered (or shipped), else `compute()`
    (kept for next time). Errors are not remembered."""
    path = path_for(config_key)
    facts = _load(path, config_key)
    if name not in facts:
        facts[name] = compute()
        _store(path, facts)
    return facts[name]


def write_shipped(fingerprint: str, answers: dict, path: Path = SHIPPED) -> int:
    """The package data (mlxfit/cli/ship_facts.py makes it): {shipped_key: answers};
    its size in bytes."""
    import lzma

    blobs = {key: pickle.dumps(found, protocol=4) for key, found in sorted(answers.items())}
    with lzma.open(path, "wb", preset=9) as f:
        pickle.dump({"fingerprint": fingerprint, "facts": blobs}, f, protocol=4)
    return path.stat().st_size
