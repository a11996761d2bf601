"""Image tokens per family (mlxfit/model/images.py), pinned against the processors
mlx-vlm 0.7.10 loads for training, run on real images: each family's processor is
built offline from a folder holding its processor configs and a tiny tokenizer,
and the image placeholder tokens it writes into input_ids are counted."""

import json
import os

import pytest

from mlxfit.errors import BadInput
from mlxfit.model.images import (
    ImageGrid,
    image_rules,
    parse_image_size,
    shipped_image_facts,
    shipped_image_rules,
    stand_in_images,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the Qwen processors look on the Hub for files a folder lacks
pytest.importorskip("mlx_vlm")

SIZES = [(224, 224), (336, 336), (448, 448), (512, 384), (640, 480), (384, 640), (896, 896), (896, 672), (300, 700), (250, 891)]
SPECIALS = (
    ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<|image_pad|>", "<|vision_start|>", "<|vision_end|>",
     "<|video_pad|>", "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<fake_token_around_image>",
     "<global-img>", "<end_of_utterance>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 13) for c in range(1, 13)]
)

QWEN25_PREPROCESSOR = {  # Qwen/Qwen2.5-VL-3B-Instruct preprocessor_config.json
    "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
}
QWEN3_PREPROCESSOR = {  # Qwen/Qwen3-VL-2B-Instruct preprocessor_config.json
    "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
    "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
}
GEMMA3_PREPROCESSOR = {  # google/gemma-3-4b-it preprocessor_config.json
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256, "pan_and_scan_max_num_crops": None, "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None, "processor_class": "Gemma3Processor", "resample": 2,
    "rescale_factor": 0.00392156862745098, "size": {"height": 896, "width": 896},
}
PALIGEMMA_PREPROCESSOR = {  # google/paligemma2-3b-pt-224 preprocessor_config.json
    "do_convert_rgb": None, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "SiglipImageProcessor", "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5], "processor_class": "PaliGemmaProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"height": 224, "width": 224},
}
LLAVA_PREPROCESSOR = {  # llava-hf/llava-1.5-7b-hf preprocessor_config.json
    "crop_size": {"height": 336, "width": 336}, "do_center_crop": True, "do_convert_rgb": True,
    "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor", "resample": 3,
    "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336},
}
LLAVA_PROCESSOR = {"image_token": "<image>", "num_additional_image_tokens": 1, "patch_size": 14,
                   "processor_class": "LlavaProcessor", "vision_feature_select_strategy": "default"}
SMOLVLM_PREPROCESSOR = {  # HuggingFaceTB/SmolVLM-256M-Instruct preprocessor_config.json
    "do_convert_rgb": True, "do_image_splitting": True, "do_normalize": True, "do_pad": True,
    "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Idefics3ImageProcessor", "image_std": [0.5, 0.5, 0.5],
    "max_image_size": {"longest_edge": 512}, "processor_class": "Idefics3Processor", "resample": 1,
    "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 2048},
}


def _folder(tmp_path, config, preprocessor, processor=None):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + ["describe", "the", "picture"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in SPECIALS])
    gemma = {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"}
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        **({"extra_special_tokens": gemma} if config["model_type"] == "gemma3" else {}),
    ).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    if processor:
        (tmp_path / "processor_config.json").write_text(json.dumps(processor))
    return tmp_path


def _image(width, height):
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(width * 7 + height).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _counted(processor, marker, image_token, width, height):
    """The placeholder tokens the real processor writes for one image, and what it hands the tower."""
    import numpy as np

    out = processor(images=[_image(width, height)], text=[f"{marker} describe the picture"])
    ids = np.array(out["input_ids"]).reshape(-1)
    token_id = processor.tokenizer.convert_tokens_to_ids(image_token)
    return int((ids == token_id).sum()), out


def _check(rules, processor, marker, image_token, tower):
    for width, height in SIZES:
        grid = rules.grid(width, height)
        tokens, out = _counted(processor, marker, image_token, width, height)
        assert grid.tokens == tokens, (width, height)
        assert tower(out) == (grid.patches, grid.pixel_shape, grid.views), (width, height)


