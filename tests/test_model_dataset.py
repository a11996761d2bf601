"""mlxfit measures data as mlx-lm tokenizes and batches it, streaming the file."""

import json
import random
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlxfit.errors import BadInput, MlxfitError
from mlxfit.model.dataset import (
    FEATURES,
    DataStats,
    TokenizerChoice,
    approximation,
    detect_format,
    load_tokenizer,
    measure,
    padded_length,
    smallest_max_length,
    training_file,
    worst_batch_tokens,
)
from mlxfit.model.resolve import ModelInfo

from conftest import WORDS  # noqa: E402  (the tokenizer_folder fixture lives in conftest)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_folder):
    return load_tokenizer(tokenizer_folder)


def sentence(rng, lo=1, hi=60):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def make_records(fmt, n, seed=0, keys=FEATURES):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if fmt == "text":
            text = sentence(rng, 0 if i == 3 else 1)
            if i == 5:
                text += " </s>"  # already ends with eos: mlx-lm adds none
            out.append({keys["text_feature"]: text or "the"})
        elif fmt == "completions":
            out.append({keys["prompt_feature"]: sentence(rng), keys["completion_feature"]: sentence(rng)})
        else:
            messages = [{"role": "user", "content": sentence(rng)}, {"role": "assistant", "content": sentence(rng)}]
            record = {keys["chat_feature"]: messages}
            if i % 4 == 1:  # a second field: CacheDataset then sorts this line later
                record["tools"] = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
            out.append(record)
    return out


def write_jsonl(path, records, extra_lines=()):
    lines = [json.dumps(r) for r in records] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def mlx_lm_view(folder, tokenizer_path, batch_size, max_seq_length, **config):
    """Lengths and batch widths from mlx-lm itself: load_dataset, CacheDataset, iterate_batches."""
    from mlx_lm.tuner.datasets import CacheDataset, load_dataset
    from mlx_lm.tuner.trainer import iterate_batches
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    tok = mlx_load_tokenizer(Path(tokenizer_path))
    args = SimpleNamespace(data=str(folder), train=True, test=False, mask_prompt=False, **config)
    train, _, _ = load_dataset(args, tok)
    lengths = [len(train.process(train[i])[0]) for i in range(len(train))]
    widths = [batch.shape[1] for batch, _ in iterate_batches(CacheDataset(train), batch_size, max_seq_length)]
    return lengths, max(widths)


@pytest.mark.parametrize(
    "fmt, batch_size, max_seq_length, features",
    [
        ("text", 4, 2048, {}),
        ("text", 3, 40, {"text_feature": "body"}),
        ("completions", 4, 2048, {}),
        ("completions", 5, 64, {"prompt_feature": "input", "completion_feature": "output"}),
        ("chat", 4, 2048, {}),
        ("chat", 3, 100, {}),
        ("chat", 2, 1000, {"chat_feature": "conversation"}),
    ],
)
def test_lengths_and_worst_batch_match_mlx_lm(tmp_path, tokenizer_folder, tokenizer, fmt, batch_size, max_seq_length, features):
    keys = {**FEATURES, **features}
    write_jsonl(tmp_path / "train.jsonl", make_records(fmt, 23, seed=len(fmt) + batch_size, keys=keys))
    stats = measure(tmp_path, tokenizer, batch_size=batch_size, max_seq_length=max_seq_length, features=features)
    lengths, widest = mlx_lm_view(tmp_path, tokenizer_folder, batch_size, max_seq_length, **features)
    assert list(stats.lengths) == lengths
    assert stats.worst_batch_tokens == widest
    assert stats.format == fmt and stats.examples == 23
    assert stats.max == max(lengths)
    assert stats.truncated == sum(n > max_seq_length for n in lengths)
    assert stats.tokens_lost == sum(n - max_seq_length for n in lengths if n > max_seq_length)
    assert stats.tokenizer_source == "model folder" and not stats.approximate


