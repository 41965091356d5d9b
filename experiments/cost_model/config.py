"""τ simulator and cost model on SmolLM2-135M-Instruct: predicted vs measured, per drafter.

    python -m specjax.run --config=experiments/cost_model/config.py        # SmolLM2, ~55 min
    python -m specjax.run --config=experiments/cost_model/config.py:qwen   # Qwen pair, 14 min quiet
    python -m specjax.run --config=experiments/cost_model/config.py:smollm2_eagle   # ~45 min
    python -m specjax.run --config=experiments/cost_model/config.py:smollm2_blocks
    python -m specjax.report experiments/cost_model                        # README

task=cost_model: AR and every drafter below decode the four prompt categories of
``experiments/held_out.json`` greedily (64 new tokens, batch 1, interleaved timed passes); each
drafter's τ is also predicted without speculative decoding (one teacher-forced pass over the AR
text, then the steps replayed: ``specjax/simulate.py``) and its speedup from this machine's
profile (forwards timed one by one: ``specjax/costmodel.py``); the same predicted τ is priced on
four accelerators by their roofline. Drafters: prompt lookup (chains of 2 and 4, a 2 x 3 tree,
and chains that abstain unless 2 or 3 tokens match: K = 4 and 8),
the target's first 8 layers as a draft model (K = 1, 2), Medusa's trained heads with their
saved tree, the trained EAGLE drafter as 4- and 6-token chains and as EAGLE-2 dynamic trees
(2 x 5 with 8 nodes, 4 x 6 with 16). ``qwen``: Qwen2.5-Coder-1.5B with the 0.5B as a draft
(K = 2, 4, 6) and prompt lookup on the pair config's four code prompts. ``smollm2_eagle``:
the EAGLE drafter replayed at the tree budgets of ``EAGLE_BUDGETS`` (the grid that
``drafter.eagle.total = "auto"`` reads), three of them also decoded. ``smollm2_blocks``: the
block drafters (DFlash, DSpark, P-EAGLE) as chains and trees, the served EAGLE-3 and prompt
lookup, and each block drafter's ``block_grid`` (what ``tree = "auto"`` reads).
Writes ``results/<arg>/cost_model.json`` and ``sweep.json``.
"""

import functools

from ml_collections import config_dict

from configs import demo, qwen_coder_pair
from experiments import held_out
from experiments.eagle_smollm2 import config as eagle_smollm2
from specjax.drafters import eagle
from specjax.measure import sweep

HERE = "experiments/cost_model"
CHIPS = ("H100-SXM", "H200", "TPU-v5e", "TPU-v5p")


def variants() -> dict:
  eagle = functools.partial(eagle_smollm2.eagle_variant, eagle_smollm2.DRAFTER)
  lookup = lambda k, g=1, n=1: {  # noqa: E731
    "name": "prompt_lookup",
    "prompt_lookup": {"num_draft": k, "num_branches": g, "min_ngram": n},
  }  # fmt: skip
  return {
    "lookup_k2": lookup(2),
    "lookup_k4": lookup(4),
    "lookup_2x3": lookup(3, 2),
    "lookup_k4_min2": lookup(4, n=2),  # abstain unless the last 2 tokens match
    "lookup_k8_min3": lookup(8, n=3),
    "draft_8l_k1": {"name": "draft_model", "draft_model": {"num_draft": 1}},
    "draft_8l_k2": {"name": "draft_model", "draft_model": {"num_draft": 2}},
    "medusa": {"name": "medusa", "medusa": {"path": eagle_smollm2.MEDUSA_HEADS}},
    "eagle_chain_4": eagle(1, 4, 4),
    "eagle_chain_6": eagle(1, 6, 6),
    "eagle_tree_2x5_8": eagle(2, 5, 8),
    "eagle_tree_4x6_16": eagle(4, 6, 16),
  }


def qwen_variants() -> dict:
  """The Qwen pair: the 0.5B draft as chains of 2, 4 and 6, and prompt lookup."""
  draft = lambda k: {"name": "draft_model", "draft_model": {"num_draft": k}}  # noqa: E731
  return {
    "draft_k2": draft(2),
    "draft_k4": draft(4),
    "draft_k6": draft(6),
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }


