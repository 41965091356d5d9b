"""task=medusa_tree: grow the Medusa tree from data and this machine's verify cost; save it.

    python -m specjax.run --config=experiments/medusa_smollm2/config.py:tree

Medusa §2.3.3. On the held-out rows of the config's training data (``data.eval_examples``,
never trained on) it measures each head's rank-i accuracy: how often head k's i-th candidate is
the target's greedy token k places ahead. For every node budget in ``medusa_tree.budgets`` it
grows the tree with the largest expected accepted length (``Tree.from_accuracy``), times the
target's forward over that many tokens on this machine, and predicts the speedup over AR as
``(1 + expected accepted) / (verify cost / one-token cost)`` (the heads' own cost left out).
The best budget's tree is written into the heads' ``medusa.json``, where
``drafter.medusa.saved_tree`` picks it up. Writes ``medusa_tree.json`` and prints the tables.
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from specjax import build, losses, results
from specjax.drafters import medusa
from specjax.measure import sweep
from specjax.measure.machine import machine
from specjax.models import llama
from specjax.tasks import train
from specjax.trees import Tree


def rank_accuracy(target, params, dataset, ranks: int, batch: int = 4) -> tuple[np.ndarray, int]:
  """``[H, ranks]`` how often head k's i-th candidate is the target's greedy token k places
  ahead (teacher-forced over ``dataset``'s counted positions), and the positions counted."""
  h = params["res_w"].shape[0]

  @jax.jit
  def counts(tparams, hparams, tokens_BxT, mask_BxT):
    logits_BxTxV, feats = llama.logits_of(tparams, target.cfg, tokens_BxT, ("final",))
    heads_BxTxHxW = medusa.head_logits(hparams, feats[0])
    want_BxT = jnp.argmax(logits_BxTxV, axis=-1)
    t = tokens_BxT.shape[1]
    hits, total = [], []
    for k in range(1, h + 1):
      valid_BxT = losses.within_document(mask_BxT, k)
      _, top_BxTxR = jax.lax.top_k(heads_BxTxHxW[:, : t - k, k - 1], ranks)
      hit_BxTxR = hparams["vocab_ids"][top_BxTxR] == want_BxT[:, k:, None]
      hits.append(jnp.sum(hit_BxTxR * valid_BxT[..., None], axis=(0, 1)))
      total.append(jnp.sum(valid_BxT))
    return jnp.stack(hits), jnp.stack(total)

  hits, total = np.zeros((h, ranks)), np.zeros(h)
  for i in tqdm(range(0, len(dataset), batch), desc="head accuracy", unit="batch"):
    tokens, mask = dataset.tokens[i : i + batch], dataset.mask[i : i + batch]
    got_hits, got_total = counts(target.params, params, tokens, mask)
    hits, total = hits + np.asarray(got_hits), total + np.asarray(got_total)
  return hits / np.maximum(total, 1)[:, None], int(total[0])


def _save_tree(directory: str, tree: Tree, record: dict) -> None:
  """Rewrites the heads' medusa.json with the tree (temp file, then rename)."""
  path = Path(directory) / medusa.META_FILE
  meta = json.loads(path.read_text()) | {"tree": list(tree.parents), "tree_from": record}
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text(json.dumps(meta, indent=1))
  os.replace(tmp, path)


def run(config: ml_collections.ConfigDict) -> dict:
  c, t = config.drafter.medusa, config.medusa_tree
  if not c.path:
    raise ValueError(
      "config.drafter.medusa.path is empty: point it at trained heads (workdir/draft_final)."
    )
  budgets = tuple(int(b) for b in t.budgets)
  if not budgets or min(budgets) < 1 or max(budgets) > config.drafter.max_nodes:
    raise ValueError(
      f"config.medusa_tree.budgets={budgets} must be node counts in [1, "
      f"config.drafter.max_nodes={config.drafter.max_nodes}]."
    )
  sizes = (("ranks", 1, "candidates per head measured"), ("context", 0, "cached tokens"))
  for field, least, what in sizes:
    build.check_integer(t[field], f"config.medusa_tree.{field}", least, what)
  if config.data.eval_examples < 1:
    raise ValueError("config.data.eval_examples must be >= 1: the held-out rows measured here.")
  from specjax.drafters.medusa import formats as layouts

  if layouts.detect(c.path, c.get("format", "auto")) != "specjax":
    raise ValueError(
      f"config.drafter.medusa.path={c.path!r} is not a specjax heads directory: "
      "task=medusa_tree saves the tree it picks into their medusa.json; give published heads "
      "a tree with drafter.medusa.tree_spec (or tree_paths) instead."
    )
  build.check(config)
  target = build.target(config)
  _, params, meta = medusa.load(c.path, target)
  _, held_out = train._load_data(config, target)
  acc, positions = rank_accuracy(target, params, held_out, t.ranks)
  sizes = sorted({1} | {b + 1 for b in budgets})
  timed = sweep.verify_cost(target, sizes, config.max_len, context=t.context, mask="tree")
  cost = {r["tokens"]: r["vs_1_token"] for r in timed}
  rows = []
  for b in budgets:
    tree, expected = Tree.from_accuracy(acc, b)
    rows.append(
      {
        "nodes": b,
        "depth": tree.max_depth,
        "expected_tau": 1 + expected,
        "verify_cost": cost[b + 1],
        "predicted_speedup": (1 + expected) / cost[b + 1],
        "parents": list(tree.parents),
      }
    )
  best = max(rows, key=lambda r: r["predicted_speedup"])
  tops = sorted({1, min(5, t.ranks), t.ranks})
  heads = [{"head": k + 1} | {f"top{i}": acc[k, :i].sum() for i in tops} for k in range(len(acc))]
  record = {
    "config": config.to_dict(),
    "machine": machine(),
    "held_out_positions": positions,
    "rank_accuracy": acc.tolist(),
    "heads": heads,
    "budgets": rows,
    "chosen": best["nodes"],
  }
  print(f"head accuracy on {positions} held-out positions (teacher-forced, greedy labels):")
  print(results.table(heads, tuple(heads[0])))
  print(results.table(rows, ("nodes", "depth", "expected_tau", "verify_cost", "predicted_speedup")))
  _save_tree(c.path, Tree(tuple(best["parents"])), {"nodes": best["nodes"], "data": "held out"})
  print(f"chose {best['nodes']} nodes; saved the tree into {c.path}/{medusa.META_FILE}")
  print(f"wrote {results.write_json(f'{config.output_dir}/medusa_tree.json', record)}")
  return record
