"""Tiny random-weight vision-language models that mlx-vlm loads from a folder, with
a local tokenizer, processor files and an image dataset (no network): what the
vision tests and benchmarks/vision.py train with mlx-vlm's own trainer.

Each family's folder holds config.json (float32, a few MB), tokenizer files with
the family's image tokens, its processor's preprocessor_config.json and
processor_config.json. Weights are not written: mlxfit/measure/vision_child.py
draws them (random, from mlx-vlm's own model class)."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<pad>", "</s>", "<s>", "<unk>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>", "<image>", "<start_of_image>", "<end_of_image>", "<image_soft_token>",
           "<fake_token_around_image>", "<global-img>", "<end_of_utterance>", "<bos>", "<eos>"]
WORDS = ["user", "assistant", "describe", "the", "picture", "a", "cat", "dog", "on", "mat", "red", "blue", "is"]
TEMPLATE = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {% if m['content'] is string %}{{ m['content'] }}"
            "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}IMAGE"
            "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %} <|im_end|> {% endfor %}"
            "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
VOCAB = 512
MEAN, STD = [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]


def token_id(name: str) -> int:
    return SPECIAL.index(name)


def _text(hidden=64, layers=2, heads=4, kv=2, inter=128, **extra) -> dict:
    return {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
            "intermediate_size": inter, "vocab_size": VOCAB, "rms_norm_eps": 1e-6, **extra}


def _siglip(hidden=32, layers=2, heads=2, inter=64, image_size=224, patch=14) -> dict:
    return {"model_type": "siglip_vision_model", "hidden_size": hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "intermediate_size": inter, "image_size": image_size, "patch_size": patch,
            "num_channels": 3, "layer_norm_eps": 1e-6}


def family(name: str, width: int = 64, layers: int = 2, vision_width: int = 32, vision_layers: int = 2,
           image_size: int = 224) -> dict:
    """(config, preprocessor_config, processor_config, image placeholder in the template)."""
    text = _text(hidden=width, layers=layers, inter=2 * width)
    if name in ("qwen2_vl", "qwen2_5_vl"):
        vision = {"depth": vision_layers, "embed_dim": vision_width, "hidden_size": width, "num_heads": 2,
                  "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_chans": 3, "mlp_ratio": 2}
        if name == "qwen2_5_vl":
            vision = {"depth": vision_layers, "hidden_size": vision_width, "out_hidden_size": width, "num_heads": 2,
                      "intermediate_size": 2 * vision_width, "patch_size": 14, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_chans": 3, "window_size": 112, "fullatt_block_indexes": [vision_layers - 1]}
        config = {"model_type": name, **text, "rope_theta": 1e6, "tie_word_embeddings": False,
                  "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
                  "image_token_id": token_id("<|image_pad|>"), "video_token_id": token_id("<|video_pad|>"),
                  "vision_start_token_id": token_id("<|vision_start|>"), "vision_config": vision}
        pre = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
               "temporal_patch_size": 2, "min_pixels": 56 * 56, "max_pixels": 1024 * 1024,
               "image_mean": MEAN, "image_std": STD}
        return {"config": config, "preprocessor": pre, "processor": {}, "placeholder": "<|vision_start|><|image_pad|><|vision_end|>"}
    if name == "gemma3":
        tc = {"model_type": "gemma3_text", **_text(hidden=width, layers=layers, inter=2 * width), "head_dim": width // 4,
              "sliding_window": 64, "sliding_window_pattern": 2, "query_pre_attn_scalar": width // 4}
        config = {"model_type": "gemma3", "text_config": tc, "vision_config": _siglip(vision_width, vision_layers, image_size=image_size),
                  "mm_tokens_per_image": 64, "image_token_index": token_id("<image_soft_token>"),
                  "boi_token_index": token_id("<start_of_image>"), "eoi_token_index": token_id("<end_of_image>"),
                  "vocab_size": VOCAB}
        pre = {"image_processor_type": "Gemma3ImageProcessor", "size": {"height": image_size, "width": image_size},
               "image_mean": MEAN, "image_std": STD, "do_pan_and_scan": False, "processor_class": "Gemma3Processor"}
        return {"config": config, "preprocessor": pre, "processor": {"image_seq_length": 64}, "placeholder": "<start_of_image>",
                "named": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}}
    if name == "paligemma":
        tc = {"model_type": "gemma", **_text(hidden=width, layers=layers, inter=2 * width), "head_dim": width // 4,
              "num_image_tokens": (image_size // 14) ** 2}
        config = {"model_type": "paligemma", "text_config": tc, "projection_dim": width, "hidden_size": width,
                  "vision_config": {**_siglip(vision_width, vision_layers, image_size=image_size), "projection_dim": width},
                  "image_token_index": token_id("<image>"), "vocab_size": VOCAB}
        pre = {"image_processor_type": "SiglipImageProcessor", "size": {"height": image_size, "width": image_size},
               "image_mean": MEAN, "image_std": STD, "image_seq_length": (image_size // 14) ** 2, "processor_class": "PaliGemmaProcessor"}
        return {"config": config, "preprocessor": pre, "processor": {"image_seq_length": (image_size // 14) ** 2, "image_token": "<image>"},
                "placeholder": ""}
    if name == "llava":
        tc = {"model_type": "llama", **_text(hidden=width, layers=layers, inter=2 * width)}
        vc = {"model_type": "clip_vision_model", "hidden_size": vision_width, "num_hidden_layers": vision_layers,
              "num_attention_heads": 2, "intermediate_size": 2 * vision_width, "image_size": image_size, "patch_size": 14,
              "projection_dim": width, "layer_norm_eps": 1e-5}
        config = {"model_type": "llava", "text_config": tc, "vision_config": vc, "image_token_index": token_id("<image>"),
                  "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "vocab_size": VOCAB,
                  "projector_hidden_act": "gelu"}
        pre = {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": image_size},
               "crop_size": {"height": image_size, "width": image_size}, "do_center_crop": True,
               "image_mean": MEAN, "image_std": STD, "processor_class": "LlavaProcessor"}
        return {"config": config, "preprocessor": pre,
                "processor": {"patch_size": 14, "vision_feature_select_strategy": "default", "image_token": "<image>",
                              "num_additional_image_tokens": 1}, "placeholder": "<image>"}
    if name == "idefics3":
        tc = {"model_type": "llama", **_text(hidden=width, layers=layers, inter=2 * width)}
        vc = {"model_type": "idefics3_vision", "hidden_size": vision_width, "num_hidden_layers": vision_layers,
              "num_attention_heads": 2, "intermediate_size": 2 * vision_width, "image_size": 224, "patch_size": 14}
        config = {"model_type": "idefics3", "text_config": tc, "vision_config": vc, "scale_factor": 2,
                  "image_token_id": token_id("<image>"), "vocab_size": VOCAB}
        pre = {"image_processor_type": "Idefics3ImageProcessor", "size": {"longest_edge": 2 * 224},
               "max_image_size": {"longest_edge": 224}, "do_image_splitting": True, "image_mean": MEAN, "image_std": STD,
               "processor_class": "Idefics3Processor"}
        return {"config": config, "preprocessor": pre, "processor": {"image_seq_len": (224 // 14) ** 2 // 4}, "placeholder": "<image>"}
    raise ValueError(f"no tiny {name}")


FAMILIES = ("qwen2_vl", "qwen2_5_vl", "gemma3", "paligemma", "llava", "idefics3")


def write_tokenizer(folder: Path, placeholder: str, named: dict | None = None) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    for i in range(len(vocab), VOCAB - 8):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", additional_special_tokens=SPECIAL[4:], **({"extra_special_tokens": named} if named else {}))
    fast.chat_template = TEMPLATE.replace("IMAGE", placeholder)
    fast.save_pretrained(folder)


def write_model(folder: Path, name: str, **sizes) -> dict:
    """config.json, tokenizer and processor files of a tiny `name` in `folder`; its config."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    made = family(name, **sizes)
    config = {**made["config"], "torch_dtype": "float32", "eos_token_id": token_id("</s>")}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "preprocessor_config.json").write_text(json.dumps(made["preprocessor"], indent=1))
    if made["processor"]:
        (folder / "processor_config.json").write_text(json.dumps(made["processor"], indent=1))
    write_tokenizer(folder, made["placeholder"], made.get("named"))
    return config


def write_data(folder: Path, size: tuple[int, int], images: int = 1, rows: int = 4, words: int = 8, seed: int = 0) -> Path:
    """train.jsonl of `rows` chat rows with `images` random images of size (width, height) each."""
    import numpy as np
    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        paths = []
        for j in range(images):
            path = f"image{i}_{j}.png"
            Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(folder / path)
            paths.append(path)
        answer = " ".join(rng.choice(WORDS, words))
        lines.append({"images": paths, "messages": [
            {"role": "user", "content": [*([{"type": "image"}] * images), {"type": "text", "text": "describe the picture"}]},
            {"role": "assistant", "content": answer}]})
    (folder / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


if __name__ == "__main__":
    # python tests/tiny_vlms.py FOLDER [FAMILY]: a tiny VLM's config, tokenizer and processor
    # files in FOLDER (no weights) and FOLDER/data/train.jsonl with four 448x448 images.
    import sys

    target = Path(sys.argv[1])
    write_model(target, sys.argv[2] if len(sys.argv) > 2 else "qwen2_vl")
    write_data(target / "data", (448, 448))
    print(f"wrote {target} and {target / 'data'}")
