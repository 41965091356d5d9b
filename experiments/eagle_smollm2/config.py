"""EAGLE-1 for SmolLM2-135M-Instruct, trained on CPU, then decoded losslessly vs AR and Medusa.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy
    C=experiments/eagle_smollm2/config.py
    nice -n 10 python -m specjax.run --config=$C                   # 1. train (regenerated data)
    python -m specjax.run --config=$C:promote                      #    -> experiments/.../drafter
    python -m specjax.run --config=$C:sweep_b1                     # 2. decode vs AR and Medusa
    python -m specjax.report experiments/eagle_smollm2

1. EAGLE-1: one decoder layer with SmolLM2's shapes (random init) reads the target's final
   hidden state and the next token's embedding; trained by smooth-L1 on the next feature plus
   0.1 x cross-entropy on the next token against the target's own distribution, uniform input
   noise of width 0.2. Draft vocabulary: the 8192 most frequent training tokens (stop tokens
   in), over the target's frozen head. Data: the target's greedy replies to chat and code
   prompts ("regenerated" data, ``configs/self_distill_smollm2.py:greedy``) with chitchat and
   Python rows; one target forward per batch gives inputs and labels. Writes
   results/eagle_smollm2/{metrics.jsonl, checkpoints/, draft_init/, draft_final/, train.json},
   and the record with its metrics to results/eagle1/ here (each training variant to
   results/<variant>/); rerunning resumes from the newest checkpoint.
2. ``task=sweep``: the prompt categories of ``experiments/held_out.json`` (none in the training
   text), AR vs EAGLE-2 dynamic trees, an EAGLE chain, Medusa's best tree and prompt lookup,
   greedy, one process: tau, target calls per token, speedup; texts checked equal to AR's.
3. Ablations at equal budget (``ABLATIONS``: 300 steps each on 768 rows, then
   ``ABLATION_SWEEPS`` decode them as 6-token chains): the input ablation (token only,
   feature only, both), fixed vs regenerated data, EAGLE-3 vs EAGLE-1, the drafter's layer
   started from the target's last layer instead of random (``copy_fixed_300``), and the
   published EAGLE-3 architecture on eagle3_300's data and budget (``official_eagle3_300``,
   decoded at temperatures 0 and 1 by ``:sweep_official_eagle3``).
4. Continuations of 1.'s drafter (``init_from``): ``:tasks`` on the target's replies to task
   prompts, ``:volume`` on 1,600 chitchat rows of another document order (mostly unseen: more
   text), ``:requests`` on its replies to assistant requests made from templates (the kind
   of reply the held-out chat prompts get); ``:sweep_tasks`` / ``:sweep_volume`` /
   ``:sweep_requests`` decode each next to 1.'s (the last also as 16-node trees with the lookup
   branch, and on six more chat prompts, ``held_out.CHAT_NEW``); ``:sweep_requests_t1``
   decodes those trees on the chat prompts at temperature 1. ``:broad`` continues
   ``:requests``' drafter on replies to the broad request set too
   (``distill.REQUEST_SETS["broad"]``: other kinds of request), and ``:sweep_broad`` decodes
   the two on both chat sets and code. Capacity:
   ``:wide`` continues ``:broad``'s drafter 300 steps on the same rows with its layer's MLP
   widened 3x (``objective.eagle.ffn_dim``; the new units start silent), ``:more`` the same
   at its width (the control); ``fit.py`` replays the three on rows they trained on, unseen
   rows of the same kind and the held-out prompts. Data: ``:rows_<n>`` (``SCALE_RUNS``)
   continue 1.'s drafter 300 steps on n replies to the two request sets (nested draws),
   ``:rows_768_x3`` (``LONG_RUN``) 900 steps on :rows_768's replies, ``scale.py`` replays them
   against n, and ``:sweep_scale_t1`` decodes the last two at temperature 1 on the chat prompts.
5. A drafter the engines serve: ``:eagle3_serve`` trains the published EAGLE-3 (SafeAILab's and
   SGLang's architecture; layers 2, 14, 27; a 2-step training-time test) on 1.'s rows and
   schedule, ``:eagle3_requests`` continues it as ``:requests`` continued 1. (the same 1000 +
   300 steps and rows), ``:promote_eagle3`` commits it as ``drafter_eagle3/``, and
   ``:sweep_eagle3_serve`` decodes it beside ``:requests``' drafter on the held-out prompts.
   Its exports (``configs/export_drafter.py``, formats eagle3 and speculators) are read by
   SGLang's model, speculators' converter and ``from_pretrained`` (tests/test_real_models.py).
"""

