"""EAGLE-1 for SmolLM2-135M-Instruct, trained on CPU, then decoded losslessly vs AR and Medusa.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy
    C=experiments/eagle_smollm2/config.py
    nice -n 10 python -m specjax.run --config=$C                   # 1. train (regenerated data)
    cp -r results/eagle_smollm2/draft_final experiments/eagle_smollm2/drafter
    python -m specjax.run --config=$C:sweep_b1                     # 2. decode vs AR and Medusa
    python -m specjax.report experiments/eagle_smollm2

1. EAGLE-1: one decoder layer with SmolLM2's shapes (random init) reads the target's final
   hidden state and the next token's embedding; trained by smooth-L1 on the next feature plus
   0.1 x cross-entropy on the next token against the target's own distribution, uniform input
   noise of width 0.2. Draft vocabulary: the 8192 most frequent training tokens (stop tokens
   in), over the target's frozen head. Data: the target's greedy replies to chat and code
   prompts ("regenerated" data, ``configs/self_distill_smollm2.py:greedy``) with chitchat and
   Python rows; one target forward per batch gives inputs and labels. Writes
   results/eagle_smollm2/{metrics.jsonl, checkpoints/, draft_init/, draft_final/, train.json};
   rerunning resumes from the newest checkpoint.
2. ``task=sweep``: the prompt categories of ``experiments/training_free`` (none in the training
   text), AR vs EAGLE-2 dynamic trees, an EAGLE chain, Medusa's best tree and prompt lookup,
   greedy, one process: tau, target calls per token, speedup; texts checked equal to AR's.
3. Ablations at equal budget (``ABLATIONS``: 300 steps each on 768 rows, then
   ``ABLATION_SWEEPS`` decode them as 6-token chains): the input ablation (token only,
   feature only, both), fixed vs regenerated data, EAGLE-3 vs EAGLE-1, and the drafter's layer
   started from the target's last layer instead of random (``copy_fixed_300``).
4. Continuations of 1.'s drafter (``init_from``): ``:tasks`` on the target's replies to task
   prompts, ``:volume`` on 1,600 chitchat rows of another document order (mostly unseen: more
   text), ``:requests`` on its replies to assistant requests made from templates (the kind
   of reply the held-out chat prompts get); ``:sweep_tasks`` / ``:sweep_volume`` /
   ``:sweep_requests`` decode each next to 1.'s (the last also as 16-node trees with the lookup
   branch, and on six more chat prompts, ``CHAT_NEW``); ``:sweep_requests_t1`` decodes those
   trees on the chat prompts at temperature 1. ``:broad`` continues ``:requests``' drafter
   on replies to the broad request set too (``distill.REQUEST_SETS["broad"]``: other kinds of
   request), and ``:sweep_broad`` decodes the two on both chat sets and code. Capacity:
   ``:wide`` continues ``:broad``'s drafter 300 steps on the same rows with its layer's MLP
   widened 3x (``objective.eagle.ffn_dim``; the new units start silent), ``:more`` the same
   at its width (the control); ``fit.py`` replays the three on rows they trained on, unseen
   rows of the same kind and the held-out prompts. Data: ``:rows_<n>`` (``SCALE_RUNS``)
   continue 1.'s drafter 300 steps on n replies to the two request sets (nested draws),
   ``:rows_768_x3`` (``LONG_RUN``) 900 steps on :rows_768's replies, ``scale.py`` replays them
   against n, and ``:sweep_scale_t1`` decodes the last two at temperature 1 on the chat prompts.
"""

import functools

from configs import demo, train_tiny
from experiments.training_free import config as training_free
from specjax import results
from specjax.tasks import sweep
from specjax.train import objectives

