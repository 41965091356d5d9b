"""Does τ grow with the number of distinct replies the drafter trains on?

    for run in rows_48 rows_192 rows_768 rows_768_x3; do
      nice -n 10 python -m specjax.run --config=experiments/eagle_smollm2/config.py:$run
    done
    python experiments/eagle_smollm2/scale.py            # ~13 min

The committed drafter (EAGLE-1, ``DRAFTER``: no request replies) and its three continuations
``:rows_<n>`` (``config.SCALE_RUNS``: 300 steps of one schedule on n replies to the two request
sets; nested draws, so the runs differ only in how many distinct replies they read). Greedy τ
replayed by the simulator (16-node tree with prompt lookup's 4-token branch, ``fit.py``'s best
budget) on:

- ``trained``: up to ``ROWS`` replies per request set that every ``:rows_<n>`` run trained on
  (the smallest run's rows that no run held out for evaluation);
- ``unseen``: ``ROWS`` replies per set that no run read;
- ``chat``, ``chat_new``, ``code``: the target's greedy replies to the held-out prompts.

``:rows_768_x3`` (``config.LONG_RUN``) reads the 768 replies for 900 steps instead of 300: if
it beats ``:rows_768`` on unseen text, the runs were short of steps too. Both are also replayed
as 64-node trees with the lookup branch (``WIDE``): how much a wider tree adds to the best one.

If the limit of the continued drafters is the number of distinct replies (``fit.py``'s reading),
unseen and chat τ rise with n while trained τ falls from memorising fewer rows harder. Writes
``results/scale.json``; ``python -m specjax.report experiments/eagle_smollm2`` draws
``results/scale.png``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from experiments.eagle_smollm2 import fit  # noqa: E402
from specjax import results  # noqa: E402

BUDGET = "tree_16_lookup4"
WIDE = {"tree_64_lookup4": (8, 8, 64, 4)}  # top_k, depth, total, lookup: replay.py's 64 nodes
ROWS = 24  # replies per request set and split


def main() -> None:
  c = E.get_config("sweep_broad")
  runs = {"eagle1": (E.DRAFTER, {"replies": 0, "steps": 0})}
  runs |= {
    r: (f"{E.WORKDIR}_{r}/draft_final", {"replies": n, "steps": E.get_config(r).train.steps})
    for r, n in (E.SCALE_RUNS | {E.LONG_RUN: E.SCALE_RUNS["rows_768"]}).items()
  }
  fit.check_drafters(runs)
  configs = [E.get_config(run) for run in E.SCALE_RUNS]
  texts = fit.request_rows(configs[0], unseen_by=configs[1:], rows=ROWS)
  table = fit.replay_table(c, runs, {BUDGET: fit.BUDGETS[BUDGET]}, texts)
  most = {r: runs[r] for r in ("rows_768", E.LONG_RUN)}  # the most replies, and steps
  c.drafter.max_nodes = max(total + lookup for _, _, total, lookup in WIDE.values())
  wide = fit.replay_table(c, most, WIDE, texts)
  record = {"budget": BUDGET, "wide_budget": WIDE, "rows_per_split": ROWS,
            "new_tokens": fit.NEW_TOKENS, "texts": {k: len(v) for k, v in texts.items()},
            "table": table, "wide": wide}  # fmt: skip
  path = results.write_json(f"{E.RESULTS}/scale.json", record)
  for t in (table, wide):
    print(results.markdown_table(t, tuple(t[0])))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
