"""Where the drafter's τ is lost: text it trained on, unseen text of the same kind, new prompts.

    python experiments/eagle_smollm2/fit.py              # after :broad, :more and :wide; ~15 min

Greedy τ replayed by the simulator (``specjax.simulate``: what batch-1 greedy decoding measures,
no timing) for the drafters continued on the target's replies to templated requests
(``RUNS``), at two budgets (a 4-chain, and the 16-node tree with prompt lookup's 4-token
branch, the best greedy budget of ``:sweep_lookup``), on three kinds of text:

- ``trained``: ``ROWS`` replies to each request set (basic, broad) that every run here trained
  on (the first 64 tokens of each reply; the runs' held-out eval rows left out);
- ``unseen``: ``ROWS`` replies to requests of the same sets that no run read (each set holds
  more replies than the runs' quota of 384);
- ``prompts``: the target's greedy replies to ``:sweep_broad``'s held-out prompts (chat, six
  more chat prompts, code), as the sweeps decode them.

Unseen near prompts: the new prompts are no harder than more of the training kind (no shift of
distribution to blame). Trained far above unseen: the drafter memorises rows rather than
learning the kind. Trained itself low: the drafter does not fit even the text it saw.

Writes ``results/fit.json``.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from specjax import build, results, simulate  # noqa: E402
from specjax.measure import sweep  # noqa: E402
from specjax.train import data  # noqa: E402

RUNS = ("broad", "more", "wide")  # workdirs results/eagle_smollm2_<run>/draft_final
BUDGETS = {"chain_4": (1, 4, 4, 0), "tree_16_lookup4": (4, 6, 16, 4)}  # top_k, depth, total, lookup
ROWS = 16  # replies per request set and split
NEW_TOKENS = 64  # of each reply: as many as the sweeps decode
REQUEST_SETS = (("broad", E.BROAD_DATA), ("basic", E.REQUESTS_DATA))  # in the runs' source order


def request_rows(config, unseen_by=None, rows: int = ROWS) -> dict:
  """``{"<set>_trained" | "<set>_unseen": [(prompt ids, reply ids)]}`` for the two request
  sets, chosen as ``config.data`` chose the runs' rows (same sources, quota and seed): trained
  rows of ``config`` (each config in ``unseen_by`` too, if given: rows all of them trained
  on), and unseen rows that neither ``config`` nor ``unseen_by`` read; ``rows`` of each."""
  sets = {name: data.read_shards(d, keys=("tokens", "mask"))[1] for name, d in REQUEST_SETS}
  masks = {name: arrays["mask"] for name, arrays in sets.items()}
  picks = [selection(c, masks) for c in (config, *(unseen_by or ()))]
  out = {}
  for name, arrays in sets.items():
    tokens, mask = arrays["tokens"], arrays["mask"]
    trained = [r for r in picks[0][name]["trained"] if all(r in p[name]["trained"] for p in picks)]
    unseen = picks[0][name]["learnable"]
    for p in picks:
      unseen = np.setdiff1d(unseen, p[name]["chosen"])
    for split, chosen in (("trained", trained), ("unseen", unseen)):
      out[f"{name}_{split}"] = [_prompt_and_reply(tokens[r], mask[r]) for r in chosen[:rows]]
  return out


def selection(config, masks: dict) -> dict:
  """Per request set (``broad``, ``basic``; ``masks``: its rows' stored loss masks): its
  ``learnable`` rows, the rows ``config.data`` ``chosen`` from it, and of those the ``trained``
  ones (its held-out eval rows left out)."""
  sources = list(config.data.sources)
  quota = config.data.max_examples // len(sources)
  n = quota * len(sources)  # each set gives its full quota: rows of the sources, in order
  positions = np.arange(n)[:, None]
  _, held = data.split(data.Dataset(positions, np.ones_like(positions)), config.data.eval_examples)
  eval_rows = set(held.tokens[:, 0].tolist())
  out = {}
  for i, (name, directory) in enumerate(REQUEST_SETS):
    assert sources.index(directory) == i, sources  # positions count the sets in this order
    learnable, chosen = (
      data.shard_selection(directory, masks[name], config.data.seq_len, q, config.data.seed)
      for q in (None, quota)
    )
    trained = [int(r) for j, r in enumerate(chosen) if i * quota + j not in eval_rows]
    out[name] = {"learnable": learnable, "chosen": chosen, "trained": trained}
  return out


def _prompt_and_reply(tokens: np.ndarray, mask: np.ndarray) -> tuple[list, list]:
  """A self-distilled row as (prompt ids, the first ``NEW_TOKENS`` reply ids): ``mask[t]`` is 1
  where token t + 1 was generated."""
  first, n = int(np.argmax(mask > 0)), int(mask.sum())
  reply = tokens[first + 1 : first + 1 + min(n, NEW_TOKENS)]
  return tokens[: first + 1].tolist(), reply.tolist()


def main() -> None:
  c = E.get_config("sweep_broad")
  trained_on = E.get_config("more")  # :broad's rows, which :more and :wide read again
  runs = {run: (f"{E.WORKDIR}_{run}/draft_final", {}) for run in RUNS}
  check_drafters(runs)
  texts = request_rows(trained_on)
  table = replay_table(c, runs, BUDGETS, texts)
  record = {"runs": RUNS, "budgets": BUDGETS, "rows_per_split": ROWS, "new_tokens": NEW_TOKENS,
            "texts": {k: len(v) for k, v in texts.items()}, "table": table}  # fmt: skip
  path = results.write_json(f"{E.RESULTS}/fit.json", record)
  print(results.markdown_table(table, tuple(table[0])))
  print(f"wrote {path}")


def check_drafters(runs: dict) -> None:
  """One error for a drafter of ``runs`` (``{run: (path, ...)}``) not trained yet."""
  for run, (path, _) in runs.items():
    if not Path(path).is_dir():
      sys.exit(f"error: {path} is missing: run --config={E.HERE}/config.py:{run} first.")


def replay_table(c, runs: dict, budgets: dict, texts: dict) -> list[dict]:
  """Greedy τ of each drafter (``runs``: ``{run: (path, cells)}``, ``cells`` the row's
  columns after ``run``) at each of ``budgets`` on each of ``texts``, one row per drafter and
  budget (a ``budget`` column when there are several). ``texts`` gains the target's AR replies
  to ``c``'s prompt categories (decoded once: a later call with the same ``texts`` reuses
  them). The caller has run ``check_drafters(runs)``."""
  target, table = None, []
  for run, (path, cells) in runs.items():
    for budget, (top_k, depth, total, lookup) in budgets.items():
      vc = sweep.variant_config(c, E.eagle_variant(path, top_k, depth, total, lookup=lookup))
      if target is None:
        target = build.target(vc)
      if not set(c.sweep.categories) <= set(texts):
        texts.update({cat: rows for (_, _, cat), rows in sweep.ar_rows(c, target).items()})
      drafter, params = build.drafter(vc, target)
      row = {"run": run, **cells} | ({"budget": budget} if len(budgets) > 1 else {})
      for kind, rows in texts.items():
        row[kind] = round(simulate.replay(target, drafter, params, rows).tau, 3)
      print(row, flush=True)
      table.append(row)
  return table


if __name__ == "__main__":
  main()
