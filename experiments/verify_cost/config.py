"""The verify-cost experiment: its timing script, the drafters decoded in bfloat16, the report.

    python experiments/verify_cost/verify_cost.py                      # the forward vs its matrices
    python experiments/verify_cost/drafter_cost.py                     # the drafters' own step
    python -m specjax.run --config=experiments/verify_cost/config.py   # drafters in bfloat16
    python -m specjax.report experiments/verify_cost

The config (task=sweep) decodes the training_free prompts (12, four categories), 64 new
tokens, batch 1, greedy, with bfloat16 weights and caches: AR, prompt lookup (K = 4), the
committed Medusa heads (their saved 4-node tree + the 4-token lookup branch: the variant's name,
medusa_3221_lookup4, is from a config that also gave tree_spec (3, 2, 2, 1), which the saved
tree overrode unsaid, an error now; the recorded runs decoded the saved tree) and the committed
EAGLE drafter (a 16-node EAGLE-2 tree of top-4, depth 6, + the lookup branch), each text
compared with bfloat16 AR's. The same EAGLE and lookup variants in float32 are
experiments/eagle_smollm2's ``:sweep_lookup``. About 10 minutes here.

    python -m specjax.run --config=experiments/verify_cost/config.py:one_shape

runs the same with ``forward_rows = 21`` (the EAGLE variant's rows per step, the most of the
three): every target forward after the prefill, AR's included, at 21 rows, so that each text
can equal AR's bit for bit (results/bf16_one_shape).

    python -m specjax.run --config=experiments/verify_cost/config.py:exact

runs it at the default ``forward_rows = auto`` with every drafter family (the three above,
Lookahead, a draft model of the target's first 8 layers, the served EAGLE-3, DFlash, DSpark and
P-EAGLE from experiments/block_smollm2, each block drafter's tree with the lookup branch): each
at its own rows per step, checked against AR at those rows (one AR run per row count), the
speedup over one-row AR (results/bf16_exact). About 40 minutes here.
"""

from configs import demo
from experiments import held_out
from experiments.block_smollm2 import config as block
from specjax.measure import sweep

MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
EAGLE_DRAFTER = "experiments/eagle_smollm2/drafter"
BF16_VARIANTS = {  # name -> config.drafter overrides; the EAGLE and lookup names as in float32
  "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  "medusa_3221_lookup4": {
    "name": "medusa",
    "medusa": {"path": MEDUSA_HEADS, "lookup": 4},  # the heads' saved tree
  },
  "eagle_tree_4x6_16_lookup4": {
    "name": "eagle",
    "eagle": {"path": EAGLE_DRAFTER, "top_k": 4, "depth": 6, "total": 16, "lookup": 4},
  },
}
FLOAT32_SWEEP = "experiments/eagle_smollm2/results/sweep_lookup/sweep.json"
EXACT_VARIANTS = BF16_VARIANTS | {  # :exact: every drafter family, its committed weights
  "lookahead_5_3_3": {"name": "lookahead",
                      "lookahead": {"window": 5, "ngram": 3, "num_candidates": 3}},
  "draft_model_8l_k4": {"name": "draft_model", "draft_model": {"num_layers": 8, "num_draft": 4}},
  "eagle3_16_l4": block.peagle_sweep_variants()["eagle3_16_l4"],
  "dflash_tree_14_lookup4": block.dflash_variant(block.DRAFTER, block.CATERPILLAR, lookup=4),
  "dspark_tree_14_lookup4": block.dflash_variant(block.DSPARK_DRAFTER, block.CATERPILLAR,
                                                 lookup=4),
  "peagle_tree_16_lookup4": block.peagle_variant(block.PEAGLE_DRAFTER, block.CATERPILLAR_8,
                                                 lookup=4),
}  # fmt: skip


ONE_SHAPE_ROWS = 21  # eagle_tree_4x6_16_lookup4: root + 16 nodes + 4 lookup tokens


def get_config(arg: str | None = None):
  if arg not in (None, "one_shape", "exact"):
    raise ValueError(f"config argument {arg!r} is unknown: use none, one_shape or exact.")
  c = demo.base()
  c.task = "sweep"
  c.dtype = "bfloat16"
  c.output_dir = "experiments/verify_cost/results/bf16_sweep"
  c.prompts = held_out.CATEGORIES["chat"]
  c.max_new_tokens = 64
  c.max_len = 384
  c.benchmark.repeats = 1
  c.sweep = sweep.default_config()
  c.sweep.categories = held_out.CATEGORIES
  c.sweep.variants = BF16_VARIANTS
  c.forward_rows = 0  # each forward its own rows: AR steps of one row
  if arg == "exact":  # the default: each drafter at its rows per step, against AR at those rows
    c.forward_rows = "auto"
    c.output_dir = "experiments/verify_cost/results/bf16_exact"
    c.sweep.variants = EXACT_VARIANTS
  if arg == "one_shape":
    c.forward_rows = ONE_SHAPE_ROWS
    c.output_dir = "experiments/verify_cost/results/bf16_one_shape"
  return c
