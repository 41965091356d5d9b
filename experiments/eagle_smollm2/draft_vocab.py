"""Does the reduced draft vocabulary cap τ? Its coverage, and the same drafter on the full head.

    python experiments/eagle_smollm2/draft_vocab.py         # ~6 min here

For the committed drafter (``DRAFTER``): the share of the target's greedy tokens on each
held-out prompt category (the sweeps' AR text) that lie in its draft vocabulary (the 8,192
most frequent tokens of its training rows; q is zero outside it), and greedy τ replayed by the
simulator (``specjax.simulate``: equal to what decoding measures) at three tree budgets, once
with the saved head and once with the target's whole head. The drafter's head is the target's
frozen one either way (only which rows it keeps changes), so the trained layer is the same.
Writes ``results/draft_vocab.json``.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from specjax import build, results, simulate  # noqa: E402
from specjax.drafters import eagle  # noqa: E402
from specjax.tasks import sweep  # noqa: E402

BUDGETS = ((1, 4, 4), (2, 5, 8), (4, 6, 16))  # (top_k, depth, total): the sweeps' chain and trees


def main() -> None:
  c = E.get_config("sweep_b1")
  v = sweep._variant_config(c, E.eagle_variant(E.DRAFTER, *BUDGETS[0]))
  target = build.target(v)
  saved, saved_params = build.drafter(v, target)
  full = dataclasses.replace(saved, cfg=dataclasses.replace(saved.cfg, vocab_size=0))
  every_id = np.arange(target.cfg.vocab_size)
  full_params = saved_params | eagle.frozen_params(full.cfg, target.params, every_id)
  in_vocab = set(np.asarray(saved_params["vocab_ids"]).tolist())
  rows = []
  for (_, _, category), text in sweep.ar_rows(c, target).items():
    new = [t for _, reply in text for t in reply]
    row = {"category": category, "tokens": len(new)}
    row["in_draft_vocab"] = float(np.mean([t in in_vocab for t in new]))
    for name, (d, dp) in {"saved": (saved, saved_params), "full": (full, full_params)}.items():
      for b in simulate.tau_by_budget(target, d, dp, text, BUDGETS):
        row[f"tau_{b['total']}_{name}"] = b["tau"]
    rows.append(row)
    print(row, flush=True)
  record = {"drafter": E.DRAFTER, "draft_vocab": len(in_vocab), "budgets": BUDGETS, "rows": rows}
  path = results.write_json(f"{E.RESULTS}/draft_vocab.json", record)
  print(results.markdown_table(rows, tuple(rows[0])))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
