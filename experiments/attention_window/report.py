"""The attention_window experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/attention_window
"""

import json

from specjax import results


def report(results_dir):
  """The README's results block, from results/max_len.json (and before_refit.json)."""

  record = json.loads((results_dir / "max_len.json").read_text())
  rows = [r | {"calls_per_token": r["target_calls_per_token"]} for r in record["runs"]]
  cols = ("mode", "max_len", "tokens", "tau", "calls_per_token", "tokens_per_s", "vs_smallest")
  out = [results.markdown_table(rows, cols), ""]
  out.append(f"Greedy texts identical across sizes and modes: {record['greedy_texts_identical']}.")
  before = results_dir / "before_refit.json"
  if before.exists():
    old = json.loads(before.read_text())
    rows = []
    for name, r in old.items():
      mode, size = name.rsplit("@", 1)
      base = old[f"{mode}@{min(int(k.rsplit('@', 1)[1]) for k in old)}"]
      rows.append(
        {"mode": mode, "max_len": int(size), "tokens_per_s": r["tokens_per_s"],
         "vs_smallest": r["tokens_per_s"] / base["tokens_per_s"]}
      )  # fmt: skip
    out += ["", "Before the refit (commit 47cc7fc, `before_refit.py`, a separate process):", ""]
    out.append(results.markdown_table(rows, ("mode", "max_len", "tokens_per_s", "vs_smallest")))
  return "\n".join(out)
