"""Training-free drafters on SmolLM2-135M-Instruct, per prompt category, batch 1 and 4.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/training_free/config.py

Runs AR and every variant below on four prompt categories (rewrite/summarise a given passage,
code continuation, open chat, QA over a passage), greedy, and prints tau, target calls per
token and the speedup over AR measured in the same process; writes
experiments/training_free/results/{b1,b4}/sweep.json. Variants: prompt lookup as a chain and as
trees of the best distinct matches (abstaining without a 2-gram match, or guessing from any
1-gram), and Lookahead decoding over a (W, N, G) grid. Every variant's text is checked to equal
AR's. Batch 4 (``--config=experiments/training_free/config.py:b4``) reruns the leading variants.
The batch-1 run also times one target forward over T tokens for the tree sizes used.
"""

from configs import demo
from experiments import held_out
from specjax.measure import sweep

VARIANTS = {  # name -> config.drafter overrides
  "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  "lookup_k4_n2": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4, "min_ngram": 2}},
  "lookup_tree_2x4_n2": {
    "name": "prompt_lookup",
    "prompt_lookup": {"num_draft": 4, "num_branches": 2, "min_ngram": 2},
  },
  "lookup_tree_3x4_n2": {
    "name": "prompt_lookup",
    "prompt_lookup": {"num_draft": 4, "num_branches": 3, "min_ngram": 2},
  },
  "lookahead_3_3_2": {
    "name": "lookahead",
    "lookahead": {"window": 3, "ngram": 3, "num_candidates": 2},
  },
  "lookahead_5_3_3": {
    "name": "lookahead",
    "lookahead": {"window": 5, "ngram": 3, "num_candidates": 3},
  },
  "lookahead_5_4_3": {
    "name": "lookahead",
    "lookahead": {"window": 5, "ngram": 4, "num_candidates": 3},
  },
}
BATCH4_VARIANTS = ("lookup_k4_n2", "lookup_tree_2x4_n2", "lookahead_3_3_2")


def get_config(arg: str = "b1"):
  """``arg``: b1 (batch 1, every variant) or b4 (batch 4, the prompt lookup and Lookahead
  variants that led at batch 1), e.g. ``--config=experiments/training_free/config.py:b4``."""
  if arg not in ("b1", "b4"):
    raise ValueError(f"config argument {arg!r} is unknown; use b1 or b4.")
  c = demo.base()
  c.task = "sweep"
  c.output_dir = f"experiments/training_free/results/{arg}"
  c.prompts = held_out.CATEGORIES["rewrite"]
  c.max_new_tokens = 64
  c.max_len = 384
  c.benchmark.repeats = 1
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = (1,) if arg == "b1" else (4,)
  c.sweep.categories = held_out.CATEGORIES
  c.sweep.verify_sizes = (1, 2, 5, 9, 11, 13, 25) if arg == "b1" else ()
  c.sweep.variants = VARIANTS if arg == "b1" else {k: VARIANTS[k] for k in BATCH4_VARIANTS}
  return c