WORKDIR = "results/eagle_smollm2"  # checkpoints and exports (not in git)
HERE = "experiments/eagle_smollm2"
DRAFTER = f"{HERE}/drafter"  # committed copy of WORKDIR/draft_final
GREEDY_DATA = "data/self_distill/smollm2_greedy"  # configs/self_distill_smollm2.py:greedy
TASKS_DATA = "data/self_distill/smollm2_tasks"  # configs/self_distill_smollm2.py:tasks
REQUESTS_DATA = "data/self_distill/smollm2_requests"  # configs/self_distill_smollm2.py:requests
BROAD_DATA = "data/self_distill/smollm2_requests_broad"  # ...:requests_broad (other templates)
# Chat prompts for :sweep_requests whose kind of request is in neither request set
# (distill.REQUEST_SETS): a second held-out chat set beside training_free's three, which ask
# for the kinds of reply the templates ask for (tips, a story, how to), on other topics. The
# basic set touches three of their topics in other kinds of request (tips for reading more
# books, an invitation to a birthday dinner, a story in which someone solves a mystery); the
# broad set names none (tests/test_distill.py).
CHAT_NEW = (
  "Can you recommend a few books for someone who enjoys mystery novels?",
  "Why do onions make people cry?",
  "What questions should I ask when buying a used car?",
  "Write a birthday card message for my brother, who is turning thirty.",
  "Suggest some names for a new bakery.",
  "How can a small shop attract more customers?",
)
MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
RESULTS = f"{HERE}/results"
WIDE_FFN = 3 * 1536  # :wide's MLP width, 3x SmolLM2's
# Data scaling (:rows_<n>): DRAFTER continued 300 steps (:requests' schedule) on n replies to
# the two request sets, half from each, 8 more per set held out. The draws are nested (a
# smaller run's rows are among a larger one's), so only the number of distinct replies
# changes; scale.py replays them.
SCALE_RUNS = {f"rows_{n}": n for n in (48, 192, 768)}
# The same 768 replies read for 3x the steps (900, one cosine): is :rows_768 short of steps
# rather than of replies? It shares :rows_768's rows and cached features.
LONG_RUN = "rows_768_x3"
FEATURES = "data/features/eagle_smollm2"  # float16 final features of the training rows
WORKDIR_3 = "results/eagle3_smollm2"
FEATURES_3 = "data/features/eagle3_smollm2"
DRAFTER_3 = f"{HERE}/drafter3"
# The equal-budget pair, decoded from their workdirs (17 MB each, not kept in git).
BUDGET_300 = {n: f"{WORKDIR}_{n}/draft_final" for n in ("eagle1_300", "ttt_300")}
EAGLE3_LAYERS = (2, 14, 27)  # low, middle, high of SmolLM2's 30 layers
# The papers' ablations at equal budget (300 steps, the same schedule, 768 training rows each),
# all against regen_300 (EAGLE-1 on the regenerated data: the target's greedy replies to
# chitchat and Python prompts): what a pair feeds the layer; the fixed data those prompts were
# cut from (the corpus rows); EAGLE-3 (three layers fused, training-time test over 3 steps,
# token loss only); the drafter's layer started from the target's last layer instead of
# random (on the fixed data, against fixed_300). name: objective.eagle overrides, and the data
# sources.
_REGEN = (GREEDY_DATA,)
_FIXED = ("chitchat", "python")
LAST_LAYER = 29  # of SmolLM2's 30
ABLATIONS = {
  "regen_300": {"sources": _REGEN},
  "feature_only_300": {"sources": _REGEN, "inputs": "feature"},
  "token_only_300": {"sources": _REGEN, "inputs": "token"},
  "fixed_300": {"sources": _FIXED},
  "eagle3_300": {"sources": _REGEN, "feature_layers": EAGLE3_LAYERS, "rollout": 3},
  "copy_fixed_300": {"sources": _FIXED, "copy_layer": LAST_LAYER},
}
# Each comparison decodes its drafters (and its baseline: regen_300, or fixed_300 for the
# layer's initialisation) in one process.
ABLATION_SWEEPS = {
  "sweep_inputs": ("regen_300", "token_only_300", "feature_only_300"),
  "sweep_data": ("regen_300", "fixed_300"),
  "sweep_eagle3": ("regen_300", "eagle3_300"),
  "sweep_init": ("fixed_300", "copy_fixed_300"),
}


def eagle_variant(path: str, top_k: int, depth: int, total: int, **extra) -> dict:
  """A sweep variant (config.drafter overrides) decoding the drafter at ``path`` with the
  EAGLE-2 budget (top_k, depth, total); top_k = 1 and total = depth is a chain."""
  budget = {"top_k": top_k, "depth": depth, "total": total}
  return {"name": "eagle", "eagle": {"path": path} | budget | extra}


def variants() -> dict:
  """Sweep variants (config.drafter overrides): EAGLE-2 trees of several budgets, an EAGLE
  chain, Medusa's saved tree and prompt lookup."""
  e = functools.partial(eagle_variant, DRAFTER)
  return {
    "eagle_chain_4": e(1, 4, 4),
    "eagle_chain_6": e(1, 6, 6),
    "eagle_tree_2x5_8": e(2, 5, 8),
    "eagle_tree_4x6_16": e(4, 6, 16),
    "medusa_sparse_4": {"name": "medusa", "medusa": {"path": MEDUSA_HEADS}},
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }


def t1_variants() -> dict:
  """Temperature 1: EAGLE with sampled children (verified with their q) as a chain and an
  8-node tree, and the tree with top-k children (verified as one-hot proposals)."""
  e = functools.partial(eagle_variant, DRAFTER)
  return {
    "eagle_chain_4": e(1, 4, 4, candidates="sampled"),
    "eagle_tree_2x5_8": e(2, 5, 8, candidates="sampled"),
    "eagle_tree_2x5_8_top_k": e(2, 5, 8, candidates="top_k"),
  }


