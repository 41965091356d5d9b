"""The feature path costs nothing unless asked for: SmolLM2, AR and prompt lookup, three ways.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/feature_cost/config.py

Compiles the demo's generation (batch 1, max_len 256, 96 new tokens, greedy) for prompt lookup
(K = 4) as is, reading the final hidden state, and reading three layers (and AR as is);
reports XLA's flops and bytes accessed for each compiled program, its optimised HLO instruction
count, and tokens/s from interleaved timed passes (task=feature_cost). Writes
experiments/feature_cost/results/feature_cost.json.
"""

from configs import demo


def get_config():
  c = demo.base()
  c.task = "feature_cost"
  c.output_dir = "experiments/feature_cost/results"
  c.benchmark.repeats = 3
  return c


def report(results_dir):
  """The README's results block, from results/feature_cost.json."""
  import json

  from specjax import results

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
