"""Temperature sweep 0 -> 1.5 on SmolLM2-135M-Instruct: alpha and tau per drafter.

    python -m specjax.run --config=experiments/temperature_sweep/config.py     # ~25 min
    python -m specjax.report experiments/temperature_sweep                     # README

One process (task=sweep) decodes the chat and code prompts of ``experiments/held_out.json``
(none in any drafter's training text) at temperatures 0, 0.5, 1.0 and 1.5 (top-k and top-p
off: the whole distribution) with AR and five drafters: prompt lookup (4-token chain), the
target's first 8 layers as a draft model (2-token chain, no training), Medusa's trained heads
(their saved sparse tree; children sampled without replacement at T > 0), and the trained
EAGLE drafter as a 4-token chain and a 2 x 5, 8-node tree (sampled children at T > 0). Every
drafter is verified losslessly (recursive rejection with the drafts' q). Writes
``results/sweep.json``; the report gives tau, alpha at the first draft position and the speedup
over AR measured in the same process, per temperature.
"""

from configs import demo
from experiments import held_out
from experiments.eagle_smollm2 import config as eagle_smollm2
from specjax.measure import sweep

HERE = "experiments/temperature_sweep"
TEMPERATURES = (0.0, 0.5, 1.0, 1.5)


def variants() -> dict:
  eagle = lambda top_k, depth, total: {  # noqa: E731
    "name": "eagle",
    "eagle": {"path": eagle_smollm2.DRAFTER, "top_k": top_k, "depth": depth, "total": total},
  }  # fmt: skip
  return {
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
    "draft_8_layers_k2": {"name": "draft_model", "draft_model": {"num_draft": 2}},
    "medusa": {"name": "medusa", "medusa": {"path": eagle_smollm2.MEDUSA_HEADS}},
    "eagle_chain_4": eagle(1, 4, 4),
    "eagle_tree_2x5_8": eagle(2, 5, 8),
  }


def get_config(arg: str | None = None):
  if arg:
    raise ValueError(f"temperature_sweep/config.py takes no argument (got {arg!r}).")
  c = demo.base()
  c.task = "sweep"
  c.output_dir = f"{HERE}/results"
  c.max_new_tokens = 48
  c.max_len = 384
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  c.benchmark.repeats = 1
  c.drafter.draft_model.num_layers = 8
  c.sweep = sweep.default_config()
  c.sweep.temperatures = TEMPERATURES
  c.sweep.batch_sizes = (1,)
  c.sweep.categories = {k: held_out.CATEGORIES[k] for k in ("chat", "code")}
  c.sweep.verify_sizes = ()
  c.sweep.variants = variants()
  return c
