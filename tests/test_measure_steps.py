"""`--measure`: real steps in a child process, checked against mlx-lm's trainer."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxfit.cli.main import cli
from mlxfit.estimate.detailed import features
from mlxfit.measure.parent import MeasurementFailed, measure, request_for
from mlxfit.model.resolve import from_folder
from mlxfit.model.training import TrainingConfig
from conftest import LINUX_CPU
from tiny_configs import TINY

HERE = Path(__file__).parent
# float32 keeps CPU steps fast; one bf16 case below covers half precision.
SMALL = dict(TINY["llama"], hidden_size=128, intermediate_size=256, vocab_size=512, torch_dtype="float32")


def small_request(tmp_path, config=SMALL, length=64, max_steps=6, name="small", min_steps=None, synchronous=False, **training):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    training = TrainingConfig(**{"num_layers": -1, "batch_size": 2, "max_seq_length": length, **training})
    return request_for(from_folder(folder), training, max_steps=max_steps, min_steps=min_steps, synchronous=synchronous)


def exact_request(tmp_path, **kwargs):
    """A comparison that gives the same figure every run: evaluated synchronously
    (steps.evaluated_synchronously) for a fixed number of steps, on both sides."""
    return small_request(tmp_path, max_steps=EXACT_STEPS, min_steps=EXACT_STEPS, synchronous=True, **kwargs)


EXACT_STEPS = 4  # Adam's state exists from step 2; synchronously the peak holds from step 3


def trainer_peaks(request):
    out = subprocess.run(
        [sys.executable, str(HERE / "trainer_reference.py")],
        input=json.dumps(request), capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    line = next(l for l in out.splitlines() if l.startswith("PEAKS "))
    return [int(round(gb * 1e9)) for gb in json.loads(line[6:])]


# Checkpointing changes the step, not the adapter: it is checked with LoRA and full fine-tuning
# (DoRA and QLoRA with it took 2-3 minutes of the suite and are measured by the same child).
@pytest.mark.parametrize("method, grad_checkpoint", [
    ({"fine_tune_type": "lora"}, False), ({"fine_tune_type": "dora"}, False), ({"fine_tune_type": "full"}, False),
    ({"quantize": True}, False), ({"fine_tune_type": "lora"}, True), ({"fine_tune_type": "full"}, True),
], ids=["lora-no-gc", "dora-no-gc", "full-no-gc", "qlora-no-gc", "lora-gc", "full-gc"])
def test_agrees_with_mlx_lm_trainer(tmp_path, method, grad_checkpoint):
    # Both sides evaluate synchronously for the same number of steps. Run ahead of
    # the CPU worker (as mlx-lm runs), the peak of the same step moved 4% between
    # runs under load: it holds the outputs of up to ~100 kernels not yet run, as
    # many as thread scheduling lets through. Synchronously at most one task of 10
    # kernels is ahead: full fine-tuning repeats to the byte; the rest move by one
    # tensor at most, which 8 narrow blocks keep under 1% of the peak. Checkpointing
    # on a 4-bit base keeps so little that 8 blocks peak at 9.7 MB and moved 2.3%
    # (under extra load); 16 blocks peak at 13.6 MB and moved 0.3%. Checkpointed LoRA
    # at 8 blocks peaks at 14.1 MB, and the tensor ahead is an MLP output (2 x 127 x 256
    # float32, 260 KB): once it read +1.6% and its trainer -1.7% in the same run (3.3%
    # apart). At 32 blocks (37 MB) both sides moved 0.4 MB at most under load (1.0%).
    blocks = (16 if method.get("quantize") else 8 if method.get("fine_tune_type") == "full" else 32) if grad_checkpoint else 8
    config = dict(SMALL, hidden_size=128, intermediate_size=256, vocab_size=1024, num_hidden_layers=blocks)
    request = exact_request(tmp_path, config=config, length=128, grad_checkpoint=grad_checkpoint, **method)
    measured = measure(request, timeout=300)
    assert measured.steps == EXACT_STEPS
    reference = trainer_peaks(request)
    assert len(reference) == EXACT_STEPS
    assert measured.peak_with_load_bytes == pytest.approx(reference[-1], rel=0.03)


def test_half_precision_agrees_with_trainer(tmp_path):
    # Even synchronously the CPU worker may be up to ~19 ops behind the main thread
    # (the scheduler counts one task per 10 dispatches and waits only on counted
    # tasks), so a peak moves by up to a few of the largest buffers: ~45 KB here.
    # With 2 blocks that was 4% of a 1.1 MB peak and failed under load; 8 blocks
    # (and a 256-token vocabulary, smaller logits) put the same window at ~1.3%
    # of 3.5 MB (measured 3.45-3.50 MB over 8 runs on both sides).
    config = dict(SMALL, torch_dtype="bfloat16", hidden_size=64, intermediate_size=128, num_hidden_layers=8, vocab_size=256)
    request = exact_request(tmp_path, config=config, length=32)
    measured = measure(request, timeout=300)
    assert measured.peak_with_load_bytes == pytest.approx(trainer_peaks(request)[-1], rel=0.03)


def test_lora_dropout_keeps_each_adapters_dropped_input_and_mask(tmp_path):
    # mlx/nn/layers/dropout.py: an adapter with dropout keeps its dropped-out input (4 bytes
    # here) and its mask (1 byte), B x T x in each; at dropout 0 it returns its input untouched.
    # The estimate counts them (estimate/detailed.py dropout_bytes): 10.4 MB at 8 blocks, where
    # four synchronous runs measured 11.06-11.21 MB more than at dropout 0 (6-8% more than counted).
    config = dict(SMALL, hidden_size=128, intermediate_size=256, vocab_size=1024, num_hidden_layers=8)
    peaks = {}
    for p in (0.0, 0.1):
        request = exact_request(tmp_path, config=config, length=128, dropout=p, name=f"dropout-{p}")
        peaks[p] = measure(request, timeout=300).peak_with_load_bytes
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=128, dropout=0.1)
    counted = features(from_folder(tmp_path / "dropout-0.1"), training)["dropout_bytes"]
    assert counted > 0.2 * peaks[0.0]
    assert peaks[0.1] - peaks[0.0] == pytest.approx(counted, rel=0.15)


def test_measurement_fields_and_stable_peak(tmp_path):
    m = measure(small_request(tmp_path), timeout=300)
    assert m.backend == "cpu"
    assert 3 <= m.steps <= 6 and len(m.step_peaks_bytes) == m.steps
    assert m.step_peaks_bytes[-1] == m.peak_bytes  # the run stopped once the peak held
    assert m.peak_with_load_bytes >= m.peak_bytes > 0
    assert m.process_peak_bytes > m.peak_bytes  # Python and MLX themselves live in RSS too
    assert m.cache_bytes >= 0


def test_the_measuring_process_never_imports_transformers(tmp_path):
    """It synthesizes token ids, so it needs no tokenizer; mlx-lm's
    module-level transformers imports are served by a stub (mlxfit/measure/child.py)."""
    events = []
    measure(small_request(tmp_path, max_steps=3, fine_tune_type="dora", quantize=True), timeout=300, on_event=events.append)
    done = next(e for e in events if e["event"] == "done")
    assert done["transformers_imported"] is False


def test_optimizer_state_appears_at_the_first_update(tmp_path):
    """Step 1 creates Adam's moments: its peak is below step 2's for full fine-tuning."""
    m = measure(small_request(tmp_path, fine_tune_type="full"), timeout=300)
    assert m.step_peaks_bytes[1] > m.step_peaks_bytes[0]


def test_real_weights_are_loaded(tmp_path):
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlxfit.measure.build import random_model

    request = exact_request(tmp_path)
    folder = Path(request["folder"])
    model = random_model(SMALL)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    before = sorted(p.name for p in folder.iterdir())
    events = []
    m = measure(request, timeout=300, on_event=events.append)
    assert any(e.get("stage") == "loading weights" for e in events)
    built = measure(exact_request(tmp_path, name="config-only"), timeout=300)
    assert m.peak_bytes == pytest.approx(built.peak_bytes, rel=0.03)
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written into the model folder


def test_out_of_memory_is_reported_not_raised(tmp_path):
    # Logits alone for 4 x 2048 tokens x 32000 vocab in float32 take 1 GB; the
    # child's address space is capped below what the step needs. MLX's CPU
    # backend then dies with SIGSEGV inside the step (it does not raise).
    config = dict(SMALL, vocab_size=32000)
    request = small_request(tmp_path, config=config, length=2048, batch_size=4)
    with pytest.raises(MeasurementFailed) as failure:
        measure(request, timeout=300, memory_cap=1_500_000_000)
    message = str(failure.value)
    assert re.search(r"crashed \(SIG\w+\) at step 1 after [\d.]+ GB", message), message
    assert "most likely ran out of memory" in message


def test_timeout(tmp_path):
    # A run that cannot end in time, however fast the machine: a million steps.
    request = dict(small_request(tmp_path), min_steps=10**6, max_steps=10**6)
    with pytest.raises(MeasurementFailed, match="timed out after 0.5 s") as failure:
        measure(request, timeout=0.5)
    assert failure.value.kind == "timeout" and failure.value.unknown  # bench: "unknown", not "does not fit"


def test_bare_size_cannot_be_measured():
    from mlxfit.errors import MlxfitError
    from mlxfit.model.resolve import from_size

    with pytest.raises(MlxfitError, match="bare size with no architecture"):
        request_for(from_size("7B"), TrainingConfig())


@pytest.fixture
def small_measured_once(monkeypatch):
    """The probe commands below measure the same small run (lora, batch 2, length 64):
    measured once, each command still estimates, judges, stores and writes its answer
    (conftest.measured_once). test_measurement_fields_and_stable_peak measures it itself."""
    from mlxfit.measure import parent
    from conftest import folder_key, measured_once

    def key(request, **kwargs):
        return (json.dumps([{k: v for k, v in request.items() if k != "folder"}, kwargs], sort_keys=True),
                folder_key(request["folder"]))

    measured_once(monkeypatch, parent, "measure", key)


def test_cli_measure_json(tmp_path, platform, small_measured_once):
    platform(LINUX_CPU)
    folder = Path(small_request(tmp_path)["folder"])
    result = CliRunner().invoke(
        cli, ["probe", "--model", str(folder), "--measure", "--num-layers", "-1", "--batch-size", "2", "--max-seq-length", "64", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data["measured"]) >= {"peak_bytes", "peak_with_load_bytes", "cache_bytes", "process_peak_bytes", "steps", "seconds", "backend"}
    assert isinstance(data["predicted_peak_bytes"], int) and isinstance(data["error_pct"], float)
    assert "verdict" in data["measured_verdict"]


def test_cli_refuses_a_run_predicted_not_to_fit(tmp_path, platform):
    from mlxfit.machine import PlatformReadings

    platform(PlatformReadings(system_total=10 * 10**6, system_used=10**6, system_available=9 * 10**6,
                              backend="cpu", device_info={"architecture": "x86_64", "device_name": "tiny"}))
    folder = Path(small_request(tmp_path)["folder"])
    result = CliRunner().invoke(cli, ["probe", "--model", str(folder), "--num-layers", "-1", "--measure"])
    assert result.exit_code == 1
    assert "refusing to measure" in result.output and "--force" in result.output


def test_a_smaller_planned_budget_is_measured_whole_here_and_judged_against_the_plan(tmp_path, platform, small_measured_once):
    """The run fits this machine: measured whole (safely), judged against --memory's budget."""
    platform(LINUX_CPU)
    folder = Path(small_request(tmp_path)["folder"])
    result = CliRunner().invoke(cli, ["probe", "--model", str(folder), "--num-layers", "-1", "--batch-size", "2",
                                      "--max-seq-length", "64", "--measure", "--memory", "5MB", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["measured"]["method"] == "full"
    assert data["measured_verdict"]["fits"] is False


def test_the_measured_verdict_is_on_the_estimates_basis(tmp_path, platform, small_measured_once):
    """A run the estimate says fits, measured to fit by MLX's peak, is not called
    "does not fit" for the interpreter's own resident memory (which the estimate
    leaves out): both verdicts count MLX's memory, and the output says so."""
    platform(LINUX_CPU)
    folder = Path(small_request(tmp_path)["folder"])
    args = ["probe", "--model", str(folder), "--num-layers", "-1", "--batch-size", "2", "--max-seq-length", "64",
            "--measure", "--memory", "60MB"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    selected = next(e for e in data["estimates"] if e["selected"])
    assert selected["verdict"] == "fits"
    assert data["measured"]["process_peak_bytes"] > data["machine"]["usable_bytes"]  # the interpreter alone is over it
    judged = data["measured_verdict"]
    assert judged["basis"] == "peak_with_load" and judged["bytes"] == data["measured"]["peak_with_load_bytes"]
    assert judged["verdict"] == "fits"
    text = " ".join(CliRunner().invoke(cli, [*args, "-v"]).output.split())
    assert "Measured verdict: fits" in text and "without the process's resident baseline" in text
    first = " ".join(CliRunner().invoke(cli, args).output.split())
    assert re.search(r"measured verdict fits against the [\d.]+ MB budget", first), first


def wait_for_children(parent, timeout: float = 120) -> list:
    """The measuring process(es) a probe started, once it has started one."""
    import time

    import psutil

    deadline = time.time() + timeout
    children = []
    while time.time() < deadline and not children:
        children = psutil.Process(parent.pid).children()
        time.sleep(0.2)
    assert children, "the measuring process never started"
    return children


def test_ctrl_c_stops_the_child_cleanly(tmp_path, rates_in_cache):
    import signal
    import time

    import psutil

    rates_in_cache("float32")
    folder = Path(small_request(tmp_path, length=1024, batch_size=8)["folder"])
    # SIGINT as a terminal delivers it: a suite started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt.
    parent = subprocess.Popen(
        [sys.executable, "-m", "mlxfit", "probe", "--model", str(folder), "--num-layers", "-1", "--measure", "--steps", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    children = wait_for_children(parent)
    time.sleep(3)
    os.killpg(parent.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == 130  # 128 + SIGINT, as a shell reports Ctrl-C
    assert "interrupted" in err and "Traceback" not in err
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


MEASURING_COMMANDS = {
    "probe": ["probe", "--num-layers", "-1", "--measure", "--steps", "50"],
    # mlx-lm-lora's trainer: it ran without a watch, so a kill left its child running.
    "probe-dpo": ["probe", "--train-mode", "dpo", "--max-seq-length", "1024", "--batch-size", "4", "--measure"],
    "bench": ["bench", "--num-layers", "-1", "--batch-size", "8", "--max-seq-length", "1024", "--force"],
}


@pytest.mark.parametrize("command, signame, sigint_ignored", [
    ("probe", "SIGTERM", False),  # kill, timeout
    ("probe", "SIGHUP", False),  # the terminal closed
    ("probe", "SIGINT", True),  # Ctrl-C to a probe started from a script, with SIGINT inherited ignored
    ("probe-dpo", "SIGTERM", False),
    ("bench", "SIGTERM", False),  # bench exited 130 for every signal
], ids=["sigterm", "sighup", "sigint-inherited-ignored", "dpo-sigterm", "bench-sigterm"])
def test_every_signal_that_ends_a_measuring_command_stops_its_child_and_removes_its_folder(
        tmp_path, command, signame, sigint_ignored, rates_in_cache):
    import signal
    import time

    import psutil

    rates_in_cache("float32")
    sig = getattr(signal, signame)
    folder = Path(small_request(tmp_path, length=1024, batch_size=8)["folder"])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    handling = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
    name, *flags = MEASURING_COMMANDS[command]
    parent = subprocess.Popen(
        [sys.executable, "-m", "mlxfit", name, "--model", str(folder), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "TMPDIR": str(scratch)},
        # SIGHUP as a terminal's command has it, whatever the suite inherited (under nohup it is
        # ignored, and the command rightly keeps measuring).
        preexec_fn=lambda: (signal.signal(signal.SIGINT, handling), signal.signal(signal.SIGHUP, signal.SIG_DFL)),
    )
    children = wait_for_children(parent)
    assert list(scratch.glob("mlxfit-*")), "the measuring process's folder is not under TMPDIR"
    time.sleep(3)
    parent.send_signal(sig)
    try:
        out, err = parent.communicate(timeout=60)
    finally:  # a test that fails leaves nothing running
        for p in [*children, psutil.Process(parent.pid)] if parent.poll() is None else children:
            if p.is_running():
                p.kill()
    assert parent.returncode == 128 + sig, (out[-1500:], err[-1500:])  # as a shell reports a command ended by it
    assert "interrupted" in (out + err).lower() and "Traceback" not in err
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)
    assert list(scratch.glob("mlxfit-*")) == []  # (MLX's own kernel cache may stay there)


@pytest.mark.parametrize("command", ["probe", "probe-dpo", "bench"])
def test_a_child_whose_parent_is_killed_ends_and_removes_its_folder(tmp_path, command, rates_in_cache):
    """SIGKILL reaches no handler of the parent: the child sees its stdin end instead."""
    import signal
    import time

    import psutil

    rates_in_cache("float32")
    folder = Path(small_request(tmp_path, length=1024, batch_size=8)["folder"])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    name, *flags = MEASURING_COMMANDS[command]
    parent = subprocess.Popen(
        [sys.executable, "-m", "mlxfit", name, "--model", str(folder), *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    children = wait_for_children(parent)
    try:
        assert list(scratch.glob("mlxfit-*")), "the measuring process's folder is not under TMPDIR"
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 60  # a bound for a loaded machine, not a timing
        alive = children
        while time.monotonic() < deadline and (alive or list(scratch.glob("mlxfit-*"))):
            time.sleep(0.2)
            alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], [c.cmdline() for c in alive]
        assert list(scratch.glob("mlxfit-*")) == []
    finally:  # a test that fails leaves nothing running
        for c in children:
            if c.is_running():
                c.kill()


@pytest.mark.parametrize("optimizer", ["adam", "adafactor"])
def test_the_update_phase_of_a_wide_full_fine_tune(tmp_path, optimizer):
    """Short sequences, many trainable weights: the peak is the optimizer update's,
    and the estimate (resident weights and state + gradients in flight) holds it."""
    from mlxfit.estimate.detailed import estimate

    config = dict(SMALL, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, vocab_size=256)
    request = small_request(tmp_path, config=config, length=16, fine_tune_type="full", optimizer=optimizer)
    folder = tmp_path / "small"
    predicted = estimate(from_folder(folder), TrainingConfig(
        fine_tune_type="full", num_layers=-1, batch_size=2, max_seq_length=16, optimizer=optimizer), "cpu")
    measured = measure(request, timeout=300)
    assert predicted.features["phase"] == "update"
    assert predicted.peak_bytes == pytest.approx(measured.peak_with_load_bytes, rel=0.10)


# --- quantized bases, as mlx_lm.convert -q writes them and load_model loads them


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tokenizer_folder):
    """A tiny tied Qwen3 with random float32 weights, converted by mlx_lm.convert -q
    (4 bits, group 64: float32 scales and biases, as the config's dtype)."""
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.convert import convert

    from mlxfit.measure.build import random_model

    root = tmp_path_factory.mktemp("convert")
    config = dict(TINY["qwen3"], hidden_size=128, intermediate_size=256, num_hidden_layers=4, vocab_size=1024,
                  tie_word_embeddings=True, torch_dtype="float32")
    source = root / "float"
    shutil.copytree(tokenizer_folder, source)
    (source / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(source / "model.safetensors"), dict(tree_flatten(random_model(config).parameters())))
    convert(str(source), mlx_path=str(root / "q4"), quantize=True)
    only_config = root / "q4-config-only"
    only_config.mkdir()
    shutil.copy(root / "q4" / "config.json", only_config / "config.json")
    return {"float": source, "q4": root / "q4", "config_only": only_config, "config": config}


def _arrays(model):
    from mlx.utils import tree_flatten

    return {name: (tuple(p.shape), str(p.dtype)) for name, p in tree_flatten(model.parameters())}


def test_a_quantized_config_builds_what_load_model_loads(converted):
    """A config.json with convert's `quantization` block and no
    weights was built with float weights (133.6 MB measured against mlx-lm's 106.3 MB)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    from mlxfit.measure.build import quantize, random_model

    loaded, config = load_model(converted["q4"], lazy=True)
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 64
    mx.eval(loaded.parameters())
    mx.clear_cache()  # a buffer reused from the cache may be a page larger than asked, and counts so
    mx.reset_peak_memory()
    before = mx.get_active_memory()
    built = random_model(json.loads((converted["config_only"] / "config.json").read_text()))
    mx.eval(built.parameters())
    assert _arrays(built) == _arrays(loaded)
    held = sum(p.nbytes for _, p in tree_flatten(built.parameters()))
    # The float weights are never computed: building holds what loading holds, give
    # or take the pages of buffers reused from the allocator cache (4.9 KB once in
    # the whole suite); float32 weights would be 4x as much.
    assert mx.get_peak_memory() - before <= held * 1.25
    # --method qlora on the float config quantizes to the same arrays.
    requantized = quantize(random_model(converted["config"]), converted["config"], TrainingConfig(quantize=True), random=True)
    assert _arrays(requantized) == _arrays(loaded)


def test_a_quantized_config_measures_as_mlx_lm_trains_the_converted_model(tmp_path, converted):
    """The peak of a config-only 4-bit model against mlx-lm's trainer on the
    converted checkpoint, loaded by mlx-lm's load_model (tests/trainer_reference.py)."""
    training = TrainingConfig(num_layers=-1, batch_size=2, max_seq_length=128, quantize=True)
    request = request_for(from_folder(converted["config_only"]), training, max_steps=EXACT_STEPS,
                          min_steps=EXACT_STEPS, synchronous=True)
    measured = measure(request, timeout=300)
    reference = trainer_peaks(dict(request, folder=str(converted["q4"])))
    assert measured.peak_with_load_bytes == pytest.approx(reference[-1], rel=0.03)


# --- the mlx and mlx-lm facts the comparisons above rest on


def test_the_trainer_clears_the_allocator_cache_after_every_step():
    from mlx_lm.tuner.trainer import TrainingArgs

    from mlxfit.measure.steps import CLEAR_CACHE_THRESHOLD

    assert TrainingArgs().clear_cache_threshold == CLEAR_CACHE_THRESHOLD == 0


def test_the_cpu_backend_queues_kernels_in_tasks_of_ten():
    """steps.evaluated_synchronously: with a memory limit of 0 the main thread waits
    for the worker at every task, so at most one task of kernels runs ahead."""
    import mlx.core as mx

    header = Path(mx.__file__).parent / "include" / "mlx" / "backend" / "cpu" / "encoder.h"
    if not header.exists():
        pytest.skip("this mlx install ships no headers")
    assert "constexpr int DISPATCHES_PER_TASK = 10;" in header.read_text()


def test_the_child_imports_the_mlxfit_that_spawned_it(tmp_path):
    """It runs in a temporary directory: another mlxfit on the path (an editable
    install of another checkout) must not be the one that measures."""
    import mlxfit
    from mlxfit.measure.parent import child_environment

    env = dict(child_environment())
    out = subprocess.run([sys.executable, "-c", "import mlxfit; print(mlxfit.__file__)"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out).resolve() == Path(mlxfit.__file__).resolve()


def test_a_child_stopped_from_outside_is_not_called_out_of_memory():
    import signal as sig

    from mlxfit.measure.parent import _failure_message

    last = {"stage": "training steps", "step": 0, "peak_bytes": 0}
    stopped = _failure_message(-sig.SIGTERM, None, last, 270 * 10**6, [])
    assert stopped.startswith("the measuring process was stopped (SIGTERM) at step 1") and "memory" not in stopped
    assert "most likely ran out of memory" in _failure_message(-sig.SIGSEGV, None, last, 270 * 10**6, [])
    assert _failure_message(-sig.SIGKILL, None, last, 270 * 10**6, []).startswith("ran out of memory at step 1")


def test_a_cache_that_cannot_be_written_loses_no_measurement(tmp_path, monkeypatch, platform, small_measured_once):
    platform(LINUX_CPU)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(blocker / "cache"))  # under a file: no folder can be made
    folder = Path(small_request(tmp_path)["folder"])
    args = ["probe", "--model", str(folder), "--num-layers", "-1", "--batch-size", "2", "--max-seq-length", "64", "--measure"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["measured"]["peak_with_load_bytes"] > 0
    assert data["note"].startswith("not stored for calibration: cannot write")
    text = " ".join(CliRunner().invoke(cli, [*args, "-v"]).stdout.split())
    assert "Measured verdict:" in text and "the measurement was not stored for calibration" in text


def test_a_full_cache_disk_leaves_no_temporary_file(tmp_path, monkeypatch, platform, full_disk, small_measured_once):
    platform(LINUX_CPU)
    cache = tmp_path / "full-cache"
    monkeypatch.setenv("MLXFIT_CACHE_DIR", str(cache))
    full_disk(cache)
    folder = Path(small_request(tmp_path)["folder"])
    args = ["probe", "--model", str(folder), "--num-layers", "-1", "--batch-size", "2", "--max-seq-length", "64", "--measure"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    note = json.loads(result.stdout)["note"]
    stored = re.fullmatch(r"not stored for calibration: cannot write (\S+) \(No space left on device\)", note)
    assert stored and Path(stored[1]).parent == cache / "measurements", note  # the file, not its temporary
    assert [p for p in cache.rglob("*") if p.is_file()] == []  # no .<hash>.json.*.tmp, nor any other
