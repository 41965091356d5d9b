"""Spec-Bench on SmolLM2-135M-Instruct: prompt lookup, Medusa and EAGLE beside one AR run.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/specbench_smollm2/config.py \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl
    python -m specjax.report experiments/specbench_smollm2       # README tables, figure (report.py)

task=specbench over Spec-Bench's subset of 65 (the first five questions of each of its 13
categories, first turns), 256 new tokens, greedy, batch 1, float32 (``dtype = auto`` on a CPU).
Each question is answered by AR and by the three drafters one after the other, every drafter's
tokens checked equal to AR's: prompt lookup (K = 4); the committed Medusa heads
(experiments/medusa_smollm2/heads, their saved 4-node tree plus prompt lookup's 4-token branch;
the recorded runs' config also gave tree_spec (3, 2, 2, 1), which the saved tree overrode); the
committed EAGLE drafter (experiments/eagle_smollm2/drafter) with the tree budget the cost model
picks for this machine (``total = auto`` over experiments/cost_model's measured grid: a 16-node
tree reaches a higher τ, but verifying 16 float32 rows costs about 5 one-token forwards here,
experiments/verify_cost). Writes results/: specbench.json, specbench.md and Spec-Bench's answer
files (model_answer/, one per method; Spec-Bench's evaluation/speed.py reads them). An
interrupted run resumes at the next question. The question file is Spec-Bench's
(github.com/hemingkx/Spec-Bench; nothing of it ships here). The run takes about 37 minutes on
this 2-core CPU.

    python -m specjax.run --config=experiments/specbench_smollm2/config.py:bfloat16 \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl

decodes the same three methods in bfloat16 at the default ``forward_rows = auto`` over the
first two questions of each category (26, 128 new tokens): each method at its rows per step,
its greedy answer checked against AR's at those rows (one AR run per row count and question),
EAGLE's ``total = auto`` priced at those rows (results/bfloat16/). About 35 minutes here.
"""

from configs import specbench as specbench_config

MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
EAGLE_DRAFTER = "experiments/eagle_smollm2/drafter"
EAGLE_COSTS = "experiments/cost_model/results/smollm2_eagle/cost_model.json"
VARIANTS = {  # name -> config.drafter overrides
  "prompt_lookup": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  "medusa": {
    "name": "medusa",
    "medusa": {"path": MEDUSA_HEADS, "lookup": 4},  # the heads' saved tree
  },  # fmt: skip
  "eagle": {
    "name": "eagle",
    "eagle": {"path": EAGLE_DRAFTER, "total": "auto", "auto_from": EAGLE_COSTS},
  },  # fmt: skip
}


def get_config(arg: str = ""):
  if arg not in ("", "bfloat16"):
    raise ValueError(f"specbench_smollm2/config.py takes no argument or ':bfloat16', got {arg!r}.")
  c = specbench_config.get_config()
  c.output_dir = "experiments/specbench_smollm2/results"
  c.specbench.variants = VARIANTS
  c.specbench.per_category = 5  # Spec-Bench's 65-question subset
  if arg == "bfloat16":  # the same methods in bfloat16 at forward_rows = auto: greedy = AR's
    c.output_dir = "experiments/specbench_smollm2/results/bfloat16"
    c.dtype = "bfloat16"
    c.specbench.per_category = 2  # 26 questions: each method's AR at its rows is decoded too
    c.max_new_tokens = 128
  return c