def lookup_variants() -> dict:
  """EAGLE with and without prompt lookup's 4-token guess as one more branch from the root, as
  a 4-chain and as EAGLE-2 trees of 8 and 16 nodes, and prompt lookup alone (candidates
  ``auto``: top-k at temperature 0, sampled and verified with their q at 1)."""
  e = functools.partial(eagle_variant, DRAFTER)
  out = {}
  for name, budget in (("chain_4", (1, 4, 4)), ("tree_2x5_8", (2, 5, 8)),
                       ("tree_4x6_16", (4, 6, 16))):  # fmt: skip
    out[f"eagle_{name}"] = e(*budget)
    out[f"eagle_{name}_lookup4"] = e(*budget, lookup=4)
  return out | {"lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}}}


def nalpha_variants() -> dict:
  """EAGLE-1 and EAGLE-1 + training-time test after the same 300 steps, as 6-token chains
  (acceptance at each draft position: n-alpha)."""
  return {f"{name}_chain_6": eagle_variant(path, 1, 6, 6) for name, path in BUDGET_300.items()}


def continued_variants(run: str, lookup: bool = False, base: str = "eagle1") -> dict:
  """The drafter continued by ``:run`` (``tasks``: on task replies; ``volume``: on corpus rows it
  has not seen; ``requests``: on replies to assistant requests; ``broad``: ``requests``'
  drafter on replies to the broad set's requests too) next to the one it started from (``base``:
  ``eagle1`` is ``DRAFTER``, else that run's), each as a 4-chain and as an 8-node EAGLE-2 tree;
  ``lookup``: also as the 16-node tree with prompt lookup's 4-token branch (the best greedy
  budget of ``:sweep_lookup``)."""
  out = {}
  for name in (base, run):
    path = DRAFTER if name == "eagle1" else f"{WORKDIR}_{name}/draft_final"
    e = functools.partial(eagle_variant, path)
    out |= {f"{name}_chain_4": e(1, 4, 4), f"{name}_tree_2x5_8": e(2, 5, 8)}
    if lookup:
      out[f"{name}_tree_4x6_16_lookup4"] = e(4, 6, 16, lookup=4)
  return out


def broad_variants() -> dict:
  """``:broad``'s drafter next to ``:requests``' (where it started), as 8-node trees and as
  16-node trees with the lookup branch (the 4-chains left out)."""
  both = continued_variants("broad", lookup=True, base="requests")
  return {k: v for k, v in both.items() if "_chain_" not in k}


def requests_t1_variants() -> dict:
  """The 16-node trees with the lookup branch of ``continued_variants("requests", lookup=True)``
  (children sampled at temperature 1)."""
  both = continued_variants("requests", lookup=True)
  return {k: v for k, v in both.items() if k.endswith("_lookup4")}


def scale_t1_variants() -> dict:
  """The committed drafter, ``:rows_768`` and ``:rows_768_x3`` as 16-node trees with the lookup
  branch (children sampled at temperature 1, verified with their q)."""
  paths = {"eagle1": DRAFTER} | {r: f"{WORKDIR}_{r}/draft_final" for r in ("rows_768", LONG_RUN)}
  return {
    f"{r}_tree_4x6_16_lookup4": eagle_variant(p, 4, 6, 16, lookup=4) for r, p in paths.items()
  }


def ablation_variants(sweep: str) -> dict:
  """The sweep's drafters as 6-token chains (tau and acceptance by draft position)."""
  return {
    f"{name}_chain_6": eagle_variant(f"{WORKDIR}_{name}/draft_final", 1, 6, 6)
    for name in ABLATION_SWEEPS[sweep]
  }


def get_config(arg: str | None = None):
  c = demo.base()  # SmolLM2 target, held-out chat and code prompts, greedy, batch 1
  c.task = "train"
  c.workdir = WORKDIR
  c.drafter.name = "eagle"
  c.drafter.eagle.update(top_k=4, depth=5, total=16)
  c.benchmark.repeats = 1
  t = train_tiny.get_config()
  for section in ("data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]

  c.objective = objectives.default_config("eagle")
  o = c.objective.eagle
  o.feature_layers = ("final",)
  o.vocab_size = 8192
  o.copy_layer = -1
  o.noise = 0.2
  o.feature_weight = 1.0
  o.token_weight = 1.0

  c.data.sources = (GREEDY_DATA, *_FIXED)
  c.data.seq_len = 256
  c.data.max_examples = 3000
  c.data.eval_examples = 32
  c.data.seed = 0
  c.data.feature_cache = FEATURES  # the target's features of every row, computed once

  c.train.steps = 1000
  c.train.global_batch = 8
  c.train.log_every = 10
  c.train.eval_every = 100
  c.train.eval_batches = 2
  c.train.checkpoint_every = 50
  c.train.keep = 2

  c.optim.learning_rate = 2e-3
  c.optim.warmup_steps = 20
  c.optim.decay_steps = 980
  c.optim.weight_decay = 0.0

  if arg == "tasks":  # continue DRAFTER on the target's replies to task prompts (and 1.'s)
    c.workdir = f"{WORKDIR}_tasks"
    o.init_from = DRAFTER
    c.data.sources = (TASKS_DATA, GREEDY_DATA)
    c.data.max_examples = 2000  # 1000 task replies, the 768 greedy replies
    c.data.feature_cache = f"{FEATURES}_tasks"
    c.train.steps = 300
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = 280
  elif arg == "requests":  # continue DRAFTER on the target's replies to assistant requests
    c.workdir = f"{WORKDIR}_requests"
    o.init_from = DRAFTER
    c.data.sources = (REQUESTS_DATA, "python")
    c.data.max_examples = 768  # 384 replies to requests, 384 rows of Python
    c.data.feature_cache = f"{FEATURES}_requests"
    c.train.steps = 300
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = 280
  elif arg == "broad":  # continue :requests' drafter on both request sets' replies
    c.workdir = f"{WORKDIR}_broad"
    o.init_from = f"{WORKDIR}_requests/draft_final"
    c.data.sources = (BROAD_DATA, REQUESTS_DATA, "python")
    c.data.max_examples = 1152  # 384 replies to broad requests, 384 to basic ones, 384 Python
    c.data.feature_cache = f"{FEATURES}_broad"
    c.train.steps = 300
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = 280
  elif arg in ("more", "wide"):  # continue :broad's drafter 300 more steps on :broad's rows
    c.workdir = f"{WORKDIR}_{arg}"
    o.init_from = f"{WORKDIR}_broad/draft_final"
    c.data.sources = (BROAD_DATA, REQUESTS_DATA, "python")
    c.data.max_examples = 1152  # the same rows, and the same cached features
    c.data.feature_cache = f"{FEATURES}_broad"
    c.train.steps = 300
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = 280
    if arg == "wide":  # its MLP widened 3x (new units start silent: eagle.widen)
      o.ffn_dim = WIDE_FFN
  elif arg in SCALE_RUNS or arg == LONG_RUN:  # continue DRAFTER on n replies, half per set
    rows = "rows_768" if arg == LONG_RUN else arg
    c.workdir = f"{WORKDIR}_{arg}"
    o.init_from = DRAFTER
    c.data.sources = (BROAD_DATA, REQUESTS_DATA)
    c.data.eval_examples = 16  # evenly spaced: 8 per set
    c.data.max_examples = SCALE_RUNS[rows] + 16
    c.data.feature_cache = f"{FEATURES}_{rows}"
    c.train.steps = 900 if arg == LONG_RUN else 300
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = c.train.steps - 20
  elif arg == "volume":  # continue DRAFTER on more chat text: 1,600 chitchat rows, seed 1
    c.workdir = f"{WORKDIR}_volume"
    o.init_from = DRAFTER
    c.data.sources = ("chitchat",)
    c.data.seed = 1  # another document order: mostly conversations DRAFTER has not seen
    c.data.max_examples = 1600
    c.data.feature_cache = f"{FEATURES}_volume"
    c.train.steps = 400
    c.optim.learning_rate = 1e-3
    c.optim.decay_steps = 380
  elif arg in ("ttt_300", "eagle1_300"):  # equal budget: 300 steps of the same schedule
    c.train.steps = 300
    c.workdir = f"{WORKDIR}_{arg}"
    if arg == "ttt_300":  # EAGLE-3's training-time test on EAGLE-1's features
      o.rollout = 3
  elif arg in ABLATIONS:  # a complete 300-step run (its own cosine decay)
    a = dict(ABLATIONS[arg])
    c.data.sources = a.pop("sources")
    o.update(a)
    c.workdir = f"{WORKDIR}_{arg}"
    c.data.max_examples = 768  # all of the regenerated rows; as many corpus rows
    rows = "regen" if c.data.sources == _REGEN else "fixed"
    layers = "" if o.feature_layers == ("final",) else "_eagle3"
    c.data.feature_cache = f"{FEATURES}_{rows}{layers}"  # the input ablations share one
    c.train.steps = 300
    c.optim.decay_steps = 280
  elif arg == "eagle3":  # EAGLE-3: three layers fused, training-time test, token loss only
    c.workdir = WORKDIR_3
    c.data.feature_cache = FEATURES_3
    o.feature_layers = EAGLE3_LAYERS
    o.rollout = 3
  elif arg in ("sweep_b1", "sweep_b4", "sweep_t1", "sweep_nalpha", "sweep_tasks",
               "sweep_volume", "sweep_requests", "sweep_requests_t1", "sweep_lookup",
               "sweep_broad", "sweep_scale_t1", *ABLATION_SWEEPS):  # fmt: skip
    c.task = "sweep"
    c.drafter.eagle.path = DRAFTER
    c.output_dir = f"{RESULTS}/{arg}"
    c.prompts = training_free.CATEGORIES["chat"]
    c.max_new_tokens = 64
    c.max_len = 384
    c.sweep = sweep.default_config()
    c.sweep.batch_sizes = (4,) if arg == "sweep_b4" else (1,)
    if arg in ("sweep_t1", "sweep_requests_t1", "sweep_scale_t1"):  # sampled, verified with q
      c.temperature = 1.0
    if arg == "sweep_lookup":  # greedy, then temperature 1, in one process
      c.sweep.temperatures = (0.0, 1.0)
    c.sweep.categories = training_free.CATEGORIES
    if arg == "sweep_requests":
      c.sweep.categories = {**training_free.CATEGORIES, "chat_new": CHAT_NEW}
    if arg in ("sweep_requests_t1", "sweep_scale_t1"):  # the chat prompts only
      c.sweep.categories = {"chat": training_free.CATEGORIES["chat"], "chat_new": CHAT_NEW}
    if arg == "sweep_broad":  # both chat sets, and code (the Python rows' share fell)
      c.sweep.categories = {"chat": training_free.CATEGORIES["chat"], "chat_new": CHAT_NEW,
                            "code": training_free.CATEGORIES["code"]}  # fmt: skip
    c.sweep.verify_sizes = ()
    if arg in ABLATION_SWEEPS:
      c.sweep.variants = ablation_variants(arg)
    else:
      pick = {"sweep_nalpha": nalpha_variants, "sweep_t1": t1_variants,
              "sweep_lookup": lookup_variants,
              "sweep_tasks": functools.partial(continued_variants, "tasks"),
              "sweep_volume": functools.partial(continued_variants, "volume"),
              "sweep_requests": functools.partial(continued_variants, "requests",
                                                  lookup=True),
              "sweep_requests_t1": requests_t1_variants,
              "sweep_scale_t1": scale_t1_variants,
              "sweep_broad": broad_variants}  # fmt: skip
      c.sweep.variants = pick.get(arg, variants)()
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of eagle_smollm2/config.py; choose tasks, volume, requests, broad, "
      f"more, wide, {', '.join(SCALE_RUNS)}, {LONG_RUN}, eagle1_300, ttt_300, eagle3, "
      f"{', '.join(ABLATIONS)}, sweep_b1, sweep_b4, sweep_t1, sweep_nalpha, sweep_tasks, "
      "sweep_volume, sweep_requests, sweep_requests_t1, sweep_broad, sweep_lookup, sweep_scale_t1, "
      f"{', '.join(ABLATION_SWEEPS)}."
    )
  return c


def _train_rows(record: dict) -> list[dict]:
  """Teacher-forced acceptance (top-1 of the draft vs the target) per rollout step, train and
  held out, from a run's train.json."""
  last = record["last"][-1] if record["last"] else {}
  ev = record["eval"][-1] if record["eval"] else {}
  rows = []
  for j in range(1, record["config"]["objective"]["eagle"]["rollout"] + 1):
    s = "" if j == 1 else f"_{j}"
    rows.append({
      "draft step": j,
      "train_top1": last.get(f"top1{s}"),
      "held_out_top1": ev.get(f"eval/top1{s}"),
      "held_out_token_xent": ev.get(f"eval/token{s}"),
      "held_out_feature_l1": ev.get(f"eval/feature{s}"),
    })  # fmt: skip
  return rows


def report(results_dir):
  """The README's results block: training, teacher-forced acceptance, the sweeps."""
  import json

  out = []
  if figure(results_dir):
    out += ["![tau per category and acceptance by draft position](results/figure.png)", ""]
  continued = ("tasks", "volume", "requests", "broad", "more", "wide", *SCALE_RUNS, LONG_RUN)
  for run in ("eagle1", *continued, "ttt_300"):
    path = results_dir / run / "train.json"
    if not path.exists():
      continue
    record = json.loads(path.read_text())
    o = record["config"]["objective"]["eagle"]
    last = record["last"][-1] if record["last"] else {}
    out += [
      f"**{run}** (features {o['feature_layers']}, rollout {o['rollout']}): "
      f"{record['train_s'] / 60:.1f} min, {last.get('step')} steps of "
      f"{record['config']['train']['global_batch']} x {record['config']['data']['seq_len']} "
      "tokens.",
      "",
    ]
    rows = _train_rows(record)
    out += [results.markdown_table(rows, tuple(rows[0])), ""]
  out += _sweeps(results_dir) + _hit_rates(results_dir) + _replay(results_dir) + _fit(results_dir)
  out += _scale(results_dir)
  return "\n".join(out + _ablation(results_dir))


def _fit(results_dir) -> list[str]:
  """``fit.py``'s table: greedy τ replayed on rows trained on, unseen rows of the same request
  sets, and the held-out prompts."""
  import json

  path = results_dir / "fit.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  return [
    "## Trained rows, unseen rows of the same kind, new prompts (`fit.py`)",
    "",
    f"Greedy τ replayed offline on {record['rows_per_split']} replies per request set and split "
    f"(their first {record['new_tokens']} tokens): `*_trained` rows every run here trained on, "
    "`*_unseen` replies to requests of the same set that no run read; then the held-out "
    "prompts' AR text.",
    "",
    results.markdown_table(record["table"], tuple(record["table"][0])),
    "",
  ]