def test_format_choice_matches_create_dataset(tokenizer):
    from mlx_lm.tuner.datasets import ChatDataset, CompletionsDataset, TextDataset, create_dataset

    classes = {CompletionsDataset: "completions", ChatDataset: "chat", TextDataset: "text"}
    samples = [
        {"text": "a"},
        {"messages": []},
        {"prompt": "a", "completion": "b"},
        {"prompt": "a", "completion": "b", "messages": [], "text": "c"},
        {"messages": [], "text": "c"},
        {"prompt": "a", "text": "c"},
    ]
    for sample in samples:
        made = create_dataset([sample], tokenizer.tokenizer, SimpleNamespace())
        assert detect_format(sample) == classes[type(made)], sample
    assert detect_format({"other": 1}) is None


def test_worst_batch_helper_matches_iterate_batches():
    from mlx_lm.tuner.datasets import CacheDataset
    from mlx_lm.tuner.trainer import iterate_batches

    class Raw:  # what CacheDataset wraps: raw records with a process method
        def __init__(self, records):
            self.records = records

        def __getitem__(self, i):
            return self.records[i]

        def __len__(self):
            return len(self.records)

        def process(self, d):
            return ([1] * d["n"], 0)

    rng = random.Random(1)
    for trial in range(30):
        n = rng.randint(4, 40)
        lengths = [rng.randint(1, 300) for _ in range(n)]
        fields = [rng.randint(1, 3) for _ in range(n)]
        bs, msl = rng.randint(1, 4), rng.choice([64, 129, 2048])
        tokenized = [([1] * k, 0) for k in lengths]
        widest = max(b.shape[1] for b, _ in iterate_batches(tokenized, bs, msl))
        assert worst_batch_tokens(lengths, bs, msl) == widest
        records = [dict({"n": k}, **{f"x{j}": 0 for j in range(f - 1)}) for k, f in zip(lengths, fields)]
        widest = max(b.shape[1] for b, _ in iterate_batches(CacheDataset(Raw(records)), bs, msl))
        assert worst_batch_tokens(lengths, bs, msl, order=fields) == widest


def test_cache_dataset_batches_in_file_order_not_by_length():
    # mlx-lm 0.32 sorts a CacheDataset by fields per line (mlx-lm issue #596): with one
    # field per line the batches are file order, and the dropped remainder is the last lines.
    lengths = [10, 500, 20, 30, 40]  # the longest is early; batch 2 drops one example
    assert worst_batch_tokens(lengths, 2, 2048) == padded_length(40, 2048)  # by length: 500 dropped
    assert worst_batch_tokens(lengths, 2, 2048, order=[1] * 5) == padded_length(500, 2048)


def test_padded_length():
    assert padded_length(1, 2048) == 33
    assert padded_length(32, 2048) == 33
    assert padded_length(33, 2048) == 65
    assert padded_length(2048, 2048) == 2048
    assert padded_length(5000, 2048) == 2048


def test_smallest_max_length():
    lengths = list(range(1, 101))
    assert smallest_max_length(lengths, 0.95) == 95
    assert smallest_max_length(lengths, 1.0) == 100
    assert smallest_max_length([7], 0.5) == 7
    assert smallest_max_length([5, 1, 3, 2, 4] * 4, 0.8) == 4
    with pytest.raises(BadInput):
        smallest_max_length(lengths, 0)


def test_too_few_examples_for_a_batch(tmp_path, tokenizer):
    write_jsonl(tmp_path / "d.jsonl", make_records("text", 3))
    with pytest.raises(BadInput, match="at least batch_size=4 examples but only has 3"):
        measure(tmp_path / "d.jsonl", tokenizer, batch_size=4)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "line 3 is not valid JSON"),
        ("", "line 3 is empty"),
        ("[1, 2]", "line 3 is a JSON list, not an object"),
        ('{"text": "a dog"}', "line 3 is text data but the file is chat data (from line 1)"),
        ('{"prompt": "a"}', "line 3 lacks 'messages', which chat data needs"),
        ('{"messages": "the dog"}', "line 3 cannot be tokenized as mlx-lm does"),
    ],
)
def test_bad_lines_are_named(tmp_path, tokenizer, line, message):
    records = make_records("chat", 6)
    lines = [json.dumps(r) for r in records]
    lines.insert(2, line)
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MlxfitError) as e:
        measure(path, tokenizer)
    assert str(path) in str(e.value) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_unknown_format_and_trailing_blank_line(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [{"question": "a", "answer": "b"}])
    with pytest.raises(BadInput, match="line 1 has none of the fields mlx-lm reads"):
        measure(path, tokenizer)
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in make_records("text", 5)) + "\n\n")
    with pytest.raises(BadInput, match="line 6 is empty"):
        measure(path, tokenizer)


