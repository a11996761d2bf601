"""`--data` of images in mlx-vlm's formats: each example's text and image tokens,
the widest batch, and the examples mlx-vlm truncates or refuses at a length.

The format is mlx-vlm 0.7.10's (mlx_vlm/trainer/datasets/loading.py: a `.jsonl`
file, or a folder of `<split>.jsonl`; mlx_vlm/trainer/vlm/sft/dataset.py: rows with
`messages` or `conversations`, or `question` and `answer`, and `images` or `image`:
a path relative to the split's folder, {"path": ...}, {"bytes": ...} or a data:
URI). Each image's width and height are read from its header (PIL opens files
lazily; no pixel is decoded), turned the way mlx-vlm's `load_image` turns them
(EXIF orientation), and counted with the family's rule (model/images.py).

Batching is mlx-vlm's SFT trainer's (mlx_vlm/trainer/vlm/sft/runtime.py and
trainer/common/utils.py): examples grouped by whether they hold images, sorted
by length, cut into full batches (the rest dropped), each padded to a multiple of
32 no longer than max_seq_length. A longer example is truncated if every image
placeholder stays within max_seq_length; if not, `collate_vlm_batch` raises and the
run stops there ("refused" below). Where the images stand within the prompt is not
known here, so an example is refused when its prompt with all its images passes
max_seq_length (images placed before the prompt's last words err toward refusing).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import BadInput
from ..files import read_text
from .images import Rules

PAD_TO = 32  # mlx_vlm/trainer/vlm/config.py: VLMTrainingArgs.pad_to_multiple
SPLITS = ("train", "validation", "valid", "test")  # mlx_vlm/trainer/datasets/loading.py
APPROX_CHARS_PER_TOKEN = 4
APPROX_TOKENS_PER_MESSAGE = 4  # role markers and separators of a chat template
ROTATED = (5, 6, 7, 8)  # EXIF orientations that swap width and height

# text tokens of one conversation holding `images` image markers
TextCounter = Callable[[list, int], int]


@dataclass(frozen=True)
class ImageExample:
    index: int  # the row's place in its split, from 0
    image_sizes: tuple[tuple[int, int], ...]  # (width, height) of each image, upright
    text_tokens: int
    image_tokens: int
    status: str  # "fits" | "truncated" | "refused"

    @property
    def tokens(self) -> int:
        return self.text_tokens + self.image_tokens


@dataclass(frozen=True)
class WidestBatch:
    rows: int
    length: int  # padded, as the trainer pads
    text_tokens: int  # of its longest example
    image_tokens: int


@dataclass(frozen=True)
class ImageData:
    path: str
    examples: tuple[ImageExample, ...]
    widest: WidestBatch | None  # None: not one full batch
    max_seq_length: int
    batch_size: int
    text_counted_by: str

    @property
    def truncated(self) -> tuple[int, ...]:
        return tuple(e.index for e in self.examples if e.status == "truncated")

    @property
    def refused(self) -> tuple[int, ...]:
        return tuple(e.index for e in self.examples if e.status == "refused")

    @property
    def images(self) -> int:
        return sum(len(e.image_sizes) for e in self.examples)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {"file": self.path, "rows": len(self.examples), "images": self.images,
                "widest_batch": asdict(self.widest) if self.widest else None,
                "truncated_rows": [i + 1 for i in self.truncated], "refused_rows": [i + 1 for i in self.refused],
                "text_counted_by": self.text_counted_by, "max_seq_length": self.max_seq_length,
                "batch_size": self.batch_size}


def approximate_text_tokens(conversation: list, images: int) -> int:
    """Without a tokenizer: characters / 4, and 4 per message for the template."""
    chars = sum(len(_text_of(m.get("content", ""))) for m in conversation)
    return -(-chars // APPROX_CHARS_PER_TOKEN) + APPROX_TOKENS_PER_MESSAGE * len(conversation) + images


def read_image_data(
    path,
    rules: Rules,
    *,
    max_seq_length: int,
    batch_size: int = 1,
    count_text: TextCounter | None = None,
    split: str = "train",
) -> ImageData:
    """Measure `--data` for a VLM: `count_text(conversation, images)` counts a row's
    text tokens with one marker per image (the model's chat template and tokenizer);
    without it the count is approximate."""
    if max_seq_length < 2 or batch_size < 1:
        raise BadInput("max_seq_length must be 2 or more and the batch size 1 or more")
    rows, base = _rows(Path(path), split)
    counter = count_text or approximate_text_tokens
    examples = []
    for index, row in enumerate(rows):
        where = f"{path}: row {index + 1}"
        conversation = _conversation(row, where)
        sizes = tuple(_image_size(value, base, where) for value in _images(row))
        grids = [rules.grid(w, h) for w, h in sizes]
        text = int(counter(conversation, len(sizes)))
        image_tokens = sum(g.tokens for g in grids)
        prompt = _prompt(conversation)
        before = text if len(prompt) == len(conversation) else int(counter(prompt, len(sizes)))
        examples.append(ImageExample(index, sizes, text, image_tokens, _status(text, before, image_tokens, max_seq_length)))
    return ImageData(
        str(path),
        tuple(examples),
        _widest(examples, batch_size, max_seq_length),
        max_seq_length,
        batch_size,
        "tokenizer" if count_text else f"characters ({APPROX_CHARS_PER_TOKEN} per token, assumed: no tokenizer)",
    )


def _prompt(conversation: list) -> list:
    """The messages before the first answer, where mlx-vlm's rows hold their images."""
    first_answer = next((i for i, m in enumerate(conversation) if m["role"] in ("assistant", "gpt", "bot")), None)
    return conversation if first_answer in (None, 0) else conversation[:first_answer]


def _status(text: int, before_answer: int, image_tokens: int, max_seq_length: int) -> str:
    if text + image_tokens <= max_seq_length:
        return "fits"
    # collate_vlm_batch truncates at max_seq_length unless a placeholder would be
    # cut: the last image ends at most where the prompt (its text and every image) ends
    return "refused" if image_tokens and before_answer + image_tokens > max_seq_length else "truncated"


def _widest(examples: list[ImageExample], batch_size: int, max_seq_length: int) -> WidestBatch | None:
    # mlx_vlm/trainer/common/utils.py: iterate_batch_indices
    groups: dict[bool, list[ImageExample]] = {}
    for example in examples:
        groups.setdefault(bool(example.image_sizes), []).append(example)
    widest = None
    for group in groups.values():
        ordered = sorted(group, key=lambda e: e.tokens)
        for start in range(0, len(ordered) - batch_size + 1, batch_size):
            batch = ordered[start:start + batch_size]
            longest = max(batch, key=lambda e: e.tokens)
            length = min(max(2, -(-min(longest.tokens, max_seq_length) // PAD_TO) * PAD_TO), max_seq_length)
            if widest is None or length > widest.length:
                widest = WidestBatch(len(batch), length, longest.text_tokens, longest.image_tokens)
    return widest


def _rows(path: Path, split: str) -> tuple[list[dict], Path]:
    if path.is_dir():
        names = (split,) + tuple(s for s in SPLITS if s != split)
        found = next((path / f"{name}.jsonl" for name in names if (path / f"{name}.jsonl").exists()), None)
        if found is None:
            raise BadInput(f"--data {path}: no {split}.jsonl (mlx-vlm reads one .jsonl per split)")
        base, file = path, found
    elif path.is_file():
        base, file = path.parent, path
    else:
        raise BadInput(f"--data {path}: no such file or folder")
    rows = []
    for number, line in enumerate(read_text(file, "--data", BadInput).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise BadInput(f"--data {file}: line {number} is not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise BadInput(f"--data {file}: line {number} is not a JSON object")
        rows.append(row)
    if not rows:
        raise BadInput(f"--data {file}: no examples")
    return rows, base


def _conversation(row: dict, where: str) -> list:
    # mlx_vlm/trainer/vlm/sft/dataset.py: VisionDataset._conversation
    conversation = row.get("messages", row.get("conversations"))
    if conversation is None and "question" in row and "answer" in row:
        conversation = [{"role": "user", "content": row["question"]}, {"role": "assistant", "content": row["answer"]}]
    if isinstance(conversation, str):
        try:
            conversation = json.loads(conversation)
        except json.JSONDecodeError:
            raise BadInput(f"{where}: its conversation string is not a JSON list of messages") from None
    if not isinstance(conversation, list) or not conversation or not all(isinstance(m, dict) for m in conversation):
        raise BadInput(f"{where}: needs a non-empty `messages` or `conversations` list of messages")
    return [{"role": m.get("role", m.get("from")), "content": m.get("content", m.get("value", ""))} for m in conversation]


def _images(row: dict) -> list:
    value = next((row[k] for k in ("images", "image") if row.get(k) is not None), None)
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _image_size(value, base: Path, where: str) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, dict):
        if value.get("bytes") is not None:
            data = value["bytes"]
            source = io.BytesIO(data if isinstance(data, bytes) else base64.b64decode(data))
        elif value.get("path") is not None:
            return _image_size(value["path"], base, where)
        else:
            raise BadInput(f"{where}: an image entry with neither `path` nor `bytes`")
    elif isinstance(value, str) and value.startswith("data:image/") and "," in value:
        source = io.BytesIO(base64.b64decode(value.split(",", 1)[1]))
    elif isinstance(value, str) and value.startswith(("http://", "https://")):
        raise BadInput(f"{where}: image {value} is a URL; mlxfit reads only local images (download the data first)")
    elif isinstance(value, str):
        file = Path(value[len("file://"):] if value.startswith("file://") else value)
        source = file if file.is_absolute() else base / file
        if not source.exists():
            raise BadInput(f"{where}: image {value} not found (looked in {source})")
    else:
        raise BadInput(f"{where}: an image must be a path, a data: URI or {{'path'|'bytes': ...}}")
    try:
        with Image.open(source) as image:
            width, height = image.size
            orientation = image.getexif().get(0x0112)
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise BadInput(f"{where}: image {str(value)[:80]} cannot be read ({type(error).__name__})") from None
    return (height, width) if orientation in ROTATED else (width, height)


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(_text_of(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
    return str(content)
