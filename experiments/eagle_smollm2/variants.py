"""eagle_smollm2's paths, runs and sweeps: the tables ``config.py``'s ``get_config`` reads (each
name also read as ``config.NAME``). What each run and sweep is for: config.py's docstring."""

import functools

from experiments import held_out

WORKDIR = "results/eagle_smollm2"  # checkpoints and exports (not in git)
HERE = "experiments/eagle_smollm2"
DRAFTER = f"{HERE}/drafter"  # committed copy of WORKDIR/draft_final
# :requests' drafter (1.'s continued on replies to assistant requests), promoted by
# :promote_requests: higher held-out chat τ than DRAFTER; README's EAGLE commands decode it.
REQUESTS_DRAFTER = f"{HERE}/drafter_requests"
GREEDY_DATA = "data/self_distill/smollm2_greedy"  # configs/self_distill_smollm2.py:greedy
TASKS_DATA = "data/self_distill/smollm2_tasks"  # configs/self_distill_smollm2.py:tasks
REQUESTS_DATA = "data/self_distill/smollm2_requests"  # configs/self_distill_smollm2.py:requests
BROAD_DATA = "data/self_distill/smollm2_requests_broad"  # ...:requests_broad (other templates)
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
REGEN = (GREEDY_DATA,)
FIXED = ("chitchat", "python")
LAST_LAYER = 29  # of SmolLM2's 30
ABLATIONS = {
  "regen_300": {"sources": REGEN},
  "feature_only_300": {"sources": REGEN, "inputs": "feature"},
  "token_only_300": {"sources": REGEN, "inputs": "token"},
  "fixed_300": {"sources": FIXED},
  # specjax's EAGLE-3 (as trained for the committed results; the default is now the published one)
  "eagle3_300": {
    "sources": REGEN,
    "feature_layers": EAGLE3_LAYERS,
    "rollout": 3,
    "architecture": "specjax",
  },
  "copy_fixed_300": {"sources": FIXED, "copy_layer": LAST_LAYER},
  # The published EAGLE-3 (drafters/eagle/model.py) on eagle3_300's features, rollout and loss.
  "official_eagle3_300": {
    "sources": REGEN,
    "feature_layers": EAGLE3_LAYERS,
    "rollout": 3,
    "architecture": "eagle3",
  },
}
# Each comparison decodes its drafters (and its baseline: regen_300, or fixed_300 for the
# layer's initialisation) in one process.
ABLATION_SWEEPS = {
  "sweep_inputs": ("regen_300", "token_only_300", "feature_only_300"),
  "sweep_data": ("regen_300", "fixed_300"),
  "sweep_eagle3": ("regen_300", "eagle3_300"),
  "sweep_init": ("fixed_300", "copy_fixed_300"),
  # Alone, at T = 0 and 1: tau at T = 0 is deterministic, so it compares with sweep_eagle3's
  # drafters as they decoded there; the speedups are ratios to this job's own AR.
  "sweep_official_eagle3": ("official_eagle3_300",),
}
# A drafter the engines serve: the published EAGLE-3 (SafeAILab's and SGLang's architecture)
# on :requests' rows and step budget. ``:eagle3_serve`` is 1.'s rows and schedule (1000 steps)
# with EAGLE-3's three layers and a 2-step training-time test (its deeper levels read the
# drafter's own output), ``:eagle3_requests`` continues it as :requests continued 1. (300
# steps); ``:promote_eagle3`` commits it as EAGLE3_DRAFTER. The target's features of these rows
# (layers 2, 14, 27 and the final one) are the ones experiments/block_smollm2 caches.
EAGLE3_DRAFTER = f"{HERE}/drafter_eagle3"
SERVE = {"architecture": "eagle3", "feature_layers": EAGLE3_LAYERS, "rollout": 2}
SERVE_FEATURES = "data/features/block_smollm2"


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


def eagle3_serve_variants() -> dict:
  """The committed :requests drafter (specjax's EAGLE architecture) and the published EAGLE-3
  of :promote_eagle3, each as an 8-node tree and as the 16-node tree with the lookup branch
  (README's budget)."""
  out = {}
  for name, path in (("requests", REQUESTS_DRAFTER), ("eagle3", EAGLE3_DRAFTER)):
    e = functools.partial(eagle_variant, path)
    out |= {f"{name}_tree_2x5_8": e(2, 5, 8), f"{name}_tree_4x6_16_lookup4": e(4, 6, 16, lookup=4)}
  return out