def _scale(results_dir) -> list[str]:
  """``scale.py``'s table and figure: greedy τ against the number of distinct replies the
  drafter was continued on."""
  import json

  path = results_dir / "scale.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  n = record["texts"]
  scale_figure(results_dir, record)
  return [
    "## τ against the number of distinct replies trained on (`scale.py`)",
    "",
    "![greedy tau against the number of request replies](results/scale.png)",
    "",
    "The committed drafter (`eagle1`, no request replies) and `:rows_<n>`: it continued 300 "
    "steps on n replies to the two request sets (nested draws). Greedy τ replayed offline "
    f"(`{record['budget']}`) on replies per request set that every `:rows_<n>` run trained on "
    f"(`*_trained`, {n['broad_trained']} and {n['basic_trained']}: the smallest run's rows "
    f"that no run held out) and that none read (`*_unseen`, {n['broad_unseen']} and "
    f"{n['basic_unseen']}), each cut to its first {record['new_tokens']} tokens, and on the "
    f"held-out prompts' AR text. `{LONG_RUN}` read the 768 replies for 900 steps (one cosine) "
    "instead of 300.",
    "",
    results.markdown_table(record["table"], tuple(record["table"][0])),
    "",
  ] + _scale_wide(record)


def _scale_wide(record: dict) -> list[str]:
  """The most-data runs replayed as a wider tree (none in a scale.json written before it)."""
  if "wide" not in record:
    return []
  ((name, budget),) = record["wide_budget"].items()
  return [
    f"The same two runs as `{name}` (top_k, depth, total, lookup = {tuple(budget)}):",
    "",
    results.markdown_table(record["wide"], tuple(record["wide"][0])),
    "",
  ]


