"""Draw a set of mlx-lm-lora runs for benchmarks/preference.py --grid, after the estimate is frozen.

    python benchmarks/draw_preference_set.py SEED N > set.json
    python benchmarks/preference.py --grid set.json --json rows.jsonl --out set.md
    python benchmarks/draw_preference_set.py SEED N '{"fine_tune_type": "full", "load_in_4bits": true}' > set.json

A third argument fixes every row's flags to these (one kind of run, drawn as often as
needed); the rest is drawn as without it. Small models (a few minutes on a 2-core CPU for 20 runs), every mode, flags drawn at random."""

import json
import random
import sys

CONFIGS = ["llama-tied-8k", "qwen3-16k", "llama-512-f32", "qwen3-384-f32", "llama-256-bf16"]
MODES = ["dpo", "cpo", "orpo", "grpo", "lora_sft"]
FLAGS = [{}, {}, {"batch_size": 2}, {"grad_checkpoint": True}, {"fine_tune_type": "dora"}, {"load_in_4bits": True},
         {"fine_tune_type": "full"}, {"num_layers": 2}, {"fine_tune_type": "full", "load_in_4bits": True}]


def draw(seed: int, n: int, fixed: dict | None = None) -> list:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        mode = MODES[i % len(MODES)]
        config = rng.choice(CONFIGS)
        flags = dict(rng.choice(FLAGS))
        if fixed is not None:
            flags = dict(fixed)
        if mode == "grpo":
            flags.update(rl_group_size=rng.choice([2, 4, 8]), max_completion_length=rng.choice([16, 32, 64]))
            if rng.random() < 0.2:
                flags["beta"] = 0.0
            words = rng.choice([16, 32, 48])
        else:
            words = rng.choice([64, 100, 128, 200])
        rows.append([config, mode, words, flags])
    return rows


if __name__ == "__main__":
    print(json.dumps(draw(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)))
