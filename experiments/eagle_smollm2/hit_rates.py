"""Where the drafter's first token is right: teacher-forced hit rates by kind of text.

    python experiments/eagle_smollm2/hit_rates.py              # ~5 min per drafter here
    python experiments/eagle_smollm2/hit_rates.py volume       # only these drafters' rows

For each drafter (``DRAFTER`` and, once trained, its continuations by ``:tasks`` and
``:volume``), the share of positions where its first draft token is the target's greedy next
token, over the target's own greedy text (the simulator's offline drafts, ``specjax.simulate``:
exactly what greedy decoding proposes at that root): 12 rows spread evenly over each
self-distilled set (the greedy replies to chitchat and Python prompts are ``DRAFTER``'s training
rows; the task replies are new to it) and the AR text of each held-out prompt category of the
sweeps. "all" counts every position; "step starts" only the positions a 4-chain's greedy
decoding drafts from (its 1-alpha). Writes ``results/hit_rates.json``; drafters named on the
command line replace their rows there and keep the others'.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from specjax import build, results, simulate  # noqa: E402
from specjax.tasks import sweep  # noqa: E402
from specjax.train import data  # noqa: E402

SETS = (E.GREEDY_DATA, E.TASKS_DATA)
DRAFTERS = {"eagle1": E.DRAFTER} | {r: f"{E.WORKDIR}_{r}/draft_final" for r in ("tasks", "volume")}
ROWS_PER_SET = 12


def rates(target, drafter, dparams, rows) -> dict:
  """First-token hit rate over every position and over a 4-chain's step starts."""
  every, starts = [], []
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts, parents = simulate.offline_drafts(target, drafter, dparams, text, len(prompt))
    hit = simulate.hits(drafts, parents, text, len(prompt))
    every.append(hit[: len(new) - 1, 0])
    accepted = simulate.accepted_lengths(hit, parents)
    pos = 1
    while pos < len(new):
      starts.append(accepted[pos - 1] >= 1)
      pos += int(accepted[pos - 1]) + 1
  return {"all": float(np.concatenate(every).mean()), "step_starts": float(np.mean(starts))}


def main(names: list[str]) -> None:
  unknown = set(names) - set(DRAFTERS)
  if unknown:
    raise SystemExit(f"error: unknown drafters {sorted(unknown)}; choose from {list(DRAFTERS)}.")
  c = E.get_config("sweep_tasks")
  target = None
  texts = {}
  for name in SETS:
    _, a = data.read_shards(name, keys=("tokens", "lengths", "prompt_lengths"))
    idx = np.linspace(0, len(a["tokens"]) - 1, ROWS_PER_SET).astype(int)
    p, n = a["prompt_lengths"], a["lengths"]
    texts[name.rsplit("/", 1)[-1]] = [
      (a["tokens"][i, : p[i]].tolist(), a["tokens"][i, p[i] : n[i]].tolist()) for i in idx
    ]
  path = Path(E.RESULTS) / "hit_rates.json"
  kept = json.loads(path.read_text())["rows"] if names and path.exists() else []
  out = [row for row in kept if row["drafter"] not in names]
  for drafter in names or DRAFTERS:
    v = sweep._variant_config(c, E.eagle_variant(DRAFTERS[drafter], 1, 4, 4))
    if not Path(v.drafter.eagle.path).is_dir():
      print(f"skipping {drafter}: {v.drafter.eagle.path} is not there")
      continue
    target = target or build.target(v)
    if "chat" not in texts:
      texts |= {key[2]: rows for key, rows in sweep.ar_rows(c, target).items()}
    d, dp = build.drafter(v, target)
    for text, rows in texts.items():
      r = rates(target, d, dp, rows)
      out.append({"drafter": drafter, "text": text, "rows": len(rows)} | r)
      print(out[-1], flush=True)
  out.sort(key=lambda row: list(DRAFTERS).index(row["drafter"]))
  results.write_json(str(path), {"rows": out})
  print(results.markdown_table(out, ("drafter", "text", "rows", "all", "step_starts")))


if __name__ == "__main__":
  main(sys.argv[1:])