def scale_figure(results_dir, record: dict) -> None:
  """results/scale.png: τ per kind of text against n (log axis); the n = 0 drafter dashed."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  table = record["table"]
  base = next(r for r in table if r["replies"] == 0)
  runs = [r for r in table if r["replies"] > 0 and r["run"] != LONG_RUN]
  longer = [r for r in table if r["run"] == LONG_RUN]
  n = [r["replies"] for r in runs]
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, kind in enumerate(k for k in table[0] if k not in ("run", "replies", "steps")):
    ax.plot(n, [r[kind] for r in runs], "o-", label=kind, color=f"C{i}")
    ax.axhline(base[kind], ls="--", lw=0.8, color=f"C{i}")
    for r in longer:
      ax.plot([r["replies"]], [r[kind]], "*", ms=10, color=f"C{i}")
  for r in longer:
    ax.plot([], [], "*", ms=10, color="grey", label=f"{r['run']}: {r['steps']} steps")
  ax.set_xscale("log")
  ax.set_xticks(n, [str(x) for x in n])
  ax.minorticks_off()
  ax.set(xlabel="distinct request replies trained on (dashed: none)", ylabel="greedy tau")
  ax.set_title(f"EAGLE continued 300 steps on n replies ({record['budget']})", fontsize=9)
  ax.legend(fontsize=7)
  results.save_figure(fig, results_dir / "scale.png")


def _replay(results_dir) -> list[str]:
  """``replay.py``'s tables: the draft vocabulary's coverage and τ on the full head; τ of wide
  trees."""
  import json

  path = results_dir / "replay.json"
  if not path.exists():
    return []
  vocab, trees = (json.loads(path.read_text())[k] for k in ("draft_vocab", "tree_budget"))
  return [
    "## Offline replays: the draft vocabulary and wide trees (`replay.py`)",
    "",
    f"Share of the target's greedy tokens inside the drafter's {vocab['size']:,}-token "
    "vocabulary, and greedy τ replayed offline (4-chain, 8- and 16-node trees) with that head "
    "(`saved`) and with the target's whole head (`full`), the same trained layer.",
    "",
    results.markdown_table(vocab["rows"], tuple(vocab["rows"][0])),
    "",
    "Greedy τ of EAGLE-2 trees up to 128 nodes (budgets (top_k, depth, total): "
    f"{', '.join(str(tuple(b)) for b in trees['budgets'])}), without and with prompt lookup's "
    "4-token branch.",
    "",
    results.markdown_table(trees["rows"], tuple(trees["rows"][0])),
    "",
  ]


def _hit_rates(results_dir) -> list[str]:
  """``hit_rates.py``'s table: the first draft token's teacher-forced hit rate by text."""
  import json

  path = results_dir / "hit_rates.json"
  if not path.exists():
    return []
  rows = json.loads(path.read_text())["rows"]
  return (
    [
      "## First-token hit rate by text (teacher-forced, `hit_rates.py`)",
      "",
      "Share of positions where the first draft token is the target's greedy token: at every "
      "position (`all`) and at a 4-chain's step starts (`step_starts`, its 1-alpha).",
      "",
      results.markdown_table(rows, ("drafter", "text", "rows", "all", "step_starts")),
      "",
    ]
    + _hit_rates_by_confidence([r for r in rows if "share_0" in r])
    + _hit_rates_by_copy([r for r in rows if "share_copy" in r])
  )


CONFIDENCE_BUCKETS = {
  "0": "p < 0.5",
  "0.5": "0.5 <= p < 0.8",
  "0.8": "0.8 <= p < 0.95",
  "0.95": "0.95 <= p",
}  # fmt: skip  (hit_rates.BUCKETS' keys -> headings)


def _hit_rates_by_confidence(rows: list[dict]) -> list[str]:
  """The same hit rates split by the target's confidence at each position."""
  if not rows:
    return []
  table = []
  for r in rows:
    cells = {"drafter": r["drafter"], "text": r["text"]}
    for key, heading in CONFIDENCE_BUCKETS.items():
      hit = r[f"hit_{key}"]
      cells[heading] = f"{r[f'share_{key}']:.2f} / " + ("—" if hit is None else f"{hit:.2f}")
    table.append(cells)
  return [
    "By the target's confidence p (its probability of its greedy token there): the share of "
    "positions / the first draft token's hit rate among them.",
    "",
    results.markdown_table(table, ("drafter", "text", *CONFIDENCE_BUCKETS.values())),
    "",
  ]


