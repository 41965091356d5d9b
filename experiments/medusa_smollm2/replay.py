"""Offline replay: Medusa's greedy τ on wider grown trees, with and without the lookup branch.

    python experiments/medusa_smollm2/replay.py              # ~10 min here

Greedy τ replayed by the simulator (``specjax.simulate``: equal to what decoding measures, no
timing) on the AR text of ``:sweep_lookup``'s five prompt categories, for the heads continued
on request replies (``HEADS_REQUESTS``) on every tree step 3 grew (4 to 64 nodes, from
results/medusa_tree.json), each without and with prompt lookup's 4-token branch. Trees this
wide do not pay on this CPU (17 verified tokens cost 2.8 one-token forwards); on an
accelerator, where a wide verify costs about one forward, τ is the gain. The 4- and 16-node
rows are the trees ``:sweep_lookup`` decoded: the script checks that their τ equals the
decoded τ.

Writes ``results/replay.json``.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.medusa_smollm2 import config as M  # noqa: E402
from specjax import build, results, simulate  # noqa: E402
from specjax.measure import sweep  # noqa: E402

BUDGETS = (4, 8, 16, 32, 64)  # grown trees' node counts (results/medusa_tree.json)


def variant(nodes: int, lookup: int) -> dict:
  tree = {"path": M.HEADS_REQUESTS, "saved_tree": False, "tree_paths": M.grown_paths(nodes)}
  return {"name": "medusa", "medusa": tree | {"lookup": lookup}}


def decoded_taus() -> dict:
  """``{(variant, category): τ}`` that ``:sweep_lookup`` decoded."""
  record = json.loads((Path(M.RESULTS) / "sweep_lookup" / "sweep.json").read_text())
  return {(r["variant"], r["category"]): r["tau"] for r in record["runs"]}


def main() -> None:
  c = M.get_config("sweep_lookup")
  c.drafter.max_nodes = max(BUDGETS) + M.LOOKUP
  target = build.target(c)
  texts = {cat: rows for (_, _, cat), rows in sweep.ar_rows(c, target).items()}
  decoded, table = decoded_taus(), []
  for nodes in BUDGETS:
    for lookup in (0, M.LOOKUP):
      drafter, params = build.drafter(sweep.variant_config(c, variant(nodes, lookup)), target)
      row = {"nodes": nodes, "lookup": lookup, "depth": drafter.tree.max_depth}
      name = f"requests_sparse_{nodes}" + (f"_lookup{lookup}" if lookup else "")  # the sweep's
      for cat, rows in texts.items():
        row[cat] = round(simulate.replay(target, drafter, params, rows).tau, 3)
        if (name, cat) in decoded and abs(decoded[name, cat] - row[cat]) > 0.005:
          raise SystemExit(f"{name} on {cat}: replayed τ {row[cat]}, decoded {decoded[name, cat]}")
      row["mean"] = round(sum(row[cat] for cat in texts) / len(texts), 3)
      print(row, flush=True)
      table.append(row)
  record = {"heads": M.HEADS_REQUESTS, "categories": list(texts), "rows": table}
  path = results.write_json(f"{M.RESULTS}/replay.json", record)
  print(results.markdown_table(table, tuple(table[0])))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
