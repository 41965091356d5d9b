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
    python -m specjax.run --config=$C:sweep_requests                #    decode both heads
    python -m specjax.report experiments/medusa_smollm2

1. Medusa-1 (target frozen): four heads, one residual layer each, on the target's shared
   (frozen) head restricted to a draft vocabulary of the 4096 most frequent training tokens.
   Labels are the target's own teacher-forced predictions over chitchat conversations (chat
   template) and Python standard-library files: one target forward per batch gives every head
   its soft labels. Writes results/medusa_smollm2/{metrics.jsonl, checkpoints/, draft_init/,
   draft_final/, train.json}, and the record with its metrics to results/corpora/ here (each
   training variant to results/<variant>/); rerunning resumes from the newest checkpoint.
2. Continues those heads on the target's greedy replies to chat and code prompts (the text a
   temperature-0 decode produces) mixed with chitchat rows.
3. ``task=medusa_tree``: each head's rank-i accuracy on step 2's held-out rows (16 greedy
   replies, 16 chitchat rows) and this machine's verify cost choose the tree, saved into the
   heads' medusa.json (results/medusa_tree.json).
4. ``task=sweep``: the prompt categories of ``experiments/held_out.json`` (none in the training
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
   categories and six more chat prompts (``experiments/held_out.json``'s ``chat_new``).
8. ``:sweep_lookup``: ``:requests``' heads on the same trees, each also with prompt lookup's
   4-token guess as one more branch from the root (``drafter.medusa.lookup``), same prompts;
   ``:sweep_lookup_t1`` the same at temperature 1.
9. ``replay.py`` (a script): greedy τ of those heads on every grown tree up to 64 nodes, with
   and without the branch, replayed offline on step 8's AR text.
"""

from ml_collections import config_dict

from configs import demo, train_tiny
from experiments import held_out
from experiments.medusa_smollm2.variants import (
  CHAIN,
  CONTINUED,
  GREEDY_DATA,
  HEADS,
  HEADS_CORPORA,
  HEADS_REQUESTS,
  HERE,
  LOOKUP,
  PROMOTE,
  REQUESTS_DATA,
  RESULTS,
  SWEEPS,
  TYPICAL_EPSILONS,
  WORKDIR,
  WORKDIR_REQUESTS,
  WORKDIR_SD,
  grown_paths,
)
from specjax.drafters import medusa
from specjax.tasks import promote
from specjax.train import objectives

# Read as config.NAME by the experiment's scripts, tests and other configs (besides the names
# get_config uses).
__all__ = (
  "CHAIN", "GREEDY_DATA", "HEADS_CORPORA", "HEADS_REQUESTS", "HERE", "LOOKUP", "REQUESTS_DATA",
  "TYPICAL_EPSILONS", "WORKDIR_REQUESTS", "WORKDIR_SD", "grown_paths", "get_config",
)  # fmt: skip


def get_config(arg: str | None = None):
  c = _training()
  if not arg:
    return c
  if arg not in VARIANTS:
    raise ValueError(
      f"unknown variant {arg!r} of medusa_smollm2/config.py; choose self_distilled, requests, "
      f"{', '.join(PROMOTE)}, tree, benchmark or one of {', '.join(SWEEPS)}."
    )
  VARIANTS[arg](c, arg)
  return c


def _continued_data(c, name: str) -> None:
  c.workdir, c.objective.medusa.init_from, c.data.sources, c.data.max_examples = CONTINUED[name]


def _continued(c, name: str) -> None:
  """Steps 2 and 7: 150 more steps on the run's data at half the learning rate."""
  _continued_data(c, name)
  c.record_to = f"{RESULTS}/{name}"
  c.train.steps = 150
  c.optim.update(learning_rate=1e-3, warmup_steps=10, decay_steps=140)


def _promote(c, name: str) -> None:
  """A trained run's heads to their committed path, with a manifest (task=promote)."""
  c.task = "promote"
  c.promote = promote.default_config()
  c.promote.run, c.promote.to = PROMOTE[name]


def _saved_tree(c) -> None:
  """Decode ``HEADS`` with the tree saved beside them (step 3's): the training run's tree_spec
  set beside it would be an error."""
  c.drafter.medusa.tree_spec = medusa.Medusa.config().tree_spec


def _tree(c, name: str) -> None:
  """Step 3: the tree grown from ``HEADS``' accuracy on step 2's held-out rows."""
  _continued_data(c, "self_distilled")
  c.task = "medusa_tree"
  c.output_dir = RESULTS
  c.drafter.medusa.path = HEADS
  _saved_tree(c)


def _benchmark(c, name: str) -> None:
  c.task = "benchmark"
  c.output_dir = f"{RESULTS}/benchmark"
  c.drafter.medusa.path = HEADS
  _saved_tree(c)


def _sweep(c, name: str) -> None:
  pick, categories, how = SWEEPS[name]
  _saved_tree(c)  # variants that give only a path decode the heads' saved tree
  c.temperature = how.get("temperature", c.temperature)
  held_out.sweep_on(c, f"{RESULTS}/{name}", categories, pick(), how.get("batch_sizes", (1,)),
                    log_likelihood=how.get("log_likelihood", False))  # fmt: skip


VARIANTS = {
  **{name: _continued for name in CONTINUED},
  **{name: _promote for name in PROMOTE},
  "tree": _tree,
  "benchmark": _benchmark,
  **{name: _sweep for name in SWEEPS},
}


def _training():
  """Step 1: the heads trained on corpus text, 300 steps; what every variant changes."""
  c = demo.base()  # SmolLM2 target, held-out chat and code prompts, greedy, batch 1
  c.task = "train"
  c.workdir = WORKDIR
  c.record_to = f"{RESULTS}/corpora"  # train.json and metrics.jsonl (:requests etc. their own)
  c.drafter.name = "medusa"
  c.drafter.medusa.tree_spec = (3, 2, 2, 1)
  c.benchmark.repeats = 1
  t = train_tiny.get_config()
  for section in ("data", "train", "optim", "mesh", "distributed", "evaluate"):
    c[section] = t[section]
  c.objective = objectives.default_config("medusa")
  c.objective.medusa.update(num_heads=4, num_layers=1, vocab_size=4096, own_proj=False, decay=0.8)
  c.data.update(sources=("chitchat", "python"), seq_len=256, max_examples=3000, eval_examples=32,
                seed=0)  # fmt: skip
  c.train.update(steps=300, global_batch=8, log_every=5, eval_every=100, eval_batches=2,
                 checkpoint_every=25, keep=2)  # fmt: skip
  c.optim.update(learning_rate=2e-3, warmup_steps=20, decay_steps=280, weight_decay=0.0)
  # task=medusa_tree (the :tree variant): the tree grown from held-out accuracy.
  c.medusa_tree = config_dict.ConfigDict()
  c.medusa_tree.budgets = (4, 8, 12, 16, 24, 32, 48, 64)  # node budgets tried
  c.medusa_tree.ranks = 8  # candidates per head measured
  c.medusa_tree.context = 128  # cached tokens when timing the verify forward
  return c
