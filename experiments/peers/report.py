"""The peers experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/peers
"""

import json

from specjax import results
from specjax.tasks import peers


def report(results_dir):

  out = []
  for name in ("smollm2", "qwen"):
    path = results_dir / name / "peers.json"
    if not path.exists():
      continue
    record = json.loads(path.read_text())
    m = record["machine"]
    out += [f"### {record['config']['target']['name']}", ""]
    out += [f"torch {m['torch']}, transformers {m['transformers']}, jax {m['jax']}.", ""]
    hf = [r["tokens_per_s"] for r in record["rows"] if r["mode"] == "hf_greedy"]
    rows = [r | ({"vs_hf_greedy": r["tokens_per_s"] / hf[0]} if hf else {}) for r in record["rows"]]
    out += [results.markdown_table(rows, peers.COLUMNS + ("vs_hf_greedy",)), ""]
  return "\n".join(out)