def test_skip_bad_lines(tmp_path, tokenizer):
    records = make_records("completions", 8)
    lines = ["oops"] + [json.dumps(r) for r in records[:4]] + ['{"text": "x"}', "", "[]"] + [
        json.dumps(r) for r in records[4:]
    ] + ['{"prompt": 1}'] * 4
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(lines) + "\n")
    stats = measure(path, tokenizer, skip_bad_lines=True)
    assert stats.examples == 8
    assert stats.skipped_lines == 8
    assert [n for n, _ in stats.bad_lines] == [1, 6, 7, 8, 13]
    assert stats.to_dict()["bad_lines"][0] == {"line": 1, "problem": "is not valid JSON: Expecting value at column 1"}
    clean = write_jsonl(tmp_path / "clean.jsonl", records)
    assert list(measure(clean, tokenizer).lengths) == list(stats.lengths)


def test_all_lines_bad(tmp_path, tokenizer):
    path = tmp_path / "t.jsonl"
    path.write_text("x\ny\n")
    with pytest.raises(BadInput, match="no usable examples: all 2 lines are bad"):
        measure(path, tokenizer, skip_bad_lines=True)


def test_missing_and_empty_inputs(tmp_path, tokenizer):
    with pytest.raises(BadInput, match="has no train.jsonl"):
        measure(tmp_path, tokenizer)
    (tmp_path / "train.jsonl").write_text("")
    with pytest.raises(BadInput, match="is empty"):
        measure(tmp_path, tokenizer)
    with pytest.raises(BadInput, match="not a folder with train.jsonl nor a .jsonl file"):
        training_file(tmp_path / "mlx-community/WikiSQL")


def test_mask_prompt_with_text_is_refused_as_mlx_lm_does(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", make_records("text", 4))
    with pytest.raises(BadInput, match="Prompt masking not supported for text dataset"):
        measure(path, tokenizer, mask_prompt=True)
    chat = write_jsonl(tmp_path / "c.jsonl", make_records("chat", 4))
    assert measure(chat, tokenizer, mask_prompt=True).examples == 4


def test_to_dict_and_percentiles(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", make_records("text", 40))
    stats = measure(path, tokenizer, batch_size=4, max_seq_length=30)
    out = stats.to_dict()
    for key in ("examples", "p50", "p90", "p99", "max", "truncated", "worst_batch_tokens"):
        assert out[key] == getattr(stats, key)
    ordered = sorted(stats.lengths)
    assert stats.p50 == ordered[19] and stats.p90 == ordered[35] and stats.p99 == ordered[39]
    assert json.loads(json.dumps(out)) == out
    assert stats.lengths.typecode == "I"


def test_approximation_without_tokenizer(tmp_path):
    records = [{"text": "x" * 40}] * 3 + [{"text": "y" * 7}]
    path = write_jsonl(tmp_path / "t.jsonl", records)
    stats = measure(path, approximation(), batch_size=2)
    assert list(stats.lengths) == [11, 11, 11, 3]
    assert stats.approximate and stats.tokenizer_source == "approximation: 4 chars per token"
    chat = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "abcd" * 3}]}])
    assert list(measure(chat, approximation(), batch_size=1).lengths) == [3 + 4]
    bad = write_jsonl(tmp_path / "b.jsonl", [{"messages": "hello"}])
    with pytest.raises(BadInput, match="line 1 has a 'messages' that is not a list of messages"):
        measure(bad, approximation(), batch_size=1)


