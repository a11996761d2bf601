"""The catalog's answers shipped as package data (mlxfit/data/facts.pickle.xz):
what `mlxfit probe --model M --memory X --json` computes for each catalog model
under an empty cache, kept with the fingerprint it was computed under
(mlxfit/model/facts.py uses it only while that matches).

    python -m mlxfit.cli.ship_facts --write
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import tempfile
from pathlib import Path

from ..model import facts
from ..model.lazy_model import config_key
from ..model.resolve import catalog

# Macs that fit each model and Macs that make probe plan (its remedies, the models it
# compares), at mlx-lm's defaults otherwise.
MEMORIES = ("8GB", "16GB", "24GB", "36GB", "64GB", "128GB")


def generate() -> dict:
    from .main import cli

    with tempfile.TemporaryDirectory(prefix="mlxfit-facts-") as tmp:
        os.environ["MLXFIT_CACHE_DIR"] = tmp
        os.environ["HF_HUB_OFFLINE"] = "1"
        facts.USE_SHIPPED = False  # everything computed, nothing copied from the old data
        facts._loaded.clear()
        paths = {}
        for model_id, config in catalog().values():
            paths[facts.path_for(config_key(config))] = facts.shipped_key(config_key(config))
            for memory in MEMORIES:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    try:
                        cli.main(["probe", "--model", model_id, "--memory", memory, "--json"], standalone_mode=False)
                    except SystemExit:
                        pass
        found = {}
        for path in (Path(tmp) / "facts").glob("*.pickle"):
            if path in paths:  # only the catalog's configs (not a slice or another config a probe built)
                with open(path, "rb") as f:
                    found[paths[path]] = pickle.load(f)
        return {"fingerprint": facts.fingerprint(), "facts": found}


def main(argv: list[str]) -> None:
    if argv != ["--write"]:
        raise SystemExit(f"usage: {facts.REGENERATE}")
    data = generate()
    size = facts.write_shipped(data["fingerprint"], data["facts"])
    print(f"{len(data['facts'])} catalog configs, {size / 1024:.0f} KiB written to {facts.SHIPPED}")


if __name__ == "__main__":
    main(sys.argv[1:])
