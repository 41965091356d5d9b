"""Attention follows the live length: SmolLM2 on the demo prompts at max_len 256, 1024, 4096.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/attention_window/config.py

Decodes the demo's three chat prompts (96 new tokens each, batch 1, greedy) autoregressively
and with prompt lookup (K = 4), with the KV cache sized for each max_len, all in one process
with interleaved timed passes (task=max_len). Prints tokens/s per size relative to 256 and
writes experiments/attention_window/results/max_len.json. The texts must be identical across
sizes and modes; the target is within 10% of the max_len 256 speed at 4096.
"""

from ml_collections import config_dict

from configs import demo


def get_config():
  c = demo.base()
  c.task = "max_len"
  c.output_dir = "experiments/attention_window/results"
  c.max_len_sweep = config_dict.ConfigDict()
  c.max_len_sweep.sizes = (256, 1024, 4096)  # cache sizes, each compiled once
  c.benchmark.repeats = 3
  return c