def _hit_rates_by_copy(rows: list[dict]) -> list[str]:
  """The same hit rates at positions that copy earlier text (a 2-gram prompt lookup is right)
  and elsewhere."""
  if not rows:
    return []
  return [
    "At copyable positions (prompt lookup's 2-gram match proposes the right token: text "
    "repeated from the prompt or the reply) and elsewhere: their share, and the first draft "
    "token's hit rate at each.",
    "",
    results.markdown_table(rows, ("drafter", "text", "share_copy", "hit_copy", "hit_no_copy")),
    "",
  ]


def _sweeps(results_dir) -> list[str]:
  import json

  out = []
  titles = {
    "sweep_b1": "Greedy, batch 1",
    "sweep_b4": "Greedy, batch 4",
    "sweep_t1": "Temperature 1, batch 1 (sampled children, verified with their q)",
    "sweep_nalpha": "Equal budget (300 steps): EAGLE-1 vs EAGLE-1 + training-time test",
    "sweep_tasks": "Continued for 300 steps on the target's replies to task prompts",
    "sweep_volume": "Continued for 400 steps on 1,600 more chitchat rows (more text)",
    "sweep_requests": "Continued for 300 steps on the target's replies to assistant requests "
    "(five categories: chat_new is six more chat prompts)",
    "sweep_requests_t1": "The same two drafters at temperature 1, chat prompts (sampled "
    "children, verified with their q)",
    "sweep_broad": "Continued for 300 more steps on replies to the broad request set too "
    "(from the requests-continued drafter)",
    "sweep_lookup": "With prompt lookup's 4-token guess as one more branch, temperature 0 and 1",
    "sweep_scale_t1": "The most-data drafters (768 request replies; 300 and 900 steps) at "
    "temperature 1, chat prompts (sampled children, verified with their q)",
  }
  for arg, title in titles.items():
    path = results_dir / arg / "sweep.json"
    if path.exists():
      record = json.loads(path.read_text())
      out += [f"## {title}", "", sweep.markdown(record)]
      if arg in ("sweep_nalpha", "sweep_tasks", "sweep_volume", "sweep_requests", "sweep_broad"):
        out += _nalpha_table(record["runs"])
  return out


