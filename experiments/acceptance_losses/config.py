"""Training aimed at acceptance on SmolLM2-135M-Instruct: the published EAGLE-3 continued on
EAGLE's ``:requests`` rows and step budget with each token loss and with HASS's options, τ on
the training curve.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:requests
    python -m specjax.run --config=experiments/eagle_smollm2/config.py:eagle3_serve  # the start
    python -m specjax.run --config=experiments/acceptance_losses/config.py:soft_ce   # 1.
    python -m specjax.run --config=experiments/acceptance_losses/config.py:tv        # ... each of
    python -m specjax.run --config=experiments/acceptance_losses/config.py:sweep     # 2.
    python -m specjax.run --config=experiments/acceptance_losses/config.py:specbench \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl  # 3.
    python -m specjax.run --config=experiments/acceptance_losses/config.py:specbench_later \
      --config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl  # 3.
    python -m specjax.report experiments/acceptance_losses                           # README

1. Each run (``RUNS``) starts from eagle_smollm2's ``:eagle3_serve`` (the published EAGLE-3:
   layers 2, 14 and 27 fused, a 2-step training-time test, 1000 steps of EAGLE's 1.'s rows)
   and trains 300 steps on ``:requests``' rows (768 replies to assistant requests and Python,
   learning rate 1e-3 cosine after 20 warm-up steps): eagle_smollm2's ``:eagle3_requests``,
   whose drafter README's EAGLE-3 commands decode, with the token term changed and nothing
   else. ``soft_ce`` is that run again (its default); ``kl`` is left out, its gradient being
   soft_ce's (they differ by the target's entropy). ``hass`` adds HASS's harmonized top-10
   term (weight 1) to soft_ce; ``hass_r3`` also unrolls a third training-time step (HASS's
   context alignment over three steps).
   Every 100 steps (and at 0) the simulator replays the target's greedy continuations of the
   held-out chat, new-chat and code prompts (``PROMPTS``, 64 tokens) through the drafter as
   the 16-node EAGLE-2 tree with the lookup branch decodes them: ``tau/simulated`` on the
   curve; at the end it is set beside a real decode of the same prompts (``tau_check``).
2. ``:sweep`` decodes every trained drafter as that tree greedily on the curve's prompts by
   category (chat, new chat, code), beside AR, in one process.
3. ``:specbench`` decodes them, and EAGLE ``:requests``' drafter, as that tree on Spec-Bench's
   first two questions of each category (26 first turns, 128 new tokens, float32), each beside
   AR (add ``--config.specbench.question_file=PATH/Spec-Bench/data/spec_bench/question.jsonl``);
   ``:specbench_later`` the same for four of the runs trained after them (``LATER``).
"""

from configs import specbench as specbench_config
from experiments import held_out
from experiments.eagle_smollm2 import config as eagle_smollm2

HERE = "experiments/acceptance_losses"
RESULTS = f"{HERE}/results"
WORKDIR = "results/acceptance_losses"  # checkpoints (not in git): WORKDIR_<run>
START = "eagle3_requests"  # eagle_smollm2's run every run here repeats but for the token term
# The held-out prompts on the curve: chat, new kinds of chat, code (never trained on).
PROMPTS = (*held_out.CATEGORIES["chat"], *held_out.CHAT_NEW, *held_out.CATEGORIES["code"])
TREE = {"top_k": 4, "depth": 6, "total": 16, "lookup": 4}  # README's EAGLE budget
TAU_EVERY = 100
RUNS = {  # name: objective.eagle overrides
  "soft_ce": {},
  "tv": {"loss": "tv"},
  "lk": {"loss": "lk"},
  "hass": {"hass_top_k": 10},
  "jsd": {"loss": "jsd"},
  "rkl": {"loss": "rkl"},
  "ce": {"loss": "ce"},
  "nla": {"loss": "nla"},
  "hass_r3": {"hass_top_k": 10, "rollout": 3},
}


SWEPT = ("soft_ce", "tv", "hass", "lk")  # the runs trained first: :sweep and :specbench
# :specbench_later: the runs trained after them, but rkl (the lowest τ on the curve, 2.08 as
# tv's, which :specbench decodes).
LATER = ("jsd", "ce", "nla", "hass_r3")


def _run(name: str):
  c = eagle_smollm2.get_config(START)
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.objective.eagle.update(RUNS[name])
  c.drafter.eagle.update(TREE)
  c.prompts = PROMPTS
  c.max_new_tokens = 64
  c.max_len = 384
  c.evaluate.tau_every = TAU_EVERY
  return c


def _sweep():
  c = eagle_smollm2.get_config(START)
  variants = {
    f"{name}_tree_4x6_16_lookup4": eagle_smollm2.eagle_variant(
      f"{WORKDIR}_{name}/draft_final", **TREE
    )
    for name in SWEPT
  }
  c_ = held_out.CATEGORIES
  categories = {"chat": c_["chat"], "chat_new": held_out.CHAT_NEW, "code": c_["code"]}
  held_out.sweep_on(c, f"{RESULTS}/sweep", categories, variants)
  return c


def _specbench(runs=SWEPT, out: str = "specbench"):
  """3.: the ``runs``' drafters and EAGLE ``:requests``' (the bar) on Spec-Bench's first two
  questions per category, each beside AR, float32 (greedy text equal to AR's)."""
  c = specbench_config.get_config()
  c.output_dir = f"{RESULTS}/{out}"
  c.dtype = "float32"
  c.specbench.per_category = 2  # 26 questions, first turns
  c.max_new_tokens = 128
  c.specbench.variants = {
    f"{name}_16_l4": eagle_smollm2.eagle_variant(f"{WORKDIR}_{name}/draft_final", **TREE)
    for name in runs
  } | {"requests_16_l4": eagle_smollm2.eagle_variant(eagle_smollm2.REQUESTS_DRAFTER, **TREE)}
  return c


def get_config(arg: str | None = None):
  if arg == "sweep":
    return _sweep()
  if arg == "specbench":
    return _specbench()
  if arg == "specbench_later":
    return _specbench(LATER, "specbench_later")
  if arg not in RUNS:
    raise ValueError(
      f"unknown variant {arg!r} of acceptance_losses/config.py; choose {', '.join(RUNS)}, "
      "sweep, specbench, specbench_later."
    )
  return _run(arg)
