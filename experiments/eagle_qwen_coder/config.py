"""EAGLE-1 for Qwen2.5-Coder-0.5B-Instruct on code (the SmolLM2 recipe, another target).

    bash scripts/install_models.sh qwen2.5-coder-0.5b-instruct
    bash scripts/install_corpora.sh python
    C=experiments/eagle_qwen_coder/config.py
    nice -n 10 python -m specjax.run --config=$C            # train (features cached first)
    cp -r results/eagle_qwen_coder/draft_final experiments/eagle_qwen_coder/drafter
    python -m specjax.run --config=$C:sweep_b1              # decode the code prompts vs AR

One decoder layer of the target's shapes (896 wide) reads its final feature and the next
token's embedding; its frozen head is restricted to the 8,192 most frequent tokens of the
Python standard library rows it trains on (fixed data: the corpus text, the target's features
and distributions teacher-forced over it). The sweep decodes the code prompts of
``experiments/held_out.json`` as a 4-token chain and EAGLE-2 trees (8 and 16 nodes) against AR
and prompt lookup. ``:eagle3`` fuses three of the target's 24 layers (low, middle, high) with
the training-time test over 3 steps. Not run yet: a Qwen target's forward is ~4x SmolLM2's, so
the feature cache alone would take over an hour here.
"""

import functools

from experiments import held_out
from experiments.eagle_smollm2 import config as smollm2
from specjax.models import source

WORKDIR = "results/eagle_qwen_coder"
HERE = "experiments/eagle_qwen_coder"
DRAFTER = f"{HERE}/drafter"
FEATURES = "data/features/eagle_qwen_coder"
EAGLE3_LAYERS = (2, 12, 22)  # low, middle, high of Qwen2.5-Coder-0.5B's 24 layers


def get_config(arg: str | None = None):
  if arg not in (None, "eagle3", "sweep_b1"):
    raise ValueError(f"unknown variant {arg!r} of eagle_qwen_coder/config.py; choose eagle3 or "
                     "sweep_b1.")  # fmt: skip
  c = smollm2.get_config("sweep_b1" if arg == "sweep_b1" else None)
  c.target = source.config("qwen2.5-coder-0.5b-instruct")
  c.prompts = held_out.CATEGORIES["code"]
  c.workdir = WORKDIR
  c.record_to = ""  # no committed results folder: train.json stays in the workdir
  c.data.sources = ("python",)
  c.data.feature_cache = FEATURES
  c.train.global_batch = 4  # a 0.5B target's forward is ~4x SmolLM2's
  if arg == "eagle3":
    c.workdir = f"{WORKDIR}_eagle3"
    c.data.feature_cache = f"{FEATURES}_eagle3"
    # specjax's EAGLE-3, as its README's results were trained (the default for several
    # feature layers is now the published architecture).
    c.objective.eagle.update(feature_layers=EAGLE3_LAYERS, rollout=3, architecture="specjax")
  elif arg == "sweep_b1":
    c.output_dir = f"{HERE}/results/sweep_b1"
    c.drafter.eagle.path = DRAFTER
    c.sweep.categories = {"code": held_out.CATEGORIES["code"]}
    e = functools.partial(smollm2.eagle_variant, DRAFTER)
    c.sweep.variants = {
      "eagle_chain_4": e(1, 4, 4),
      "eagle_tree_2x5_8": e(2, 5, 8),
      "eagle_tree_4x6_16": e(4, 6, 16),
      "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
    }
  return c
