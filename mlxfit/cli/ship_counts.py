"""The catalog's miniature counts shipped as package data (mlxfit/data/miniature_counts.json):
the logits buffers that `mlxfit probe --model M --train-mode dpo|cpo|orpo` counts on
miniatures for each catalog model at mlx-lm-lora's defaults (the run and each single
change of its plan; a count does not depend on the batch, the length or the memory),
counted here under an empty cache, in this device's and these versions' section
(mlxfit/measure/shipped_counts.py uses only the matching one).

    python -m mlxfit.cli.ship_counts --write [MODEL ...]

Every catalog model (the section is replaced), or only the models named (theirs are
replaced, the others' kept). The file is written after each model: a model's 18 or so
miniatures take about 2 minutes of one CPU core at 28 blocks (2 to 3 hours for the
whole catalog), and a stopped run keeps what it counted.
"""

from __future__ import annotations

import os
import sys
import tempfile

from ..measure import miniature, shipped_counts
from ..model.resolve import catalog



def wanted(model) -> list:
    """(model, run, length) of every shape a default probe of this model counts."""
    from ..estimate.preference import shapes
    from ..model.preference import resolve_run
    from ..modes import get_mode, names

    counted = [n for n in names() if get_mode(n).counted_on_miniature]  # GRPO has no miniature
    return [item for mode in counted for item in shapes(model, resolve_run(mode, {}, {}), None, None)]


def count(items: list, on_event=lambda e: None) -> dict:
    """{shape key: count} of these shapes, each counted on its miniatures here (nothing
    shipped or remembered is used); shapes with no count are left out."""
    saved = os.environ.get("MLXFIT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="mlxfit-counts-") as tmp:
        os.environ["MLXFIT_CACHE_DIR"] = tmp
        shipped_counts.USE_SHIPPED, miniature._remembered = False, {}
        seconds_each, miniature.SECONDS_EACH = miniature.SECONDS_EACH, 20 * miniature.SECONDS_EACH  # deep models, a busy machine
        try:
            counts = miniature.logits_buffers_many(items, on_event, miniatures=True)
            keys = miniature._keys(items)
        finally:
            shipped_counts.USE_SHIPPED, miniature._remembered, miniature.SECONDS_EACH = True, {}, seconds_each
            if saved is None:
                os.environ.pop("MLXFIT_CACHE_DIR", None)
            else:
                os.environ["MLXFIT_CACHE_DIR"] = saved
    return dict(sorted((k, c) for k, c in zip(keys, counts) if k and c is not None))


def main(argv: list[str]) -> None:
    if not argv or argv[0] != "--write":
        raise SystemExit(f"usage: {shipped_counts.REGENERATE} [MODEL ...]")
    from ..model.resolve import resolve_model

    os.environ["HF_HUB_OFFLINE"] = "1"
    if not miniature.enabled(miniatures=True):
        raise SystemExit("mlx-lm-lora is not installed: nothing can be counted")
    ids = argv[1:] or [model_id for model_id, _ in catalog().values()]
    for i, model_id in enumerate(ids):
        model = resolve_model(model_id)
        if model.id not in {m for m, _ in catalog().values()}:
            raise SystemExit(f"{model_id} is not a catalog model")

        def shown(e, name=model.id):
            if e.get("event") == "stage":
                print(f"  {name}: {e['stage']}", file=sys.stderr, flush=True)

        found = count(wanted(model), shown)
        size = shipped_counts.write({model.id: found}, miniature.recipe(), replace_all=not argv[1:] and i == 0)
        print(f"{i + 1}/{len(ids)} {model.id}: {len(found)} shapes counted; {size / 1024:.1f} KiB in "
              f"{shipped_counts.SHIPPED}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