def test_load_tokenizer_sources(tmp_path, tokenizer_folder, monkeypatch):
    choice = load_tokenizer(tokenizer_folder)
    assert choice.source == "model folder" and not choice.approximate
    info = ModelInfo(id="x", source="local", params=1, bits=16, dtype="bfloat16", path=tokenizer_folder)
    assert load_tokenizer(info).source == "model folder"
    # a folder with only config.json, a bare size, and a repo id not in the (empty) cache
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert load_tokenizer(tmp_path / "m").approximate
    assert load_tokenizer(ModelInfo(id="7B", source="size", params=7, bits=16, dtype="bfloat16")).approximate
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = load_tokenizer("nobody/no-such-model")
    assert missing.approximate and "not in the Hugging Face cache" in missing.note


def test_load_tokenizer_from_hub_cache(tmp_path, tokenizer_folder, monkeypatch):
    """A repo id resolves to its snapshot folder in the local Hugging Face cache."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for item in tokenizer_folder.iterdir():
        (snapshot / item.name).write_bytes(item.read_bytes())
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    choice = load_tokenizer("someone/tiny")
    assert choice.source == "hub cache" and not choice.approximate


def test_broken_tokenizer_in_a_folder_is_an_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(MlxfitError, match="cannot load the tokenizer in"):
        load_tokenizer(tmp_path)


def test_streams_line_by_line_with_progress(tmp_path):
    """A file of a few MB is read a line at a time: Python's peak allocation stays
    far below the file's size (benchmarks/data_streaming.py does 200 MB)."""
    rng = random.Random(2)
    path = tmp_path / "big.jsonl"
    with open(path, "w") as out:
        for _ in range(20_000):
            out.write(json.dumps({"text": sentence(rng, 20, 80) * 2}) + "\n")
    size = path.stat().st_size
    assert size > 4_000_000
    calls = []
    tracemalloc.start()
    try:
        stats = measure(path, approximation(), on_progress=lambda *a: calls.append(a))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert stats.examples == 20_000
    assert peak < size / 8, (peak, size)
    assert calls[-1] == (20_000, size, size)
    assert len(calls) == 20_000 // 100 + 1
    assert all(a[1] <= b[1] for a, b in zip(calls, calls[1:]))


def test_dataclass_is_compact(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "t.jsonl", make_records("text", 8))
    stats = measure(path, tokenizer)
    assert isinstance(stats, DataStats)
    assert not any(isinstance(v, str) and len(v) > 200 for v in vars(stats).values())
    assert isinstance(tokenizer, TokenizerChoice)


def test_chat_data_needs_a_chat_template(tmp_path, tokenizer_folder):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tokenizer_folder)
    plain.chat_template = None
    choice = TokenizerChoice(plain, "model folder")
    path = write_jsonl(tmp_path / "c.jsonl", make_records("chat", 4))
    with pytest.raises(BadInput, match="has no chat template, which mlx-lm needs for chat data"):
        measure(path, choice)
    text = write_jsonl(tmp_path / "t.jsonl", make_records("text", 4))
    assert measure(text, choice).examples == 4


def test_the_character_stand_in_counts_as_the_approximation_does(tmp_path):
    """Preference data without a tokenizer goes through mlx-lm-lora's dataset classes with
    CharacterTokenizer: a conversation counts as the approximation of mlx-lm's chat data."""
    from mlxfit.model.dataset import CharacterTokenizer

    messages = [{"role": "user", "content": "abcd" * 5 + "e"}, {"role": "assistant", "content": "xy" * 7}]
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": messages}])
    expected = list(measure(path, approximation(), batch_size=1).lengths)[0]
    tok = CharacterTokenizer()
    assert len(tok.apply_chat_template(messages)) == expected == (6 + 4) + (4 + 4)
    assert len(tok.encode(tok.apply_chat_template(messages, tokenize=False))) == expected
    assert len(tok.apply_chat_template(messages[:1], add_generation_prompt=True)) == 6 + 4 + 4
    assert len(tok.encode("abcde")) == 2
