"""`--data` of images (mlxfit/model/image_data.py): sizes read from headers, tokens
per example, the widest batch and the examples mlx-vlm truncates or refuses,
checked against mlx-vlm's own batching (collate_vlm_batch, iterate_batch_indices)."""

import base64
import io
import json

import pytest

from mlxfit.errors import BadInput
from mlxfit.model.image_data import read_image_data
from mlxfit.model.images import image_rules

QWEN = image_rules({"model_type": "qwen2_5_vl"}, {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2})
GEMMA = image_rules({"model_type": "gemma3", "vision_config": {"image_size": 896, "patch_size": 14}}, {"size": {"height": 896, "width": 896}})


def _png(path, width, height, orientation=None):
    from PIL import Image

    image = Image.new("RGB", (width, height), (200, 10, 10))
    if orientation:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(path, "JPEG", exif=exif)
    else:
        image.save(path)
    return path


def _words(n):
    return " ".join(["word"] * n)


def _count_words(conversation, images):
    """A stand-in tokenizer: one token per word, one per image marker."""
    return sum(len(str(m["content"]).split()) for m in conversation) + images


def _dataset(tmp_path, rows):
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return tmp_path


def test_sizes_from_headers_and_tokens(tmp_path):
    (tmp_path / "img").mkdir()
    _png(tmp_path / "img/a.png", 896, 672)
    _png(tmp_path / "img/b.jpg", 640, 480, orientation=6)  # stored landscape, shown portrait
    buffer = io.BytesIO()
    from PIL import Image

    Image.new("RGB", (300, 200)).save(buffer, "PNG")
    data_uri = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rows = [
        {"images": ["img/a.png"], "messages": [{"role": "user", "content": _words(10)}, {"role": "assistant", "content": _words(5)}]},
        {"image": "img/b.jpg", "conversations": [{"from": "human", "value": _words(3)}, {"from": "gpt", "value": _words(2)}]},
        {"images": [{"path": "img/a.png"}, data_uri], "question": _words(4), "answer": _words(4)},
        {"images": [{"bytes": base64.b64encode(buffer.getvalue()).decode()}], "messages": [{"role": "user", "content": "hi"}]},
    ]
    data = read_image_data(_dataset(tmp_path, rows), QWEN, max_seq_length=4096, count_text=_count_words)
    sizes = [e.image_sizes for e in data.examples]
    assert sizes == [((896, 672),), ((480, 640),), ((896, 672), (300, 200)), ((300, 200),)]
    first, second, third, _ = data.examples
    assert first.image_tokens == QWEN.grid(896, 672).tokens == 768 and first.text_tokens == 16
    assert second.image_tokens == QWEN.grid(480, 640).tokens and second.text_tokens == 6
    assert third.image_tokens == QWEN.grid(896, 672).tokens + QWEN.grid(300, 200).tokens
    assert data.images == 5 and data.refused == data.truncated == ()
    assert data.text_counted_by == "tokenizer"


def _ids(example, before_images, image_id=7):
    import numpy as np

    after = example.text_tokens - before_images
    return np.array([1] * before_images + [image_id] * example.image_tokens + [2] * after, dtype=np.int32)


