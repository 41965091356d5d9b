"""Medusa heads for SmolLM2-135M-Instruct, trained on CPU, then decoded losslessly vs AR.

    bash scripts/install_models.sh smollm2 && bash scripts/install_corpora.sh all
    C=experiments/medusa_smollm2/config.py
    nice -n 10 python -m specjax.run --config=$C                    # 1. train on corpora
    python -m specjax.run --config=$C:promote_corpora              #    -> heads_corpora
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:greedy
    nice -n 10 python -m specjax.run --config=$C:self_distilled     # 2. continue on greedy text
    python -m specjax.run --config=$C:promote                      #    -> heads
    python -m specjax.run --config=$C:tree                          # 3. grow the tree, save it
    python -m specjax.run --config=$C:sweep_b1                      # 4. decode vs AR
    python -m specjax.run --config=$C:sweep_b4                      #    batch 4
    python -m specjax.run --config=$C:typical                       # 5. typical vs lossless
    python -m specjax.run --config=$C:sweep_t1                      # 6. temperature 1, batch 1, 4
    nice -n 10 python -m specjax.run --config=configs/self_distill_smollm2.py:requests
    nice -n 10 python -m specjax.run --config=$C:requests           # 7. continue on requests
    python -m specjax.run --config=$C:promote_requests             #    -> heads_requests
    R=experiments/medusa_smollm2/results/requests && mkdir -p $R
    cp results/medusa_smollm2_requests/train.json results/medusa_smollm2_requests/metrics.jsonl $R/
    python -m specjax.run --config=$C:sweep_requests                #    decode both heads
    python -m specjax.report experiments/medusa_smollm2

1. Medusa-1 (target frozen): four heads, one residual layer each, on the target's shared
   (frozen) head restricted to a draft vocabulary of the 4096 most frequent training tokens.
   Labels are the target's own teacher-forced predictions over chitchat conversations (chat
   template) and Python standard-library files: one target forward per batch gives every head
   its soft labels. Writes results/medusa_smollm2/{metrics.jsonl, checkpoints/, draft_init/,
   draft_final/, train.json}; rerunning resumes from the newest checkpoint.
2. Continues those heads on the target's greedy replies to chat and code prompts (the text a
   temperature-0 decode produces) mixed with chitchat rows.
3. ``task=medusa_tree``: each head's rank-i accuracy on step 2's held-out rows (16 greedy
   replies, 16 chitchat rows) and this machine's verify cost choose the tree, saved into the
   heads' medusa.json (results/medusa_tree.json).
4. ``task=sweep``: the prompt categories of ``experiments/training_free`` (none in the training
   text), AR vs Medusa as a chain, a dense tree and the data-built tree, greedy, one process;
   tau, target calls per token, speedup, texts checked equal to AR's (results/sweep_b1/);
   ``:sweep_b4`` at batch 4.
5. ``:typical``: Medusa's typical acceptance for several epsilon against lossless sampling at
   temperature 0.7: tau, speedup and the target's log-likelihood of each output.
6. ``:sweep_t1``: step 4 at temperature 1, batch 1 and 4 (children sampled from the heads and
   verified with their q; prompt lookup's guesses verified as one-hot proposals).
7. ``:requests`` continues step 2's heads for 150 steps on the target's greedy replies to 512
   assistant requests made from templates (``distill.REQUEST_SETS["basic"]``) and 512 Python
   rows; ``:sweep_requests`` decodes both heads on step 3's 4- and 16-node trees, on the four
   categories and six more chat prompts (``eagle_smollm2``'s ``CHAT_NEW``).
8. ``:sweep_lookup``: ``:requests``' heads on the same trees, each also with prompt lookup's
   4-token guess as one more branch from the root (``drafter.medusa.lookup``), same prompts;
   ``:sweep_lookup_t1`` the same at temperature 1.
9. ``replay.py`` (a script): greedy τ of those heads on every grown tree up to 64 nodes, with
   and without the branch, replayed offline on step 8's AR text.
"""

import json
from pathlib import Path

from ml_collections import config_dict

from configs import demo, train_tiny
from experiments.eagle_smollm2 import config as eagle
from experiments.training_free import config as training_free
from specjax.tasks import promote, sweep
from specjax.train import objectives
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
# task=sweep variants of get_config
SWEEPS = (
  *("sweep_b1", "sweep_b4", "typical", "sweep_t1", "sweep_requests"),
  *("sweep_lookup", "sweep_lookup_t1"),
)
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