@pytest.mark.parametrize("model_type,module,cls,preprocessor", [
    ("qwen2_5_vl", "qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor", QWEN25_PREPROCESSOR),
    ("qwen2_vl", "qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor", QWEN25_PREPROCESSOR),
    ("qwen3_vl", "qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor", QWEN3_PREPROCESSOR),
])
def test_qwen_tokens_are_the_processors(tmp_path, model_type, module, cls, preprocessor):
    import importlib

    config = {"model_type": model_type, "vision_config": {"spatial_merge_size": 2}}
    folder = _folder(tmp_path, config, preprocessor)
    processor = getattr(importlib.import_module(f"mlx_vlm.models.{module}"), cls).from_pretrained(str(folder))
    rules = image_rules(config, preprocessor)

    def tower(out):
        t, h, w = (int(v) for v in out["image_grid_thw"][0].tolist())
        return t * h * w, (h * rules.patch_size, w * rules.patch_size), 1

    _check(rules, processor, "<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>", tower)


def test_qwen_counts_equal_mlx_vlms_own_estimate(tmp_path):
    from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from mlx_vlm.utils import estimate_num_image_tokens

    config = {"model_type": "qwen3_vl"}
    processor = Qwen3VLProcessor.from_pretrained(str(_folder(tmp_path, config, QWEN3_PREPROCESSOR)))
    rules = image_rules(config, QWEN3_PREPROCESSOR)
    for width, height in SIZES + [(4000, 3000), (20, 20), (8000, 60)]:
        assert rules.grid(width, height).tokens == estimate_num_image_tokens(processor, height, width)


def test_qwen_pixel_caps():
    """min/max pixels from the shipped facts: Qwen2.5-VL's 3136..12845056, Qwen3-VL's 65536..16777216."""
    qwen25 = image_rules({"model_type": "qwen2_5_vl"}, QWEN25_PREPROCESSOR)
    qwen3 = image_rules({"model_type": "qwen3_vl"}, QWEN3_PREPROCESSOR)
    assert qwen25.grid(896, 896) == ImageGrid(1024, 4096, (896, 896))  # one token per 28 × 28 pixels
    assert qwen3.grid(896, 896) == ImageGrid(784, 3136, (896, 896))  # one per 32 × 32
    assert qwen3.grid(224, 224).tokens == 64  # lifted to 65536 pixels = 256²
    capped = image_rules({"model_type": "qwen2_5_vl"}, {**QWEN25_PREPROCESSOR, "max_pixels": 512 * 28 * 28})
    assert capped.grid(4000, 3000).tokens <= 512