def _ablation(results_dir) -> list[str]:
  """The ablations: each run's data, inputs, CPU time and held-out teacher-forced acceptance
  (its train.json), then greedy decoding as 6-token chains (the ``ABLATION_SWEEPS``)."""
  import json

  rows = []
  for name in ABLATIONS:
    path = results_dir / name / "train.json"
    if path.exists():
      record = json.loads(path.read_text())
      ev = record["eval"][-1] if record["eval"] else {}
      rows.append({
        "run": name,
        "data": "+".join(s.rsplit("/", 1)[-1] for s in record["config"]["data"]["sources"]),
        "inputs": record["config"]["objective"]["eagle"]["inputs"],
        "features": ",".join(map(str, record["config"]["objective"]["eagle"]["feature_layers"])),
        "rollout": record["config"]["objective"]["eagle"]["rollout"],
        "layer_init": _layer_init(record["config"]["objective"]["eagle"]["copy_layer"]),
        "train_min": record["train_s"] / 60,
        "held_out_top1": ev.get("eval/top1"),
        "held_out_token_xent": ev.get("eval/token"),
      })  # fmt: skip
  sweeps = {s: results_dir / s / "sweep.json" for s in ABLATION_SWEEPS}
  sweeps = {s: json.loads(p.read_text()) for s, p in sweeps.items() if p.exists()}
  if not rows and not sweeps:
    return []
  out = ["## Ablations at equal budget (300 steps): inputs, data, EAGLE-3, layer init", ""]
  if rows:
    out += [results.markdown_table(rows, tuple(rows[0])), ""]
  if sweeps and ablation_figure(results_dir, sweeps):
    out += ["![ablations: tau per category and n-alpha](results/ablation.png)", ""]
  titles = {
    "sweep_inputs": "Inputs: feature + shifted token vs token only vs feature only",
    "sweep_data": "Regenerated vs fixed data",
    "sweep_eagle3": "EAGLE-3 vs EAGLE-1",
    "sweep_init": "The layer started from the target's last layer vs random (fixed data)",
  }
  for s, record in sweeps.items():
    out += [f"### {titles[s]}", "", sweep.markdown(record)] + _nalpha_table(record["runs"])
  return out