def ablation_variants(sweep: str) -> dict:
  """The sweep's drafters as 6-token chains (tau and acceptance by draft position)."""
  return {
    f"{name}_chain_6": eagle_variant(f"{WORKDIR}_{name}/draft_final", 1, 6, 6)
    for name in ABLATION_SWEEPS[sweep]
  }


# Runs that continue a trained drafter (``init_from``) on other rows, at learning rate 1e-3
# decaying over all but the first 20 steps. name: the drafter, the data, how many rows, the
# feature cache (a suffix of FEATURES, or a path), steps, and any other data / objective.eagle
# fields.
def _continued(init_from, sources, rows, cache, steps=300, data=None, objective=None) -> dict:
  return {"init_from": init_from, "sources": sources, "rows": rows, "cache": cache,
          "steps": steps, "data": data or {}, "objective": objective or {}}  # fmt: skip


_REQUESTS, _BROAD = "eagle_smollm2:requests", "eagle_smollm2:broad"  # their draft_final
_BOTH_SETS = (BROAD_DATA, REQUESTS_DATA, "python")  # 384 replies to each request set, 384 Python
CONTINUED = {
  "tasks": _continued(DRAFTER, (TASKS_DATA, GREEDY_DATA), 2000, "tasks"),  # task replies + 1.'s
  "requests": _continued(DRAFTER, (REQUESTS_DATA, "python"), 768, "requests"),
  "eagle3_requests": _continued(
    "eagle_smollm2:eagle3_serve",
    (REQUESTS_DATA, "python"),
    768,
    f"{SERVE_FEATURES}_requests",
    objective=SERVE,
  ),  # fmt: skip
  "broad": _continued(_REQUESTS, _BOTH_SETS, 1152, "broad"),
  "more": _continued(_BROAD, _BOTH_SETS, 1152, "broad"),  # the same rows, 300 more steps
  "wide": _continued(_BROAD, _BOTH_SETS, 1152, "broad", objective={"ffn_dim": WIDE_FFN}),
  "volume": _continued(DRAFTER, ("chitchat",), 1600, "volume", 400, data={"seed": 1}),
  **{  # n replies, half per request set; 16 held out (8 per set)
    run: _continued(DRAFTER, (BROAD_DATA, REQUESTS_DATA), n + 16, run, data={"eval_examples": 16})
    for run, n in SCALE_RUNS.items()
  },
  LONG_RUN: _continued(
    DRAFTER,
    (BROAD_DATA, REQUESTS_DATA),
    SCALE_RUNS["rows_768"] + 16,
    "rows_768",
    900,
    data={"eval_examples": 16},
  ),  # fmt: skip
}

# Decoding sweeps on the held-out categories (64 new tokens, batch 1 unless named): the
# variants, the categories, and the temperature (or temperatures, in one process).
_ALL = held_out.CATEGORIES
_CHATS = {"chat": _ALL["chat"], "chat_new": held_out.CHAT_NEW}
SWEEPS = {
  "sweep_b1": (variants, _ALL, {}),
  "sweep_b4": (variants, _ALL, {"batch": 4}),
  "sweep_t1": (t1_variants, _ALL, {"temperature": 1.0}),  # sampled, verified with q
  "sweep_nalpha": (nalpha_variants, _ALL, {}),
  "sweep_tasks": (functools.partial(continued_variants, "tasks"), _ALL, {}),
  "sweep_volume": (functools.partial(continued_variants, "volume"), _ALL, {}),
  "sweep_requests": (
    functools.partial(continued_variants, "requests", lookup=True),
    {**_ALL, "chat_new": held_out.CHAT_NEW},
    {},
  ),  # fmt: skip
  "sweep_requests_t1": (requests_t1_variants, _CHATS, {"temperature": 1.0}),
  "sweep_lookup": (lookup_variants, _ALL, {"temperatures": (0.0, 1.0)}),
  "sweep_broad": (broad_variants, {**_CHATS, "code": _ALL["code"]}, {}),  # the Python share fell
  "sweep_scale_t1": (scale_t1_variants, _CHATS, {"temperature": 1.0}),
  **{name: (functools.partial(ablation_variants, name), _ALL, {}) for name in ABLATION_SWEEPS},
  "sweep_eagle3_serve": (eagle3_serve_variants, {**_ALL, "chat_new": held_out.CHAT_NEW}, {}),
  "sweep_official_eagle3": (  # greedy and sampled in one process
    functools.partial(ablation_variants, "sweep_official_eagle3"),
    _ALL,
    {"temperatures": (0.0, 1.0)},
  ),
}