def _patches_of_14(out):
    """What a tower of 14-pixel patches over the whole resized image sees: patches, pixels, views."""
    _, _, h, w = out["pixel_values"].shape
    return (h // 14) * (w // 14), (h, w), out["pixel_values"].shape[0]


def test_gemma3_tokens_are_the_processors(tmp_path):
    from mlx_vlm.models.gemma3.processing_gemma3 import Gemma3Processor

    config = {"model_type": "gemma3", "vision_config": {"image_size": 896, "patch_size": 14}}
    own = {"image_seq_length": 256, "processor_class": "Gemma3Processor"}
    processor = Gemma3Processor.from_pretrained(str(_folder(tmp_path, config, GEMMA3_PREPROCESSOR, own)))
    rules = image_rules(config, {**GEMMA3_PREPROCESSOR, "processor": own})

    _check(rules, processor, "<start_of_image>", "<image_soft_token>", _patches_of_14)
    assert rules.grid(640, 480) == ImageGrid(256, 4096, (896, 896))


def test_gemma3_pan_and_scan_is_refused():
    with pytest.raises(BadInput, match="pan-and-scan"):
        image_rules({"model_type": "gemma3"}, {**GEMMA3_PREPROCESSOR, "do_pan_and_scan": True})


def test_paligemma_tokens_are_the_processors(tmp_path):
    from mlx_vlm.models.paligemma.processing_paligemma import PaliGemmaProcessor

    config = {"model_type": "paligemma", "vision_config": {"image_size": 224, "patch_size": 14, "num_image_tokens": 256}}
    processor = PaliGemmaProcessor.from_pretrained(str(_folder(tmp_path, config, PALIGEMMA_PREPROCESSOR)))
    rules = image_rules(config, PALIGEMMA_PREPROCESSOR)

    _check(rules, processor, "<image>", "<image>", _patches_of_14)
    # (image_size / patch)² where the image processor does not say
    bare = {k: v for k, v in PALIGEMMA_PREPROCESSOR.items() if k not in ("image_seq_length", "size")}
    assert image_rules({"model_type": "paligemma", "vision_config": {"image_size": 448, "patch_size": 14}}, bare).grid(9, 9).tokens == 1024


def test_llava_tokens_are_the_processors(tmp_path):
    from mlx_vlm.models.llava.processing_llava import LlavaProcessor

    config = {"model_type": "llava", "vision_config": {"image_size": 336, "patch_size": 14}}
    processor = LlavaProcessor.from_pretrained(str(_folder(tmp_path, config, LLAVA_PREPROCESSOR, LLAVA_PROCESSOR)))
    rules = image_rules(config, {**LLAVA_PREPROCESSOR, "processor": LLAVA_PROCESSOR})

    _check(rules, processor, "<image>", "<image>", _patches_of_14)
    assert rules.grid(1000, 500).tokens == 576


@pytest.mark.parametrize("preprocessor,seq_len,patch", [
    (SMOLVLM_PREPROCESSOR, 64, 16),  # SmolVLM-256M/500M-Instruct: 512-pixel tiles, 64 tokens each
    ({**SMOLVLM_PREPROCESSOR, "max_image_size": {"longest_edge": 384}, "size": {"longest_edge": 1536}}, 81, 14),  # SmolVLM-Instruct
    ({**SMOLVLM_PREPROCESSOR, "do_image_splitting": False}, 64, 16),
])
def test_idefics3_tiles_are_the_processors(tmp_path, preprocessor, seq_len, patch):
    from mlx_vlm.models.idefics3.processing_idefics3 import Idefics3Processor

    config = {"model_type": "idefics3", "scale_factor": 4 if patch == 16 else 3, "vision_config": {"patch_size": patch}}
    own = {"image_seq_len": seq_len, "processor_class": "Idefics3Processor"}
    processor = Idefics3Processor.from_pretrained(str(_folder(tmp_path, config, preprocessor, own)))
    rules = image_rules(config, {**preprocessor, "processor": own})
    assert image_rules(config, preprocessor).image_seq_len == seq_len  # from scale_factor where processor_config.json is missing

    def tower(out):
        pixels = out["pixel_values"]
        views, h, w = pixels.shape[1], pixels.shape[-2], pixels.shape[-1]
        return views * (h // patch) * (w // patch), (h, w), views

    _check(rules, processor, "<image>", "<image>", tower)


def test_smolvlm_tiles_are_the_processors(tmp_path):
    from mlx_vlm.models.smolvlm.processing_smolvlm import SmolVLMProcessor

    config = {"model_type": "smolvlm", "scale_factor": 4, "vision_config": {"patch_size": 16}}
    preprocessor = {**SMOLVLM_PREPROCESSOR, "image_processor_type": "SmolVLMImageProcessor", "processor_class": "SmolVLMProcessor"}
    own = {"image_seq_len": 64, "processor_class": "SmolVLMProcessor"}
    processor = SmolVLMProcessor.from_pretrained(str(_folder(tmp_path, config, preprocessor, own)))
    rules = image_rules(config, {**preprocessor, "processor": own})
    for width, height in SIZES:
        tokens, _ = _counted(processor, "<image>", "<image>", width, height)
        assert rules.grid(width, height).tokens == tokens, (width, height)
    assert rules.grid(224, 224) == ImageGrid(64 * 17, 17 * 1024, (512, 512), 17)  # scaled up to 2048 first


def test_unknown_family_is_one_line():
    with pytest.raises(BadInput, match="not counted yet"):
        image_rules({"model_type": "mllama"})


@pytest.mark.parametrize("text,size", [("896x672", (896, 672)), ("224X224", (224, 224)), (" 1024 x 768 ", (1024, 768))])
def test_parse_image_size(text, size):
    assert parse_image_size(text) == size


@pytest.mark.parametrize("text", ["", "896", "896x", "x672", "0x10", "896x672x3", "-1x5", "big", "20000x10", "1000x4"])
def test_parse_image_size_refuses_in_one_line(text):
    with pytest.raises(BadInput) as error:
        parse_image_size(text)
    assert "--image-size" in str(error.value) and "\n" not in str(error.value)


def test_stand_in_images():
    gemma = image_rules({"model_type": "gemma3", "vision_config": {"image_size": 896, "patch_size": 14}}, GEMMA3_PREPROCESSOR)
    default = stand_in_images(gemma, images=2)
    assert default.size == (896, 896) and default.size_is_default and default.tokens == 512
    qwen = image_rules({"model_type": "qwen2_5_vl"}, QWEN25_PREPROCESSOR)
    assert stand_in_images(qwen).size == (1024, 768)
    assert stand_in_images(qwen, (896, 672), 3).tokens == 3 * qwen.grid(896, 672).tokens
    assert stand_in_images(qwen, images=0).tokens == 0
    with pytest.raises(BadInput):
        stand_in_images(qwen, images=-1)


SHIPPED = {  # id: tokens of an 896 x 672 photo
    "Qwen/Qwen2.5-VL-3B-Instruct": 768, "Qwen/Qwen2.5-VL-7B-Instruct": 768,  # 896 x 672 / 28²
    "Qwen/Qwen3-VL-2B-Instruct": 588, "Qwen/Qwen3-VL-4B-Instruct": 588, "Qwen/Qwen3-VL-8B-Instruct": 588,  # (896 x 672) / 32²
    "google/gemma-3-4b-it": 256,
    "HuggingFaceTB/SmolVLM-256M-Instruct": 64 * 13, "HuggingFaceTB/SmolVLM-500M-Instruct": 64 * 13,  # 2048 x 1536: 4 x 3 tiles + global
    "HuggingFaceTB/SmolVLM-Instruct": 81 * 13,  # 1536 x 1152: 4 x 3 tiles + global
    "google/paligemma2-3b-pt-224": 256, "google/paligemma2-3b-pt-448": 1024,
    "llava-hf/llava-1.5-7b-hf": 576,
}


def test_shipped_processor_facts():
    """Every shipped entry names its sources and gives the count its family's rule gives."""
    facts = shipped_image_facts()
    assert {f["id"] for f in facts.values()} == set(SHIPPED)
    for model_id, tokens in SHIPPED.items():
        entry = facts[model_id.lower()]
        assert all(url.startswith(f"https://huggingface.co/{model_id}/") for url in entry["source"])
        assert shipped_image_rules(model_id).grid(896, 672).tokens == tokens, model_id
    assert shipped_image_rules("meta-llama/Llama-3.2-1B-Instruct") is None


@pytest.mark.parametrize("model_id", ["Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen3-VL-4B-Instruct", "google/gemma-3-4b-it",
                                      "HuggingFaceTB/SmolVLM-256M-Instruct", "google/paligemma2-3b-pt-448", "llava-hf/llava-1.5-7b-hf"])
def test_shipped_facts_load_into_mlx_vlms_processor(tmp_path, model_id):
    """The shipped facts, written as a checkpoint's files, make mlx-vlm's processor count what mlxfit counts."""
    import importlib

    entry = shipped_image_facts()[model_id.lower()]
    model_type = entry["config"]["model_type"]
    processor_file = {**entry.get("processor", {}), "processor_class": entry["preprocessor"]["processor_class"]}
    folder = _folder(tmp_path, entry["config"], entry["preprocessor"], processor_file if "processor" in entry else None)
    module, cls = {
        "qwen2_5_vl": ("qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor"),
        "qwen3_vl": ("qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
        "gemma3": ("gemma3.processing_gemma3", "Gemma3Processor"),
        "idefics3": ("idefics3.processing_idefics3", "Idefics3Processor"),
        "paligemma": ("paligemma.processing_paligemma", "PaliGemmaProcessor"),
        "llava": ("llava.processing_llava", "LlavaProcessor"),
    }[model_type]
    processor = getattr(importlib.import_module(f"mlx_vlm.models.{module}"), cls).from_pretrained(str(folder))
    marker, token = {"qwen2_5_vl": ("<|image_pad|>",) * 2, "qwen3_vl": ("<|image_pad|>",) * 2,
                     "gemma3": ("<start_of_image>", "<image_soft_token>")}.get(model_type, ("<image>", "<image>"))
    rules = shipped_image_rules(model_id)
    for width, height in [(896, 672), (250, 891)]:
        assert _counted(processor, marker, token, width, height)[0] == rules.grid(width, height).tokens
