"""The feature path costs nothing unless asked for: SmolLM2, AR and prompt lookup, three ways.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/feature_cost/config.py

Compiles the demo's generation (batch 1, max_len 256, 96 new tokens, greedy) for prompt lookup
(K = 4) as is, reading the final hidden state, and reading three layers (and AR as is);
reports XLA's flops and bytes accessed for each compiled program, its optimised HLO instruction
count, and tokens/s from interleaved timed passes (task=feature_cost). Writes
experiments/feature_cost/results/feature_cost.json.
"""

from configs import demo


def get_config():
  c = demo.base()
  c.task = "feature_cost"
  c.output_dir = "experiments/feature_cost/results"
  c.benchmark.repeats = 3
  return c