# smollm2_eagle: EAGLE-2 budgets replayed, and three of them decoded to check the grid.
EAGLE_BUDGETS = ((1, 2, 2), (1, 4, 4), (2, 3, 4), (2, 5, 8), (3, 4, 8), (4, 4, 12), (4, 6, 16))


def eagle_variants() -> dict:
  """Three budgets of the EAGLE grid, decoded: the 2-chain, a 2 x 3 tree of 4 nodes, and
  the 4 x 6 tree of 16."""
  return {k: v for k, v in variants().items() if k == "eagle_tree_4x6_16"} | {
    "eagle_chain_2": eagle_smollm2.eagle_variant(eagle_smollm2.DRAFTER, 1, 2, 2),
    "eagle_tree_2x3_4": eagle_smollm2.eagle_variant(eagle_smollm2.DRAFTER, 2, 3, 4),
  }


def block_variants() -> dict:
  """The block drafters of experiments/block_smollm2 (DFlash's 7-chain and 14-node tree, with
  and without the lookup branch, DSpark's tree, whose children draw under their parent's
  token, P-EAGLE's 8-chain and 16-node tree, with and without the branch) and the served
  EAGLE-3's 16-node tree, beside prompt lookup: do the simulator and the cost model predict a
  block drafter as they do EAGLE? Each block drafter (and branch) is also replayed at every
  tree of ``static_tree.swept_trees``: the ``block_grid`` that ``tree = "auto"`` reads."""
  from experiments.block_smollm2 import config as block

  return {
    "lookup_k4": variants()["lookup_k4"],
    "dflash_chain_7": block.dflash_variant(block.DRAFTER),
    "dflash_tree_14": block.dflash_variant(block.DRAFTER, block.CATERPILLAR),
    "dflash_tree_14_l4": block.dflash_variant(block.DRAFTER, block.CATERPILLAR, lookup=4),
    "dspark_tree_14": block.dflash_variant(block.DSPARK_DRAFTER, block.CATERPILLAR),
    "peagle_chain_8": block.peagle_variant(block.PEAGLE_DRAFTER),
    "peagle_tree_16": block.peagle_variant(block.PEAGLE_DRAFTER, block.CATERPILLAR_8),
    "peagle_tree_16_l4": block.peagle_variant(block.PEAGLE_DRAFTER, block.CATERPILLAR_8, lookup=4),
    "eagle3_tree_4x6_16": eagle_smollm2.eagle_variant(eagle_smollm2.EAGLE3_DRAFTER, 4, 6, 16),
  }


# name: the sweep's variants and the EAGLE-2 budgets (top_k, depth, total) it replays, the grid
# that drafter.eagle.total = "auto" reads.
RUNS = {
  "smollm2": (variants, eagle.SWEPT_BUDGETS),
  "qwen": (qwen_variants, eagle.SWEPT_BUDGETS),
  "smollm2_eagle": (eagle_variants, EAGLE_BUDGETS),
  "smollm2_blocks": (block_variants, ()),
}


def get_config(arg: str = "smollm2"):
  if arg not in RUNS:
    raise ValueError(f"config argument {arg!r} is unknown; use {', '.join(RUNS)}.")
  pick, budgets = RUNS[arg]
  c = qwen_coder_pair.get_config() if arg == "qwen" else demo.base()
  c.task = "cost_model"
  c.output_dir = f"{HERE}/results/{arg}"
  c.max_new_tokens = 64
  c.max_len = 384
  c.benchmark.repeats = 2  # timed passes per mode (the median): this machine is noisy
  if arg == "smollm2":
    c.drafter.draft_model.num_layers = 8  # the target's first 8 layers as the draft model
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = (1,)
  c.sweep.verify_sizes = ()
  c.sweep.categories = {"code": tuple(c.prompts)} if arg == "qwen" else held_out.CATEGORIES
  c.sweep.variants = pick()
  c.cost_model = config_dict.ConfigDict()
  c.cost_model.chips = CHIPS
  c.cost_model.context = 192  # cached tokens behind the timed forwards (prompt + half a reply)
  c.cost_model.max_k = 8  # chains: tau for K = 1..8 (what num_draft = "auto" chooses from)
  c.cost_model.reuse_sweep = ""  # a sweep.json of this config: re-predict without re-measuring
  c.cost_model.eagle_budgets = budgets
  return c