from configs import demo, train_tiny
from experiments import held_out
from experiments.eagle_smollm2.variants import (
  ABLATION_SWEEPS,
  ABLATIONS,
  BROAD_DATA,
  BUDGET_300,
  CONTINUED,
  DRAFTER,
  DRAFTER_3,
  EAGLE3_DRAFTER,
  EAGLE3_LAYERS,
  FEATURES,
  FEATURES_3,
  FIXED,
  GREEDY_DATA,
  HERE,
  LAST_LAYER,
  LONG_RUN,
  MEDUSA_HEADS,
  REGEN,
  REQUESTS_DATA,
  REQUESTS_DRAFTER,
  RESULTS,
  SCALE_RUNS,
  SERVE,
  SERVE_FEATURES,
  SWEEPS,
  TASKS_DATA,
  WIDE_FFN,
  WORKDIR,
  WORKDIR_3,
  eagle_variant,
)
from specjax.tasks import promote
from specjax.train import objectives

# Read as config.NAME by the experiment's scripts, tests and other configs (besides the names
# get_config uses).
__all__ = (
  "ABLATION_SWEEPS", "ABLATIONS", "BROAD_DATA", "BUDGET_300", "DRAFTER_3", "HERE",
  "LAST_LAYER", "LONG_RUN", "MEDUSA_HEADS", "REQUESTS_DATA", "SCALE_RUNS", "TASKS_DATA",
  "WIDE_FFN", "eagle_variant", "get_config",
)  # fmt: skip


def get_config(arg: str | None = None):
  c = _training()
  if not arg:
    return c
  if arg not in VARIANTS:
    raise ValueError(
      f"unknown variant {arg!r} of eagle_smollm2/config.py; choose {', '.join(VARIANTS)}."
    )
  VARIANTS[arg](c, arg)
  return c


def _continued(c, name: str) -> None:
  """4.: a trained drafter continued on other rows (``CONTINUED``), at learning rate 1e-3
  decaying over all but the first 20 steps."""
  r = CONTINUED[name]
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.objective.eagle.init_from = r["init_from"]
  cache = r["cache"] if "/" in r["cache"] else f"{FEATURES}_{r['cache']}"
  c.data.update({"sources": r["sources"], "max_examples": r["rows"],
                 "feature_cache": cache} | r["data"])  # fmt: skip
  c.objective.eagle.update(r["objective"])
  c.train.steps = r["steps"]
  c.optim.update(learning_rate=1e-3, decay_steps=r["steps"] - 20)


def _equal_budget(c, name: str) -> None:
  """``eagle1_300`` and ``ttt_300``: 300 steps of 1.'s schedule (``eagle1_300`` is 1. stopped
  at step 300), the latter with EAGLE-3's training-time test on EAGLE-1's features."""
  c.train.steps = 300
  c.workdir = f"{WORKDIR}_{name}"
  c.record_to = f"{RESULTS}/{name}" if name == "ttt_300" else ""  # eagle1_300: 1.'s step 300
  if name == "ttt_300":
    c.objective.eagle.rollout = 3


def _ablation(c, name: str) -> None:
  """3.: a complete 300-step run (its own cosine decay) on 768 rows: all of the regenerated
  rows, or as many corpus rows."""
  a = dict(ABLATIONS[name])
  c.data.sources = a.pop("sources")
  o = c.objective.eagle
  o.update(a)
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.data.max_examples = 768
  rows = "regen" if c.data.sources == REGEN else "fixed"
  layers = "" if o.feature_layers == ("final",) else "_eagle3"
  c.data.feature_cache = f"{FEATURES}_{rows}{layers}"  # the input ablations share one
  c.train.steps = 300
  c.optim.decay_steps = 280


