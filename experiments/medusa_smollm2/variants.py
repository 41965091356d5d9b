"""medusa_smollm2's paths, heads and sweeps: the tables ``config.py``'s ``get_config`` reads
(each name also read as ``config.NAME``). What each run and sweep is for: config.py's
docstring."""

import json
from pathlib import Path

from experiments import held_out
from experiments.eagle_smollm2 import config as eagle
from specjax.trees import Tree

WORKDIR = "results/medusa_smollm2"  # checkpoints and exports (not in git)
WORKDIR_SD = "results/medusa_smollm2_sd"
HERE = "experiments/medusa_smollm2"
HEADS_CORPORA = f"{HERE}/heads_corpora"  # committed copy of WORKDIR/draft_final
HEADS = f"{HERE}/heads"  # committed copy of WORKDIR_SD/draft_final: the heads decoded with
GREEDY_DATA = "data/self_distill/smollm2_greedy"  # configs/self_distill_smollm2.py:greedy
REQUESTS_DATA = eagle.REQUESTS_DATA  # configs/self_distill_smollm2.py:requests
WORKDIR_REQUESTS = "results/medusa_smollm2_requests"
HEADS_REQUESTS = f"{HERE}/heads_requests"  # committed copy of WORKDIR_REQUESTS/draft_final
RESULTS = f"{HERE}/results"
CHAIN = ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
PROMOTE = {  # :name -> (the run's workdir, the committed path its heads are decoded from)
  "promote_corpora": (WORKDIR, HEADS_CORPORA),
  "promote": (WORKDIR_SD, HEADS),
  "promote_requests": (WORKDIR_REQUESTS, HEADS_REQUESTS),
}
LOOKUP = 4  # :sweep_lookup's branch: prompt lookup's 4-token guess beside the heads' tree


def variants() -> dict:
  """Sweep variants (config.drafter overrides) at equal node budgets: Medusa as a 4-node chain
  and as the data-built 4-node tree (saved with the heads), a dense 16-node tree (4 x 3) and the
  data-built 16-node tree (from results/medusa_tree.json), and prompt lookup for reference."""
  fixed = {"path": HEADS, "saved_tree": False}
  out = {
    "medusa_chain_4": {"name": "medusa", "medusa": fixed | {"tree_paths": CHAIN}},
    "medusa_sparse_4": {"name": "medusa", "medusa": {"path": HEADS}},
    "medusa_dense_16": {"name": "medusa", "medusa": fixed | {"tree_spec": (4, 3)}},
  }
  paths = grown_paths(16)
  if paths:
    out["medusa_sparse_16"] = {"name": "medusa", "medusa": fixed | {"tree_paths": paths}}
  return out | {"lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}}}


def grown_paths(nodes: int) -> tuple | None:
  """The path list of the ``nodes``-node tree step 3 grew from held-out accuracy
  (results/medusa_tree.json), or None before step 3 ran."""
  grown = Path(RESULTS) / "medusa_tree.json"
  if not grown.exists():
    return None
  rows = json.loads(grown.read_text())["budgets"]
  parents = next(r["parents"] for r in rows if r["nodes"] == nodes)
  return tuple(tuple(p) for p in Tree(tuple(parents)).choices())


def requests_variants() -> dict:
  """``HEADS`` and the same heads continued by ``:requests`` (``HEADS_REQUESTS``), each on the
  same two trees step 3 grew for ``HEADS``: 4 nodes (the chosen budget) and 16 nodes."""
  out = {}
  for name, path in (("medusa", HEADS), ("requests", HEADS_REQUESTS)):
    for nodes in (4, 16):
      tree = {"path": path, "saved_tree": False, "tree_paths": grown_paths(nodes)}
      out[f"{name}_sparse_{nodes}"] = {"name": "medusa", "medusa": tree}
  return out


def lookup_variants() -> dict:
  """``HEADS_REQUESTS`` on step 3's 4- and 16-node trees, each without and with a lookup branch
  (``drafter.medusa.lookup``), and prompt lookup alone for reference."""
  out = {}
  for key, v in requests_variants().items():
    if key.startswith("requests"):
      out[key] = v
      out[f"{key}_lookup{LOOKUP}"] = {"name": "medusa", "medusa": v["medusa"] | {"lookup": LOOKUP}}
  return out | {"lookup_k4": variants()["lookup_k4"]}


TYPICAL_EPSILONS = (0.01, 0.03, 0.09, 0.3)  # Medusa's default is 0.09 (with delta 0.3)


def typical_variants() -> dict:
  """``:typical``'s variants on the data-built 16-node tree: lossless with children sampled from
  the heads (verified with their q) and with the heads' top-k candidates, and Medusa's typical
  acceptance (lossy; top-k candidates as in Medusa, delta = sqrt(epsilon): Medusa's 0.09/0.3
  pairing) for each epsilon."""
  tree = variants()["medusa_sparse_16"]["medusa"]
  out = {
    "lossless_sampled": {"name": "medusa", "medusa": tree | {"candidates": "sampled"}},
    "lossless_top_k": {"name": "medusa", "medusa": tree | {"candidates": "top_k"}},
  }
  for eps in TYPICAL_EPSILONS:
    out[f"typical_{eps:g}".replace(".", "_")] = out["lossless_top_k"] | {
      "verifier": "typical",
      "typical": {"epsilon": eps, "delta": round(eps**0.5, 4)},
    }
  return out


def t1_variants() -> dict:
  """``:sweep_t1``'s: ``variants()`` without the dense tree (the slowest greedy)."""
  return {k: v for k, v in variants().items() if k != "medusa_dense_16"}


# task=sweep variants of get_config (64 new tokens): the variants, the prompt categories, and
# the batch sizes and temperature where not batch 1 at the base config's temperature.
_FOUR = held_out.CATEGORIES
_FIVE = {**_FOUR, "chat_new": held_out.CHAT_NEW}  # the six more chat prompts too
SWEEPS = {
  "sweep_b1": (variants, _FOUR, {}),
  "sweep_b4": (variants, _FOUR, {"batch_sizes": (4,)}),
  # Medusa's lossy rule against lossless sampling at T = 0.7, the outputs' log-likelihood too
  "typical": (typical_variants, _FOUR, {"temperature": 0.7, "log_likelihood": True}),
  "sweep_t1": (t1_variants, _FOUR, {"batch_sizes": (1, 4), "temperature": 1.0}),  # lossless
  "sweep_requests": (requests_variants, _FIVE, {}),
  "sweep_lookup": (lookup_variants, _FIVE, {}),
  # lossless: children sampled from the heads and verified with their q, the guesses one-hot
  "sweep_lookup_t1": (lookup_variants, _FIVE, {"temperature": 1.0}),
}
# Runs that continue trained heads: name -> their workdir, the heads they start from, the data
# sources and how many rows. :tree measures the heads on :self_distilled's held-out rows.
CONTINUED = {
  "self_distilled": (WORKDIR_SD, HEADS_CORPORA, (GREEDY_DATA, "chitchat"), 1536),  # 768 + 768
  "requests": (WORKDIR_REQUESTS, HEADS, (REQUESTS_DATA, "python"), 1024),  # 512 + 512
}
