"""The user's training data measured in tokens, the way mlx-lm tokenizes and batches it.

Tokenization is mlx-lm's own: each line goes through the `process` method of the
dataset class mlx_lm.tuner.datasets.create_dataset would pick, with the tokenizer
loaded by mlx_lm.utils.load_tokenizer. The file is read one line at a time; only
one small integer array per example is kept. mlx_lm, transformers and numpy are
imported inside the functions that need them.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..errors import BadInput, MlxfitError
from ..files import read_text

APPROX_CHARS_PER_TOKEN = 4
COUNTED_BY_TOKENIZER = "tokenizer"
COUNTED_BY_CHARACTERS = f"characters ({APPROX_CHARS_PER_TOKEN} per token, assumed: no tokenizer)"
APPROX_TOKENS_PER_MESSAGE = 4  # role markers and separators of a chat template
PAD_TO = 32  # mlx_lm/tuner/trainer.py: iterate_batches pads to 1 + a multiple of 32
BAD_LINES_LISTED = 5
PROGRESS_EVERY = 100  # lines between on_progress calls
FEATURES = {  # mlx_lm/tuner/datasets.py: create_dataset's getattr defaults
    "prompt_feature": "prompt",
    "completion_feature": "completion",
    "text_feature": "text",
    "chat_feature": "messages",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")

Progress = Callable[[int, int, int], None]  # (lines_done, bytes_done, total_bytes)


@dataclass(frozen=True)
class TokenizerChoice:
    """A loaded tokenizer (mlx-lm's TokenizerWrapper), or None to estimate from characters."""

    tokenizer: object | None
    source: str  # "model folder" | "hub cache" | "fetched from the Hugging Face Hub" | "approximation: 4 chars per token"
    note: str | None = None  # why there is no tokenizer, when approximating

    @property
    def approximate(self) -> bool:
        return self.tokenizer is None

    @property
    def counted_by(self) -> str:
        """How tokens are counted, in the words text and JSON both use."""
        return COUNTED_BY_CHARACTERS if self.approximate else COUNTED_BY_TOKENIZER


def approximation(note: str | None = None) -> TokenizerChoice:
    return TokenizerChoice(None, f"approximation: {APPROX_CHARS_PER_TOKEN} chars per token", note)


@dataclass(frozen=True)
class DataStats:
    file: str
    format: str  # "completions" | "chat" | "text"
    examples: int
    p50: int
    p90: int
    p99: int
    max: int
    truncated: int  # examples longer than max_seq_length
    tokens_lost: int  # tokens cut off those examples
    worst_batch_tokens: int  # width of the widest padded batch, as iterate_batches makes it
    batch_size: int
    max_seq_length: int
    tokenizer_source: str
    approximate: bool
    skipped_lines: int = 0
    no_tokenizer_reason: str | None = None  # why tokens were counted by characters
    bad_lines: tuple[tuple[int, str], ...] = ()  # (line number, problem), the first few
    lengths: array = field(default_factory=lambda: array("I"), repr=False, compare=False)
    batch_widths: tuple = field(default=(), repr=False, compare=False)  # every batch's width, as iterate_batches cuts them

    @property
    def tokens_counted_by(self) -> str:
        return COUNTED_BY_CHARACTERS if self.approximate else COUNTED_BY_TOKENIZER

    def to_dict(self) -> dict:
        return {
            "file": self.file,
            "format": self.format,
            "examples": self.examples,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "truncated": self.truncated,
            "tokens_lost": self.tokens_lost,
            "worst_batch_tokens": self.worst_batch_tokens,
            "batch_size": self.batch_size,
            "max_seq_length": self.max_seq_length,
            "tokenizer_source": self.tokenizer_source,
            "approximate": self.approximate,
            "tokens_counted_by": self.tokens_counted_by,
            "no_tokenizer_reason": self.no_tokenizer_reason,
            "skipped_lines": self.skipped_lines,
            "bad_lines": [{"line": n, "problem": p} for n, p in self.bad_lines],
        }


# --- pure helpers -------------------------------------------------------------------


def padded_length(longest: int, max_seq_length: int) -> int:
    """Width of a batch whose longest example has `longest` tokens (iterate_batches)."""
    return min(1 + PAD_TO * ((longest + PAD_TO - 1) // PAD_TO), max_seq_length)


def worst_batch_tokens(
    lengths: Sequence[int], batch_size: int, max_seq_length: int, order: Sequence[int] | None = None
) -> int:
    """The widest batch mlx-lm's iterate_batches builds from these examples.

    iterate_batches sorts the examples (stably) by a key, cuts batches of batch_size
    and drops the remainder, the last examples in that order. The key is `order`:
    by default the token lengths, as for a list of tokenized examples; mlx_lm.lora
    wraps its data in CacheDataset, whose key is the number of fields of each JSON
    line (DataStats passes those).
    """
    import numpy as np

    n = len(lengths)
    if batch_size < 1:
        raise BadInput(f"batch-size must be at least 1, got {batch_size}")
    if n < batch_size:  # iterate_batches' own check, in its words
        raise BadInput(f"Dataset must have at least batch_size={batch_size} examples but only has {n}.")
    lens = np.asarray(lengths)
    keep = np.ones(n, dtype=bool)
    dropped = n % batch_size
    if dropped:
        keys = lens if order is None else np.asarray(order)
        if len(keys) != n:
            raise ValueError("order must have one key per example")
        # The last `dropped` of a stable sort are the largest (key, index) pairs.
        kth = np.partition(keys, n - dropped)[n - dropped]
        keep[keys > kth] = False
        ties = np.flatnonzero(keys == kth)
        keep[ties[len(ties) - (dropped - (n - int(keep.sum()))) :]] = False
    return padded_length(int(lens[keep].max()), max_seq_length)


def smallest_max_length(lengths: Sequence[int], keep_share: float = 0.95) -> int:
    """The smallest max_seq_length that leaves keep_share of the examples uncut."""
    import numpy as np

    if not 0 < keep_share <= 1:
        raise BadInput(f"keep share must be in (0, 1], got {keep_share}")
    if len(lengths) == 0:
        raise BadInput("no examples")
    return _rank(np.sort(np.asarray(lengths)), keep_share)


def _rank(sorted_lengths, share: float) -> int:
    """Nearest-rank percentile: the smallest value with at least `share` at or below it."""
    n = len(sorted_lengths)
    k = max(1, math.ceil(share * n - 1e-9))
    return int(sorted_lengths[k - 1])


# --- the data file ------------------------------------------------------------------


def training_file(data: str | Path) -> Path:
    """train.jsonl of a data folder (as mlx_lm.lora --data), or a .jsonl file itself."""
    path = Path(data).expanduser()
    if path.is_dir():
        train = path / "train.jsonl"
        if not train.is_file():
            raise BadInput(f"{path} has no train.jsonl (mlx-lm reads train.jsonl and valid.jsonl from it)")
        return train
    if path.is_file():
        return path
    raise BadInput(
        f"data {str(data)!r} is not a folder with train.jsonl nor a .jsonl file "
        "(Hugging Face datasets are not measured)"
    )


def valid_file(data: str | Path) -> Path | None:
    """valid.jsonl of a data folder (mlx_lm.lora evaluates it while training), or None."""
    path = Path(data).expanduser()
    valid = path / "valid.jsonl" if path.is_dir() else None
    return valid if valid is not None and valid.is_file() else None


def detect_format(record: dict, features: dict | None = None) -> str | None:
    """The format mlx-lm picks from a record: create_dataset's order of preference."""
    f = {**FEATURES, **(features or {})}
    if f["prompt_feature"] in record and f["completion_feature"] in record:
        return "completions"
    if f["chat_feature"] in record:
        return "chat"
    if f["text_feature"] in record:
        return "text"
    return None


def _needs(fmt: str, f: dict) -> tuple[str, ...]:
    return {
        "completions": (f["prompt_feature"], f["completion_feature"]),
        "chat": (f["chat_feature"],),
        "text": (f["text_feature"],),
    }[fmt]


class _BadLine(Exception):
    pass


def measure(
    data: str | Path,
    tokenizer: TokenizerChoice,
    *,
    batch_size: int = 4,
    max_seq_length: int = 2048,
    mask_prompt: bool = False,
    features: dict | None = None,
    skip_bad_lines: bool = False,
    on_progress: Progress | None = None,
) -> DataStats:
    """Token lengths of the training examples and the batches mlx-lm would make of them.

    `features` renames fields as mlx-lm's config does (prompt_feature, completion_feature,
    text_feature, chat_feature). Bad lines raise MlxfitError naming the line, or with
    skip_bad_lines are counted and left out.
    """
    path = training_file(data)
    f = {**FEATURES, **(features or {})}
    try:
        total = path.stat().st_size
    except OSError as e:
        raise MlxfitError(f"cannot read {path}: {e.strerror}") from e
    if total == 0:
        raise BadInput(f"{path} is empty")

    lengths, fields_per_line = array("I"), array("B")
    fmt, first_line, count = None, 0, None
    skipped, bad = 0, []
    done = lineno = 0
    try:
        fid = open(path, "rb")
    except OSError as e:
        raise MlxfitError(f"cannot read {path}: {e.strerror}") from e
    with fid:
        for lineno, raw in enumerate(fid, 1):
            done += len(raw)
            try:
                record = _parse(raw)
                if fmt is None:
                    fmt = detect_format(record, f)
                    if fmt is None:
                        raise _BadLine(
                            f"has none of the fields mlx-lm reads ({f['prompt_feature']}+"
                            f"{f['completion_feature']}, {f['chat_feature']} or {f['text_feature']})"
                        )
                    if mask_prompt and fmt == "text":  # create_dataset's ValueError
                        raise BadInput(f"{path}: Prompt masking not supported for text dataset.")
                    first_line = lineno
                    count = _counter(fmt, tokenizer, f)
                else:
                    missing = [k for k in _needs(fmt, f) if k not in record]
                    if missing:
                        other = detect_format(record, f)
                        if other is not None:
                            raise _BadLine(f"is {other} data but the file is {fmt} data (from line {first_line})")
                        raise _BadLine(f"lacks {', '.join(map(repr, missing))}, which {fmt} data needs")
                n = count(record)
            except _BadLine as e:
                if not skip_bad_lines:
                    raise BadInput(f"{path}: line {lineno} {e}") from None
                skipped += 1
                if len(bad) < BAD_LINES_LISTED:
                    bad.append((lineno, str(e)))
                continue
            lengths.append(n)
            fields_per_line.append(min(len(record), 255))
            if on_progress is not None and lineno % PROGRESS_EVERY == 0:
                on_progress(lineno, done, total)
    if on_progress is not None:
        on_progress(lineno, done, total)
    if not lengths:
        first = f" (first: line {bad[0][0]} {bad[0][1]})" if bad else ""
        raise BadInput(f"{path} has no usable examples: all {skipped} lines are bad{first}")
    return _stats(path, fmt, lengths, fields_per_line, tokenizer, batch_size, max_seq_length, skipped, bad)


def json_problem(e: json.JSONDecodeError) -> str:
    """json's message with its position ('Unterminated string starting at' ends in 'at')."""
    msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
    return f"{msg} at column {e.colno}"


def _parse(raw: bytes) -> dict:
    if not raw.strip():
        raise _BadLine("is empty (mlx-lm parses every line as JSON)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _BadLine("is not UTF-8 text") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise _BadLine(f"is not valid JSON: {json_problem(e)}") from None
    if not isinstance(record, dict):
        raise _BadLine(f"is a JSON {type(record).__name__}, not an object")
    return record


def _counter(fmt: str, choice: TokenizerChoice, f: dict) -> Callable[[dict], int]:
    """record -> token count: mlx-lm's own per-item processing, or the approximation."""
    if choice.tokenizer is None:
        return _approx_counter(fmt, f)
    from mlx_lm.tuner.datasets import ChatDataset, CompletionsDataset, TextDataset

    tok = choice.tokenizer
    if fmt != "text":
        has_template = getattr(tok, "has_chat_template", None)
        if has_template is None:
            has_template = getattr(tok, "chat_template", None) is not None
        if not has_template:
            raise BadInput(f"the tokenizer ({choice.source}) has no chat template, which mlx-lm needs for {fmt} data")
    # Prompt masking changes offsets, not lengths: build without it (one template call).
    dataset = {
        "completions": lambda: CompletionsDataset([], tok, f["prompt_feature"], f["completion_feature"], False),
        "chat": lambda: ChatDataset([], tok, chat_key=f["chat_feature"], mask_prompt=False),
        "text": lambda: TextDataset([], tok, text_key=f["text_feature"]),
    }[fmt]()

    def count(record: dict) -> int:
        try:
            return len(dataset.process(record)[0])
        except Exception as e:  # a template or tokenizer rejecting the record
            message = " ".join(str(e).split())[:200] or type(e).__name__
            raise _BadLine(f"cannot be tokenized as mlx-lm does: {type(e).__name__}: {message}") from None

    return count


def approximate_tokens(text) -> int:
    """Tokens of a text (or of a JSON value, as written) at APPROX_CHARS_PER_TOKEN."""
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False)
    return math.ceil(len(text) / APPROX_CHARS_PER_TOKEN)


class CharacterTokenizer:
    """Stands in for the tokenizer where there is none, for mlx-lm-lora's dataset classes
    (mlx_lm_lora/trainer/datasets.py calls encode and apply_chat_template, and reads
    eos_token_id): the same count as the approximation of mlx-lm's data, characters
    over APPROX_CHARS_PER_TOKEN and APPROX_TOKENS_PER_MESSAGE per message."""

    eos_token_id = 0
    has_thinking = False

    def encode(self, text, **kwargs) -> list[int]:
        return [0] * approximate_tokens(text)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=True, **kwargs):
        n = sum(approximate_tokens(m.get("content") or "") + APPROX_TOKENS_PER_MESSAGE for m in messages)
        n += (approximate_tokens(tools) if tools else 0) + (APPROX_TOKENS_PER_MESSAGE if add_generation_prompt else 0)
        return [0] * n if tokenize else "x" * (n * APPROX_CHARS_PER_TOKEN)


def _approx_counter(fmt: str, f: dict) -> Callable[[dict], int]:
    tokens = approximate_tokens

    def tools(record) -> int:
        return tokens(record["tools"]) if record.get("tools") else 0

    def text(record):
        value = record[f["text_feature"]]
        if not isinstance(value, str):
            raise _BadLine(f"has a {f['text_feature']!r} that is not text")
        return tokens(value) + 1  # eos

    def chat(record):
        messages = record[f["chat_feature"]]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise _BadLine(f"has a {f['chat_feature']!r} that is not a list of messages")
        return sum(tokens(m.get("content") or "") + APPROX_TOKENS_PER_MESSAGE for m in messages) + tools(record)

    def completions(record):
        turns = (record[f["prompt_feature"]], record[f["completion_feature"]])
        return sum(tokens(t) + APPROX_TOKENS_PER_MESSAGE for t in turns) + tools(record)

    return {"text": text, "chat": chat, "completions": completions}[fmt]


def batch_widths(lengths: Sequence[int], batch_size: int, max_seq_length: int,
                 order: Sequence[int] | None = None) -> tuple[int, ...]:
    """The width of every batch iterate_batches cuts: the examples sorted (stably) by
    `order` (default their lengths), cut in batch_size, the remainder dropped, each
    padded to its longest (padded_length)."""
    import numpy as np

    lens = np.asarray(lengths)
    if len(lens) < batch_size:
        return ()
    keys = lens if order is None else np.asarray(order)
    idx = np.argsort(keys, kind="stable")
    usable = len(idx) - len(idx) % batch_size
    longest = lens[idx[:usable]].reshape(-1, batch_size).max(axis=1)
    return tuple(padded_length(int(x), max_seq_length) for x in longest)


def _stats(path, fmt, lengths, fields_per_line, choice, batch_size, max_seq_length, skipped, bad) -> DataStats:
    import numpy as np

    lens = np.frombuffer(lengths, dtype=np.uint32)
    ordered = np.sort(lens)
    over = lens[lens > max_seq_length].astype(np.int64)
    return DataStats(
        file=str(path),
        format=fmt,
        examples=len(lens),
        p50=_rank(ordered, 0.50),
        p90=_rank(ordered, 0.90),
        p99=_rank(ordered, 0.99),
        max=int(ordered[-1]),
        truncated=int(len(over)),
        tokens_lost=int((over - max_seq_length).sum()),
        # mlx_lm.lora batches a CacheDataset: sorted by fields per line, not by tokens.
        worst_batch_tokens=worst_batch_tokens(lens, batch_size, max_seq_length, order=fields_per_line),
        batch_size=batch_size,
        max_seq_length=max_seq_length,
        tokenizer_source=choice.source,
        approximate=choice.approximate,
        no_tokenizer_reason=choice.note if choice.approximate else None,
        skipped_lines=skipped,
        bad_lines=tuple(bad),
        lengths=lengths,
        batch_widths=batch_widths(lens, batch_size, max_seq_length, order=fields_per_line),
    )


# --- the tokenizer ------------------------------------------------------------------


def load_tokenizer(model, *, trust_remote_code: bool = False) -> TokenizerChoice:
    """The model's tokenizer as mlx_lm.lora loads it.

    `model` is a ModelInfo, a local folder or a Hugging Face repo id. A folder's
    tokenizer is loaded from it; a repo id's from the local Hugging Face cache, or
    fetched as its config.json is (its small tokenizer files only; not with
    HF_HUB_OFFLINE). With neither, lengths are approximated from characters, and the
    choice says why (`note`).
    """
    folder, source = _tokenizer_folder(model)
    if folder is None:
        return approximation(source)
    try:
        return TokenizerChoice(_load_wrapped(folder, trust_remote_code), source)
    except Exception as e:  # transformers raises many types
        reason = _not_text(folder) or " ".join(str(e).split())[:300] or type(e).__name__
        if source != "model folder":
            return approximation(f"the tokenizer from the Hugging Face Hub did not load: {reason}")
        raise MlxfitError(f"cannot load the tokenizer in {folder}: {reason}") from e


def _not_text(folder: Path) -> str | None:
    """Which of the folder's JSON files is not UTF-8 text, and why (transformers'
    error names no file); None when all are."""
    for path in sorted(folder.glob("*.json")):
        try:
            read_text(path)
        except MlxfitError as e:
            return str(e)
    return None


def _tokenizer_folder(model) -> tuple[Path | None, str]:
    """(folder, "model folder" | "hub cache" | "fetched from the Hugging Face Hub"), or (None, why not)."""
    path = getattr(model, "path", None)
    if path is None and isinstance(model, (str, Path)) and Path(model).expanduser().exists():
        path = Path(model).expanduser()
    if path is not None:
        path = Path(path)
        folder = path if path.is_dir() else path.parent
        if any((folder / name).exists() for name in _TOKENIZER_FILES):
            return folder, "model folder"
        return None, f"no tokenizer files in {folder}"
    repo_id = getattr(model, "id", model)
    if getattr(model, "source", "hub") == "size" or not isinstance(repo_id, str) or "/" not in repo_id:
        return None, f"{repo_id} names no tokenizer"
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency
        return None, "huggingface_hub is missing"
    for name in _TOKENIZER_FILES:
        cached = try_to_load_from_cache(repo_id, name)
        if isinstance(cached, str):
            return Path(cached).parent, "hub cache"
    from .resolve import fetch_tokenizer

    return fetch_tokenizer(repo_id)


def _load_wrapped(folder: Path, trust_remote_code: bool):
    """mlx_lm.utils.load's tokenizer step: load_tokenizer with the config's eos ids."""
    from .transformers_notices import quiet_transformers

    quiet_transformers()
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    eos_token_ids = None
    if (folder / "config.json").is_file():
        try:
            eos_token_ids = load_config(folder).get("eos_token_id")
        except Exception:  # a broken config.json is resolve.py's to report
            eos_token_ids = None
    return mlx_load_tokenizer(folder, {"trust_remote_code": trust_remote_code}, eos_token_ids=eos_token_ids)