def _layer_init(copy_layer: int) -> str:
  return "random" if copy_layer < 0 else f"target layer {copy_layer}"


def _chains(runs: list[dict]) -> list[str]:
  return [v for v in dict.fromkeys(r["variant"] for r in runs) if v != "ar"]


# n-alpha at a position fewer steps reached than this is not plotted (a ratio of few tries).
MIN_TRIES = 20


def _nalpha(runs: list[dict], variant: str) -> tuple[list, list[int]]:
  """Acceptance at each draft position pooled over the prompt categories (None where no step
  reached that position), and how many steps reached each position."""
  sel = [r for r in runs if r["variant"] == variant]
  n = len(sel[0]["alpha"])
  tries = [sum(r["position_attempts"][i] for r in sel) for i in range(n)]
  kept = [sum(r["alpha"][i] * r["position_attempts"][i] for r in sel) for i in range(n)]
  return [k / t if t else None for k, t in zip(kept, tries, strict=True)], tries


def _nalpha_table(runs: list[dict]) -> list[str]:
  """Acceptance at each draft position, pooled over the prompt categories, with the number of
  steps that reached it."""

  rows = []
  for v in _chains(runs):
    alphas, tries = _nalpha(runs, v)
    cells = ["—" if a is None else f"{a:.3g} ({t})" for a, t in zip(alphas, tries, strict=True)]
    rows.append({"variant": v} | {f"{i + 1}-alpha": c for i, c in enumerate(cells)})
  return ["Acceptance by draft position (n-alpha), all categories, with the number of steps that "
          "reached the position in brackets (—: none did):",
          "", results.markdown_table(rows, tuple(rows[0])), ""]  # fmt: skip


def _tau_bars(ax, runs: list[dict], title: str) -> None:
  import numpy as np

  categories = sorted({r["category"] for r in runs})
  variants = _chains(runs)
  width = 0.8 / len(variants)
  for j, v in enumerate(variants):
    tau = [next(r["tau"] for r in runs if r["category"] == c and r["variant"] == v)
           for c in categories]  # fmt: skip
    ax.bar(np.arange(len(categories)) + j * width, tau, width, label=v)
  ax.axhline(1.0, color="gray", lw=0.8)
  ticks = np.arange(len(categories)) + 0.4 - width / 2
  ax.set(ylabel="tau (tokens per target call)", xticks=ticks)
  ax.set_xticklabels(categories)
  ax.set_title(title)
  ax.legend(fontsize=7)


def _nalpha_lines(ax, chains: list[tuple[list, str]]) -> None:
  for runs, v in chains:
    a, tries = _nalpha(runs, v)
    seen = [i for i, t in enumerate(tries) if t >= MIN_TRIES]
    ax.plot([i + 1 for i in seen], [a[i] for i in seen], "-o", label=f"{v} (all categories)")
  ax.set(xlabel="draft position n", ylabel="acceptance n-alpha", ylim=(0, 1), xticks=range(1, 7))
  ax.set_title(f"EAGLE chain: acceptance by draft position (reached >= {MIN_TRIES} times)")
  ax.legend(fontsize=7)


def figure(results_dir) -> bool:
  """results/figure.png: tau per prompt category per variant (batch-1 greedy sweep), and the
  chain's acceptance at each draft position (n-alpha). False when the sweep is not there."""
  import json

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  sweep_json = results_dir / "sweep_b1" / "sweep.json"
  if not sweep_json.exists():
    return False
  runs = json.loads(sweep_json.read_text())["runs"]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  _tau_bars(left, runs, "Greedy tau per prompt category, batch 1")
  chains = [(runs, v) for v in _chains(runs) if v.startswith("eagle_chain")]
  nalpha_json = results_dir / "sweep_nalpha" / "sweep.json"
  if nalpha_json.exists():  # the equal-budget pair: EAGLE-1 vs the training-time test
    other = json.loads(nalpha_json.read_text())["runs"]
    chains += [(other, v) for v in _chains(other)]
  _nalpha_lines(right, chains)
  results.save_figure(fig, results_dir / "figure.png")
  return True


def ablation_figure(results_dir, sweeps: dict) -> bool:
  """results/ablation.png: the ablations' tau per category and n-alpha (each drafter once)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  runs, seen = [], set()
  for record in sweeps.values():  # regen_300 is in every sweep: keep its first
    new = [r for r in record["runs"] if r["variant"] != "ar" and r["variant"] not in seen]
    seen |= {r["variant"] for r in new}
    runs += new
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  _tau_bars(left, runs, "Ablations (300 steps): greedy tau per category, 6-token chains")
  _nalpha_lines(right, [(runs, v) for v in _chains(runs)])
  results.save_figure(fig, results_dir / "ablation.png")
  return True
