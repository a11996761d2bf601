import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from mlxfit.machine import PlatformReadings  # noqa: E402

GB = 10**9

# Recorded readings: an M3 Max MacBook Pro (36 GB), a Linux box with one
# 24 GB NVIDIA GPU, and this CPU-only Linux box.
MAC_36GB = PlatformReadings(
    system_total=38654705664,
    system_used=14 * GB,
    system_available=38654705664 - 14 * GB,
    backend="metal",
    device_info={
        "architecture": "applegpu_g15s",
        "device_name": "Apple M3 Max",
        "memory_size": 38654705664,
        "max_buffer_size": 28991029248,
        "max_recommended_working_set_size": 28991029248,
        "resource_limit": 499000,
    },
)
CUDA_24GB = PlatformReadings(
    system_total=128 * GB,
    system_used=10 * GB,
    system_available=118 * GB,
    backend="cuda",
    device_info={
        "device_name": "NVIDIA GeForce RTX 4090",
        "architecture": "sm_89",
        "total_memory": 25757220864,
        "free_memory": 25255673856,
    },
)
LINUX_CPU = PlatformReadings(
    system_total=25275990016,
    system_used=1 * GB,
    system_available=25275990016 - 1 * GB,
    backend="cpu",
    device_info={"architecture": "x86_64", "device_name": "AMD EPYC"},
)


