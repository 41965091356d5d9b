"""Where the drafter's first token is right: teacher-forced hit rates by kind of text.

    python experiments/eagle_smollm2/hit_rates.py              # ~5 min per drafter here
    python experiments/eagle_smollm2/hit_rates.py volume       # only these drafters' rows

For each drafter (``DRAFTER`` and, once trained, its continuations by ``:tasks`` and
``:volume``; Medusa's committed heads beside them), the share of positions where its first
draft token is the target's greedy next token, over the target's own greedy text (the
simulator's offline drafts, ``specjax.simulate``: exactly what greedy decoding proposes at
that root): 12 rows spread evenly over each self-distilled set (the greedy replies to chitchat
and Python prompts are ``DRAFTER``'s training rows; the task replies are new to it) and the AR
text of each held-out prompt category of the sweeps, each alone and pooled ("categories").
"all" counts every position; "step starts" only the positions a 4-chain's greedy decoding
drafts from (its 1-alpha). Every position also falls in a bucket of the target's own
confidence there (its probability of the greedy token, teacher-forced): the share of positions
in each bucket and the hit rate inside it separate "the target is unsure on this text" from
"the drafter never learnt this text"; and a position is "copyable" where prompt lookup's 2-gram
match proposes the right token (text repeated from the prompt or the reply). Writes
``results/hit_rates.json``; drafters named on the command line replace their rows there and
keep the others'.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.eagle_smollm2 import config as E  # noqa: E402
from specjax import build, decode, results, simulate  # noqa: E402
from specjax.drafters.prompt_lookup import PromptLookup  # noqa: E402
from specjax.measure import sweep  # noqa: E402
from specjax.train import data  # noqa: E402

SETS = (E.GREEDY_DATA, E.TASKS_DATA)
DRAFTERS = {"eagle1": E.DRAFTER} | {r: f"{E.WORKDIR}_{r}/draft_final" for r in ("tasks", "volume")}
DRAFTERS["medusa"] = E.MEDUSA_HEADS  # the committed Medusa heads, as a 4-chain of head 1's top-1s
MEDUSA_CHAIN = ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))


def variant(name: str) -> dict:
  """The ``config.drafter`` overrides of a 4-chain of drafter ``name``."""
  if name == "medusa":
    return {"name": "medusa", "medusa": {"path": DRAFTERS[name], "saved_tree": False,
                                         "tree_paths": MEDUSA_CHAIN}}  # fmt: skip
  return E.eagle_variant(DRAFTERS[name], 1, 4, 4)


ROWS_PER_SET = 12


BUCKETS = (0.0, 0.5, 0.8, 0.95)  # lower edges: the target's probability of its greedy token
CONFIDENCE_COLUMNS = tuple(f"{k}_{lo:g}" for lo in BUCKETS for k in ("share", "hit"))


def confidences(target, rows) -> list[np.ndarray]:
  """Per row, the target's probability of each new token but the first, teacher-forced: the
  text is its greedy output, so that is its top probability, where a root's first draft token
  is checked (root k of the row proposes new token k + 1)."""
  length = decode.bucket(max(len(p) + len(n) for p, n in rows))
  return [np.exp(lp[1:]) for lp in sweep.token_log_probs(target, rows, length)]


COPY = PromptLookup(1, max_ngram=3, min_ngram=2)  # "copyable": a 2-gram match guesses right


def copyable(target, rows) -> list[np.ndarray]:
  """Per row, whether the token at each root's depth 1 is a copy: prompt lookup (the last 2-3
  tokens matched earlier in the prompt or reply) proposes it there."""
  out = []
  for prompt, new in rows:
    text = list(prompt) + list(new)
    drafts, parents = simulate.offline_drafts(target, COPY, None, text, len(prompt))
    out.append(simulate.hits(drafts, parents, text, len(prompt))[: len(new) - 1, 0])
  return out


def by_copy(hit: np.ndarray, copy: np.ndarray) -> dict:
  """Share of copyable positions, and the first-token hit rate at them and elsewhere."""
  rate = lambda m: float(hit[m].mean()) if m.any() else None  # noqa: E731
  return {"share_copy": float(copy.mean()), "hit_copy": rate(copy), "hit_no_copy": rate(~copy)}


def by_confidence(hit: np.ndarray, conf: np.ndarray) -> dict:
  """Share of positions and first-token hit rate in each bucket of the target's confidence."""
  out = {}
  edges = (*BUCKETS, np.inf)
  for lo, hi in zip(edges[:-1], edges[1:], strict=True):
    inside = (conf >= lo) & (conf < hi)
    out[f"share_{lo:g}"] = float(inside.mean())
    out[f"hit_{lo:g}"] = float(hit[inside].mean()) if inside.any() else None
  return out


def rates(target, drafter, dparams, rows, conf, copy) -> dict:
  """First-token hit rate over every position and over a 4-chain's step starts, and at every
  position by the target's confidence there (``conf``: ``confidences(target, rows)``) and by
  whether it is a copy (``copy``: ``copyable(target, rows)``)."""
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
  every = np.concatenate(every)
  return (
    {"all": float(every.mean()), "step_starts": float(np.mean(starts))}
    | by_confidence(every, np.concatenate(conf))
    | by_copy(every, np.concatenate(copy))
  )


def main(names: list[str]) -> None:
  unknown = set(names) - set(DRAFTERS)
  if unknown:
    raise SystemExit(f"error: unknown drafters {sorted(unknown)}; choose from {list(DRAFTERS)}.")
  c = E.get_config("sweep_tasks")
  target, conf, copy = None, None, None
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
    v = sweep.variant_config(c, variant(drafter))
    if not Path(DRAFTERS[drafter]).is_dir():
      print(f"skipping {drafter}: {DRAFTERS[drafter]} is not there")
      continue
    target = target or build.target(v)
    if "chat" not in texts:
      held_out = {key[2]: rows for key, rows in sweep.ar_rows(c, target).items()}
      texts |= held_out | {"categories": [row for rows in held_out.values() for row in rows]}
    conf = conf or {text: confidences(target, rows) for text, rows in texts.items()}
    copy = copy or {text: copyable(target, rows) for text, rows in texts.items()}
    d, dp = build.drafter(v, target)
    for text, rows in texts.items():
      r = rates(target, d, dp, rows, conf[text], copy[text])
      out.append({"drafter": drafter, "text": text, "rows": len(rows)} | r)
      print(out[-1], flush=True)
  out.sort(key=lambda row: list(DRAFTERS).index(row["drafter"]))
  results.write_json(str(path), {"rows": out})
  print(results.markdown_table(out, ("drafter", "text", "rows", "all", "step_starts")))
  print(results.markdown_table(out, ("drafter", "text", *CONFIDENCE_COLUMNS)))
  print(results.markdown_table(out, ("drafter", "text", "share_copy", "hit_copy", "hit_no_copy")))


if __name__ == "__main__":
  main(sys.argv[1:])
