"""Leviathan et al. (2023): the formulas, then alpha, c, tau and speedup measured for K = 1..8.

    python -m specjax.run --config=experiments/speculative_theory/config.py            # SmolLM2
    python -m specjax.run --config=experiments/speculative_theory/config.py:qwen       # Qwen pair
    python -m specjax.report experiments/speculative_theory                            # README

``smollm2``: SmolLM2-135M-Instruct with its first 8 of 30 layers as the draft (no training, so
it regenerates on a fresh checkout); ``qwen``: Qwen2.5-Coder-1.5B-Instruct with the 0.5B as
the draft. Each decodes the same prompts greedily with a draft-model chain of K = 1..8, the
draft alone (its cost ratio c) and AR, in one process (task=sweep, interleaved timed passes),
and times one target forward over T = 1..9 tokens (the verify cost). Writes
``results/{smollm2,qwen}/sweep.json``; the report predicts tau from alpha (measured at K = 1)
with the formula E = (1 - a^(K+1)) / (1 - a), the speedup with Leviathan's verify = 1 step and
with the measured verify cost, and places them beside the measurements (table and figure).
"""

from configs import demo, qwen_coder_pair
from specjax.measure import sweep

KS = tuple(range(1, 9))


def get_config(arg: str = "smollm2"):
  if arg not in ("smollm2", "qwen"):
    raise ValueError(f"config argument {arg!r} is unknown; use smollm2 or qwen.")
  c = demo.base() if arg == "smollm2" else qwen_coder_pair.get_config()
  c.task = "sweep"
  c.output_dir = f"experiments/speculative_theory/results/{arg}"
  c.max_new_tokens = 64
  c.max_len = 320
  c.benchmark.repeats = 1
  c.drafter.draft_model.num_layers = 8  # smollm2: the first 8 of 30 layers
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = (1,)
  c.sweep.categories = {"prompts": tuple(c.prompts)}
  c.sweep.verify_sizes = tuple(range(1, 10))
  c.sweep.variants = {f"k{k}": {"name": "draft_model", "draft_model": {"num_draft": k}} for k in KS}
  c.sweep.draft_ar = "k1"
  return c
