"""The feature_cost experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/feature_cost
"""

import json

from specjax import results


def report(results_dir):
  """The README's results block, from results/feature_cost.json."""

  record = json.loads((results_dir / "feature_cost.json").read_text())
  cols = ("mode", "features", "hlo_ops", "gflops", "gbytes", "tau", "tokens_per_s", "vs_none")
  out = [results.markdown_table(record["runs"], cols)]
  before, after = results_dir / "hlo_before.json", results_dir / "hlo_after.json"
  if before.exists() and after.exists():
    rows = []
    old = json.loads(before.read_text())["rows"]
    for new in json.loads(after.read_text())["rows"]:
      was = next(r for r in old if (r["mode"], r["max_len"]) == (new["mode"], new["max_len"]))
      row = {"mode": new["mode"], "max_len": new["max_len"]}
      for k in ("hlo_ops", "gbytes", "gflops"):
        row |= {f"{k}_before": was[k], f"{k}_after": new[k]}
      rows.append(row)
    cols = tuple(rows[0])
    out += ["", "Before (commit 47cc7fc) and after the engine refit, `hlo_before_after.py`:", ""]
    out.append(results.markdown_table(rows, cols))
  return "\n".join(out)
