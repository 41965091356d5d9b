"""Offline replays of the committed drafter: does the draft vocabulary or the tree budget cap τ?

    python experiments/eagle_smollm2/replay.py              # ~25 min here

Greedy τ replayed by the simulator (``specjax.simulate``: equal to what decoding measures, no
timing) on the AR text of the held-out prompt categories (the sweeps'), for the committed
drafter (``DRAFTER``):

- ``draft_vocab``: the share of the target's greedy tokens that lie in the drafter's draft
  vocabulary (the 8,192 most frequent tokens of its training rows; q is zero outside it), and
  τ at three budgets with the saved head and with the target's whole head. The head is the
  target's frozen one either way (only which rows it keeps changes): the same trained layer.
- ``tree_budget``: τ of EAGLE-2 trees far wider than this CPU can verify at a profit (up to
  128 nodes), with and without prompt lookup's 4-token branch: what the drafter gives where a
  wide verify costs about one forward (an accelerator; the drafter's own forwards, 8-12 per
  step for the deepest, are not priced).

Writes ``results/replay.json``.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from specjax import build, results, simulate  # noqa: E402
from specjax.drafters import eagle  # noqa: E402
from specjax.measure import sweep  # noqa: E402

VOCAB_BUDGETS = ((1, 4, 4), (2, 5, 8), (4, 6, 16))  # (top_k, depth, total): the sweeps' shapes
WIDE_BUDGETS = ((4, 6, 16), (4, 8, 32), (8, 8, 64), (8, 12, 128))
LOOKUP = 4  # drafter.eagle.lookup of the second tree_budget row set


def _taus(target, d, dp, text, budgets) -> dict:
  """``{total: τ}`` of drafter ``d`` replayed over ``text`` at each budget."""
  return {b["total"]: b["tau"] for b in simulate.tau_by_budget(target, d, dp, text, budgets)}


def _named(taus: dict, budgets, suffix: str = "") -> dict:
  """``{tau_<total><suffix>: τ}`` for ``budgets``, in their order."""
  return {f"tau_{total}{suffix}": taus[total] for _, _, total in budgets}


def main() -> None:
  c = E.get_config("sweep_b1")
  plain = sweep.variant_config(c, E.eagle_variant(E.DRAFTER, *VOCAB_BUDGETS[0]))
  target = build.target(plain)
  saved, params = build.drafter(plain, target)
  full = dataclasses.replace(saved, cfg=dataclasses.replace(saved.cfg, vocab_size=0))
  every_id = np.arange(full.cfg.draft_vocab)
  full_params = params | eagle.frozen_params(full.cfg, target.params, every_id)
  branch = sweep.variant_config(c, E.eagle_variant(E.DRAFTER, *WIDE_BUDGETS[0], lookup=LOOKUP))
  lookup, _ = build.drafter(branch, target)
  in_vocab = set(np.asarray(params["vocab_ids"]).tolist())
  vocab_rows, tree_rows = [], []
  for (_, _, category), text in sweep.ar_rows(c, target).items():
    new = [t for _, reply in text for t in reply]
    row = {"category": category, "tokens": len(new)}
    row["in_draft_vocab"] = float(np.mean([t in in_vocab for t in new]))
    every_budget = tuple(dict.fromkeys(VOCAB_BUDGETS + WIDE_BUDGETS))  # (4, 6, 16) once
    plain_taus = _taus(target, saved, params, text, every_budget)
    row |= _named(plain_taus, VOCAB_BUDGETS, "_saved")
    row |= _named(_taus(target, full, full_params, text, VOCAB_BUDGETS), VOCAB_BUDGETS, "_full")
    vocab_rows.append(row)
    print(row, flush=True)
    tree_rows += [
      {"category": category, "lookup": 0} | _named(plain_taus, WIDE_BUDGETS),
      {"category": category, "lookup": LOOKUP}
      | _named(_taus(target, lookup, params, text, WIDE_BUDGETS), WIDE_BUDGETS),
    ]
    print(tree_rows[-2:], flush=True)
  record = {
    "drafter": E.DRAFTER,
    "draft_vocab": {"size": len(in_vocab), "budgets": VOCAB_BUDGETS, "rows": vocab_rows},
    "tree_budget": {"budgets": WIDE_BUDGETS, "rows": tree_rows},
  }
  path = results.write_json(f"{E.RESULTS}/replay.json", record)
  print(results.markdown_table(vocab_rows, tuple(vocab_rows[0])))
  print(results.markdown_table(tree_rows, tuple(tree_rows[0])))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