@pytest.fixture(autouse=True)
def isolated_user_dirs(tmp_path, monkeypatch):
    """No test reads or writes the user's caches or reaches the network."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(tmp_path / "mlxfit-cache"))
    monkeypatch.delenv("MLXFIT_DEBUG", raising=False)
    # The preference estimate's miniatures are child processes of a few seconds:
    # off unless a test turns them on (tests/test_measure_miniature.py).
    monkeypatch.setenv("MLXFIT_MINIATURES", "0")


_MEASURED_ONCE = {}


@pytest.fixture(autouse=True)
def machine_rates_measured_once(monkeypatch):
    """This machine's rates (measure/rate.py, and GRPO's decoding loop, measure/decode_rate.py)
    measured once a session. Each test has a cache of its own (isolated_user_dirs), so each
    probe of a test measured them again, 1-2 s a dtype: the product measures them once per
    machine and reads its cache after, as every test but a test's first probe did. The
    cache itself is still read and written as before; only the timing runs are shared.
    A test that replaces one of the timings (or the measurement) gets its own."""
    from mlxfit.measure import decode_rate, rate

    real_rates, real_decode = rate.measure_rates, decode_rate.measured_decode_op
    step_seconds = decode_rate.decode_step_seconds
    # Every function of measure/rate.py as it is before the test: a test that replaces any of the
    # timings measure_rates calls gets a measurement made with its replacement.
    parts = {name: value for name, value in vars(rate).items() if callable(value) and name != "measure_rates"}

    def measure_rates(dtype="bfloat16", bits=None, group_size=64):
        if any(getattr(rate, name) is not value for name, value in parts.items()):
            return real_rates(dtype, bits, group_size)
        key = ("rates", dtype, bits, group_size)
        if key not in _MEASURED_ONCE:
            _MEASURED_ONCE[key] = real_rates(dtype, bits, group_size)
        return _MEASURED_ONCE[key]

    def measured_decode_op(dtype, rates):
        if decode_rate.decode_step_seconds is not step_seconds:
            return real_decode(dtype, rates)
        key = ("decoding loop", dtype, rates)
        if key not in _MEASURED_ONCE:
            _MEASURED_ONCE[key] = real_decode(dtype, rates)
        return _MEASURED_ONCE[key]

    monkeypatch.setattr(rate, "measure_rates", measure_rates)
    monkeypatch.setattr(decode_rate, "measured_decode_op", measured_decode_op)


@pytest.fixture
def rates_in_cache():
    """`rates_in_cache(dtype, ...)`: this machine's rates for each dtype written in the test's
    cache, as a first probe writes them, from the session's one timing. For a test that runs
    mlxfit in a process of its own, about something else than the rates (a signal, a
    progress line): that process reads them there instead of timing them again."""
    from mlxfit.measure import rate

    def write(*dtypes):
        for dtype in dtypes:
            rate.machine_rates(dtype)

    return write


_SHARED_MEASUREMENTS = {}


def measured_once(monkeypatch, module, name, key):
    """`module.name`, a real measurement that takes `on_event=`, made once a session for each
    `key(*args, **kwargs)`: a test that repeats a measurement another test (or another
    command of its own) made with the same inputs gets that one's result, a copy, and
    its events replayed in order, instead of a child process doing the same steps again.
    What calls the measurement (the command, its verdict, its output) runs every time;
    a measurement that fails is not kept."""
    import copy

    real = getattr(module, name)

    def once(*args, on_event=lambda e: None, **kwargs):
        k = (module.__name__, name, key(*args, **kwargs))
        if k not in _SHARED_MEASUREMENTS:
            events = []

            def record(event):
                events.append(copy.deepcopy(event))
                on_event(event)

            result = real(*args, on_event=record, **kwargs)
            _SHARED_MEASUREMENTS[k] = (copy.deepcopy(result), events)
            return result
        result, events = _SHARED_MEASUREMENTS[k]
        for event in events:
            on_event(copy.deepcopy(event))
        return copy.deepcopy(result)

    monkeypatch.setattr(module, name, once)


def folder_key(folder) -> tuple:
    """What a model folder holds, by name and size (not where it is: each test has its own)."""
    if not folder:
        return ()
    return tuple(sorted((p.name, p.stat().st_size) for p in Path(folder).iterdir()))


@pytest.fixture
def platform(monkeypatch):
    """Replace the real platform reads with a recorded machine."""

    def use(readings):
        monkeypatch.setattr("mlxfit.machine.read_platform", lambda: readings)
        return readings

    return use


@pytest.fixture
def model_folder(tmp_path):
    """Write a config.json folder and return its path."""

    def make(config, name="model"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    return make


WORDS = ("the quick brown fox jumps over the lazy dog ; a model learns from data : memory fits "
         "or it does not , user assistant system tools { } [ ] name weather city").split()
CHAT_TEMPLATE = (
    "{% if tools %}<s>tools: {{ tools | tojson }}</s>\n{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


@pytest.fixture(scope="session")
def tokenizer_folder(tmp_path_factory):
    """A real, tiny BPE tokenizer with a chat template, saved as a model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [" ".join(WORDS), "the lazy dog learns ; memory fits : data", "a quick model over the data"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("tiny_model")
    fast.save_pretrained(folder)
    return folder


@pytest.fixture
def full_disk(monkeypatch):
    """`full_disk(folder)`: the disk under `folder` fills up. A new file there (every
    temporary file is made with os.open, O_CREAT | O_EXCL) is still created, as a
    free inode allows, but the kernel fails every byte written to it with ENOSPC:
    its descriptor is /dev/full's."""
    import os

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full (Linux)")
    real_open, folders = os.open, []

    def opening(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT and flags & os.O_EXCL and any(str(path).startswith(str(f)) for f in folders):
            full = real_open("/dev/full", os.O_WRONLY)
            os.dup2(full, fd)
            os.close(full)
        return fd

    monkeypatch.setattr(os, "open", opening)
    return folders.append


def graph_peak(fn, *args):
    """The graph's own peak: mx.eval made to wait for the CPU worker after each task (a
    memory limit of 0, mlxfit/measure/steps.py evaluated_synchronously), so the outputs that the
    main thread allocates ahead of the worker (up to ten tasks of them, more the slower the
    worker: benchmarks/trace_peak.py) do not depend on the machine's load."""
    import mlx.core as mx

    mx.eval(*args)
    mx.synchronize()
    mx.clear_cache()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    limit = mx.set_memory_limit(0)
    try:
        mx.eval(fn(*args))
    finally:
        mx.set_memory_limit(limit)
    return mx.get_peak_memory() - base


@pytest.fixture
def model_with_tokenizer(tmp_path, tokenizer_folder):
    """A tiny float32 llama folder with the real tiny tokenizer beside its config."""
    import shutil

    from tiny_configs import TINY

    folder = tmp_path / "model"
    shutil.copytree(tokenizer_folder, folder)
    (folder / "config.json").write_text(json.dumps(dict(TINY["llama"], vocab_size=256, torch_dtype="float32")))
    return folder
