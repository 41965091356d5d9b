"""The feature path costs nothing unless asked for: SmolLM2, AR and prompt lookup, three ways.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/feature_cost/config.py

Compiles the demo's generation (batch 1, max_len 256, 96 new tokens, greedy) for AR and for
prompt lookup (K = 4) as is, asking for the final hidden state, and asking for three layers;
reports XLA's flops and bytes accessed for each compiled program, its optimised HLO instruction
count, and tokens/s from interleaved timed passes (task=feature_cost). Writes
experiments/feature_cost/results/feature_cost.json.
"""

from configs import demo


def get_config():
  c = demo.get_config()
  c.task = "feature_cost"
  c.output_dir = "experiments/feature_cost/results"
  c.benchmark.repeats = 3
  return c


def report(results_dir):
  """The README's results block, from results/feature_cost.json."""
  import json

  from specjax import results

  record = json.loads((results_dir / "feature_cost.json").read_text())
  cols = ("mode", "features", "hlo_ops", "gflops", "gbytes", "tau", "tokens_per_s", "vs_none")
  return results.markdown_table(record["runs"], cols)