def get_config(arg: str | None = None):
  c = demo.base()  # SmolLM2 target, held-out chat and code prompts, greedy, batch 1
  c.task = "train"
  c.workdir = WORKDIR
  c.drafter.name = "medusa"
  c.drafter.medusa.tree_spec = (3, 2, 2, 1)
  c.benchmark.repeats = 1
  t = train_tiny.get_config()
  for section in ("data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]

  c.objective = objectives.default_config("medusa")
  o = c.objective.medusa
  o.num_heads = 4
  o.num_layers = 1
  o.vocab_size = 4096
  o.own_proj = False
  o.decay = 0.8

  c.data.sources = ("chitchat", "python")
  c.data.seq_len = 256
  c.data.max_examples = 3000
  c.data.eval_examples = 32
  c.data.seed = 0

  c.train.steps = 300
  c.train.global_batch = 8
  c.train.log_every = 5
  c.train.eval_every = 100
  c.train.eval_batches = 2
  c.train.checkpoint_every = 25
  c.train.keep = 2

  c.optim.learning_rate = 2e-3
  c.optim.warmup_steps = 20
  c.optim.decay_steps = 280
  c.optim.weight_decay = 0.0

  # task=medusa_tree (the :tree variant): the tree grown from held-out accuracy.
  c.medusa_tree = config_dict.ConfigDict()
  c.medusa_tree.budgets = (4, 8, 12, 16, 24, 32, 48, 64)  # node budgets tried
  c.medusa_tree.ranks = 8  # candidates per head measured
  c.medusa_tree.context = 128  # cached tokens when timing the verify forward

  if arg in ("self_distilled", "tree"):  # step 2's data; step 3 measures its held-out rows
    c.workdir = WORKDIR_SD
    c.objective.medusa.init_from = HEADS_CORPORA
    c.data.sources = (GREEDY_DATA, "chitchat")
    c.data.max_examples = 1536  # 768 self-distilled rows (all) + 768 chitchat rows
  if arg == "self_distilled":  # continue the corpus-trained heads on the target's greedy text
    c.train.steps = 150
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 10
    c.optim.decay_steps = 140
  elif arg == "requests":  # continue HEADS on the target's replies to assistant requests
    c.workdir = WORKDIR_REQUESTS
    c.objective.medusa.init_from = HEADS
    c.data.sources = (REQUESTS_DATA, "python")
    c.data.max_examples = 1024  # the 512 replies to requests, 512 rows of Python
    c.train.steps = 150
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 10
    c.optim.decay_steps = 140
  elif arg in PROMOTE:  # a trained run's heads to their committed path, with a manifest
    c.task = "promote"
    c.promote = promote.default_config()
    c.promote.run, c.promote.to = PROMOTE[arg]
  elif arg == "tree":
    c.task = "medusa_tree"
    c.output_dir = RESULTS
    c.drafter.medusa.path = HEADS
  elif arg == "benchmark":
    c.task = "benchmark"
    c.output_dir = f"{RESULTS}/benchmark"
    c.drafter.medusa.path = HEADS
  elif arg in SWEEPS:
    c.task = "sweep"
    c.output_dir = f"{RESULTS}/{arg}"
    c.prompts = training_free.CATEGORIES["chat"]
    c.max_new_tokens = 64
    c.max_len = 384
    c.sweep = sweep.default_config()
    c.sweep.batch_sizes = {"sweep_b4": (4,), "sweep_t1": (1, 4)}.get(arg, (1,))
    c.sweep.categories = training_free.CATEGORIES
    c.sweep.verify_sizes = ()
    c.sweep.variants = variants()
    if arg in ("sweep_requests", "sweep_lookup", "sweep_lookup_t1"):  # + CHAT_NEW
      c.sweep.categories = {**training_free.CATEGORIES, "chat_new": eagle.CHAT_NEW}
      c.sweep.variants = requests_variants() if arg == "sweep_requests" else lookup_variants()
    if arg == "sweep_lookup_t1":  # lossless: children sampled from the heads, guesses one-hot
      c.temperature = 1.0
    if arg == "sweep_t1":  # lossless; the dense tree (slowest greedy) is left out
      c.temperature = 1.0
      c.sweep.variants = {k: v for k, v in variants().items() if k != "medusa_dense_16"}
    if arg == "typical":  # Medusa's lossy rule against lossless sampling, at T = 0.7
      c.temperature = 0.7
      c.sweep.variants = typical_variants()
      c.sweep.log_likelihood = True
  elif arg:
    raise ValueError(
      f"unknown variant {arg!r} of medusa_smollm2/config.py; choose self_distilled, requests, "
      f"{', '.join(PROMOTE)}, tree, benchmark or one of {', '.join(SWEEPS)}."
    )
  return c
