"""The config.json of the VLMs mlxfit ships (data/vlm_configs.json), so that probe
answers for them offline: each entry is the Hub repo's own config.json, copied whole,
with where the copy was read."""

from __future__ import annotations


def shipped_vlms() -> dict[str, dict]:
    """Lower-cased Hugging Face id -> the shipped entry (id, source, found_in, config)."""
    import json

    from .. import data_text

    return {m["id"].lower(): m for m in json.loads(data_text("vlm_configs.json"))["models"]}


def shipped_vlm(model_id) -> dict | None:
    """The shipped entry of a Hugging Face id (any case), or None."""
    return shipped_vlms().get(str(model_id).lower()) if model_id else None