@pytest.mark.parametrize("max_seq_length", [300, 600, 1024, 1100, 2048])
def test_truncated_and_refused_as_mlx_vlm_collates(tmp_path, max_seq_length):
    """Each example's fate is what mlx-vlm's collate_vlm_batch does to its tokens."""
    pytest.importorskip("mlx_vlm")
    from mlx_vlm.trainer.vlm.sft.runtime import collate_vlm_batch

    rows = [
        {"images": ["a.png"], "messages": [{"role": "user", "content": _words(n)}, {"role": "assistant", "content": _words(m)}]}
        for n, m in [(5, 5), (20, 400), (200, 30), (5, 900)]
    ]
    _png(tmp_path / "a.png", 896, 896)
    data = read_image_data(_dataset(tmp_path, rows), GEMMA, max_seq_length=max_seq_length, count_text=_count_words)
    for example, row in zip(data.examples, rows):
        before = len(row["messages"][0]["content"].split()) + 1  # the prompt, its marker included
        sample = {"input_ids": _ids(example, before), "pixel_values": object()}
        try:
            batch = collate_vlm_batch([sample], max_seq_length, image_token_id=7)
        except ValueError:
            assert example.status == "refused", example
            continue
        assert example.status == ("truncated" if example.tokens > max_seq_length else "fits"), example
        assert batch["input_ids"].shape[1] == min(-(-example.tokens // 32) * 32, max_seq_length)


def test_widest_batch_as_mlx_vlm_batches(tmp_path):
    pytest.importorskip("mlx_vlm")
    from mlx_vlm.trainer.common.utils import iterate_batch_indices

    sizes = [(224, 224), (896, 896), (1200, 800), (640, 480), (300, 900)]
    rows = []
    for i, (w, h) in enumerate(sizes):
        _png(tmp_path / f"{i}.png", w, h)
        rows.append({"images": [f"{i}.png"], "messages": [{"role": "user", "content": _words(3 * i)}, {"role": "assistant", "content": _words(7)}]})
    rows.append({"messages": [{"role": "user", "content": _words(2000)}, {"role": "assistant", "content": "x"}]})  # text only
    rows.append({"messages": [{"role": "user", "content": _words(10)}, {"role": "assistant", "content": "x"}]})
    for batch_size in (1, 2, 3):
        data = read_image_data(_dataset(tmp_path, rows), QWEN, max_seq_length=4096, batch_size=batch_size, count_text=_count_words)
        lengths = [e.tokens for e in data.examples]
        media = [bool(e.image_sizes) for e in data.examples]
        batches = list(iterate_batch_indices(len(rows), batch_size, length_key=lengths.__getitem__, group_key=media.__getitem__))
        expected = max(min(-(-min(max(lengths[i] for i in b), 4096) // 32) * 32, 4096) for b in batches)
        assert data.widest.length == expected and data.widest.rows == batch_size


def test_without_a_tokenizer_the_count_is_approximate(tmp_path):
    _png(tmp_path / "a.png", 100, 100)
    rows = [{"images": ["a.png"], "messages": [{"role": "user", "content": "x" * 40}, {"role": "assistant", "content": "y" * 8}]}]
    data = read_image_data(_dataset(tmp_path, rows), QWEN, max_seq_length=2048)
    assert data.examples[0].text_tokens == 12 + 8 + 1 and "characters" in data.text_counted_by


@pytest.mark.parametrize("row,message", [
    ({"images": ["missing.png"], "messages": [{"role": "user", "content": "a"}]}, "not found"),
    ({"images": ["https://example.com/a.png"], "messages": [{"role": "user", "content": "a"}]}, "is a URL"),
    ({"images": ["bad.png"], "messages": [{"role": "user", "content": "a"}]}, "cannot be read"),
    ({"images": [], "text": "a"}, "`messages` or `conversations`"),
    ({"images": [{"nothing": 1}], "messages": [{"role": "user", "content": "a"}]}, "neither `path` nor `bytes`"),
])
def test_bad_rows_are_one_line(tmp_path, row, message):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(BadInput, match=message) as error:
        read_image_data(_dataset(tmp_path, [row]), QWEN, max_seq_length=2048)
    assert "\n" not in str(error.value) and "row 1" in str(error.value)


def test_missing_data_and_bad_json_are_one_line(tmp_path):
    with pytest.raises(BadInput, match="no train.jsonl"):
        read_image_data(tmp_path, QWEN, max_seq_length=2048)
    (tmp_path / "train.jsonl").write_text("{not json\n")
    with pytest.raises(BadInput, match="line 1 is not JSON"):
        read_image_data(tmp_path, QWEN, max_seq_length=2048)
    with pytest.raises(BadInput, match="no such file"):
        read_image_data(tmp_path / "nope.jsonl", QWEN, max_seq_length=2048)
