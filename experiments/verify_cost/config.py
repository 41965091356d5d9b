"""The verify-cost experiment's report (its run is ``verify_cost.py``, a script: it times bare
programs, not a configured generation).

    python experiments/verify_cost/verify_cost.py
    python -m specjax.report experiments/verify_cost
"""

import importlib.util
from pathlib import Path


def _script():
  path = Path(__file__).with_name("verify_cost.py")
  spec = importlib.util.spec_from_file_location("_verify_cost", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def report(results_dir):
  """The README's results block, from results/verify_cost.json."""
  import json

  record = json.loads((Path(results_dir) / "verify_cost.json").read_text())
  m = record["machine"]
  head = (
    f"{record['model']}, batch 1, {record['context']} cached tokens, median of "
    f"{record['rounds']} interleaved rounds; {m['cpu']}, {m['cores']} cores, jax {m['jax']}. "
    "Milliseconds per forward."
  )
  out = [head, "", _script().report_table(record)]
  before = Path(results_dir) / "verify_cost_before.json"
  if before.exists():
    from specjax import results

    old = json.loads(before.read_text())["ms"]
    rows = [
      {
        "dtype": dtype,
        "T": int(t),
        "forward_before": round(old[dtype]["forward"][t], 1),
        "forward_after": round(cells["forward"][t], 1),
        "before_vs_after": round(old[dtype]["forward"][t] / cells["forward"][t], 2),
      }
      for dtype, cells in record["ms"].items()
      for t in sorted(cells["forward"], key=int)
    ]
    out += ["", "The forward before (weights promoted to float32 in every product; "
            "`results/verify_cost_before.json`, 5 rounds) and after:", ""]  # fmt: skip
    out.append(results.markdown_table(rows, tuple(rows[0])))
  return "\n".join(out)
