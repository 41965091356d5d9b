"""Medusa heads for Qwen2.5-Coder-0.5B-Instruct on code (the SmolLM2 recipe, another target).

    bash scripts/install_models.sh qwen2.5-coder-0.5b-instruct
    bash scripts/install_corpora.sh python
    nice -n 10 python -m specjax.run --config=experiments/medusa_qwen_coder/config.py       # train
    python -m specjax.run --config=experiments/medusa_qwen_coder/config.py:tree
    python -m specjax.run --config=experiments/medusa_qwen_coder/config.py:sweep_b1

Four heads on the target's final hidden state (896 wide), its frozen head restricted to the
8,192 most frequent tokens of the Python standard library, trained on the target's
teacher-forced predictions over that code. The sweep decodes the code prompts of
``experiments/held_out.json`` against AR. Not run yet: the
heads and results will go to results/medusa_qwen_coder/ and experiments/medusa_qwen_coder/.
"""

from experiments import held_out
from experiments.medusa_smollm2 import config as smollm2
from specjax.models import source

WORKDIR = "results/medusa_qwen_coder"
HERE = "experiments/medusa_qwen_coder"


def get_config(arg: str | None = None):
  c = smollm2.get_config(arg)
  c.target = source.config("qwen2.5-coder-0.5b-instruct")
  c.objective.medusa.vocab_size = 8192
  c.data.sources = ("python",)
  c.train.global_batch = 4  # a 0.5B target's forward is ~4x SmolLM2's
  c.prompts = held_out.CATEGORIES["code"]
  heads = f"{HERE}/heads"
  c.workdir = WORKDIR
  c.record_to = ""  # no committed results folder: train.json stays in the workdir
  if arg in ("tree", "benchmark"):
    c.drafter.medusa.path = heads
    c.output_dir = c.output_dir.replace(smollm2.HERE, HERE)
  elif arg in ("sweep_b1", "sweep_b4"):
    c.output_dir = c.output_dir.replace(smollm2.HERE, HERE)
    c.sweep.categories = {"code": held_out.CATEGORIES["code"]}
    if "medusa_sparse_16" in c.sweep.variants:  # grown for SmolLM2's heads, not these
      del c.sweep.variants["medusa_sparse_16"]
    for v in c.sweep.variants.values():
      if v["name"] == "medusa":
        v["medusa"]["path"] = heads
  return c