def _eagle3(c, name: str) -> None:
  """EAGLE-3: three layers fused, training-time test, token loss only."""
  c.workdir, c.record_to = WORKDIR_3, ""
  c.data.feature_cache = FEATURES_3
  c.objective.eagle.update(feature_layers=EAGLE3_LAYERS, rollout=3)


def _eagle3_serve(c, name: str) -> None:
  """The published EAGLE-3 on 1.'s rows and schedule (``SERVE``): what the engines serve."""
  c.workdir, c.record_to = f"{WORKDIR}_{name}", f"{RESULTS}/{name}"
  c.data.feature_cache = SERVE_FEATURES
  c.objective.eagle.update(SERVE)


PROMOTIONS = {  # name: (the run whose drafter is promoted, where it goes)
  "promote": (WORKDIR, DRAFTER),
  "promote_requests": (f"{WORKDIR}_requests", REQUESTS_DRAFTER),
  "promote_eagle3": (f"{WORKDIR}_eagle3_requests", EAGLE3_DRAFTER),
}


def _promote(c, name: str) -> None:
  """1.'s drafter to ``DRAFTER`` (``:promote``), or ``:requests``' to ``REQUESTS_DRAFTER``
  (``:promote_requests``), with its manifest (task=promote)."""
  c.task = "promote"
  c.promote = promote.default_config()
  run, to = PROMOTIONS[name]
  # The published EAGLE-3 trains its own head (39 MB in float32): committed in bfloat16.
  c.promote.update(run=run, to=to, dtype="bfloat16" if name == "promote_eagle3" else "")


def _sweep(c, name: str) -> None:
  """2.-4.'s decoding sweeps (``SWEEPS``): 64 new tokens per prompt, batch 1 unless named."""
  pick, categories, how = SWEEPS[name]
  c.drafter.eagle.path = DRAFTER
  c.temperature = how.get("temperature", c.temperature)
  held_out.sweep_on(c, f"{RESULTS}/{name}", categories, pick(), (how.get("batch", 1),),
                    how.get("temperatures", ()))  # fmt: skip


VARIANTS = {  # name: what it changes in 1.'s config (the error message lists them in this order)
  **{name: _continued for name in CONTINUED},
  "eagle1_300": _equal_budget,
  "ttt_300": _equal_budget,
  "eagle3": _eagle3,
  "eagle3_serve": _eagle3_serve,  # 5.
  **{name: _ablation for name in ABLATIONS},
  **{name: _promote for name in PROMOTIONS},
  **{name: _sweep for name in SWEEPS},
}


def _training():
  """1.: EAGLE-1 on the regenerated data, 1000 steps; what every variant changes."""
  c = demo.base()  # SmolLM2 target, held-out chat and code prompts, greedy, batch 1
  c.task = "train"
  c.workdir = WORKDIR
  c.record_to = f"{RESULTS}/eagle1"  # train.json and metrics.jsonl (each training variant sets it)
  c.drafter.name = "eagle"
  c.drafter.eagle.update(top_k=4, depth=5, total=16)
  c.benchmark.repeats = 1
  t = train_tiny.get_config()
  for section in ("data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]
  c.objective = objectives.default_config("eagle")
  c.objective.eagle.update(feature_layers=("final",), vocab_size=8192, copy_layer=-1, noise=0.2,
                           feature_weight=1.0, token_weight=1.0)  # fmt: skip
  c.data.update(
    sources=(GREEDY_DATA, *FIXED),
    seq_len=256,
    max_examples=3000,
    eval_examples=32,
    seed=0,
    feature_cache=FEATURES,
  )  # the target's features of every row, once
  c.train.update(steps=1000, global_batch=8, log_every=10, eval_every=100, eval_batches=2,
                 checkpoint_every=50, keep=2)  # fmt: skip
  c.optim.update(learning_rate=2e-3, warmup_steps=20, decay_steps=980, weight_decay=0.0)
  return c
