"""Spec-Bench's numbers and table, from the answer files task=specbench writes.

What ``evaluation/speed.py`` of Spec-Bench reports, computed the same way: per group of
questions, the mean accepted tokens over every step, the mean over questions of tokens/s, and
its ratio to AR's; grouped per category, per column of Spec-Bench's leaderboard and overall.
"""

import json
import statistics
from pathlib import Path

from specjax import results

# Spec-Bench's columns, in its leaderboard's order and words; speed.py groups MT-bench's eight
# categories as one. A category outside Spec-Bench's is a column of its own, after these.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")  # fmt: skip
COLUMNS = {
  "mt_bench": ("Multi-turn Conversation", MT_BENCH),
  "translation": ("Translation", ("translation",)),
  "summarization": ("Summa-rization", ("summarization",)),
  "qa": ("Question Answering", ("qa",)),
  "math_reasoning": ("Mathematical Reasoning", ("math_reasoning",)),
  "rag": ("Retrieval-aug. Generation", ("rag",)),
}
AR = "vanilla"  # Spec-Bench's name for the autoregressive answers


def _stats(lines: dict, ar_lines: dict) -> dict:
  """What speed.py reports for one group of questions: mean accepted tokens over every step,
  the mean over questions of tokens/s, its ratio to AR's."""
  speeds = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"])
            for a in lines.values()]  # fmt: skip
  ar = [sum(a["choices"][0]["new_tokens"]) / sum(a["choices"][0]["wall_time"])
        for a in ar_lines.values()]  # fmt: skip
  lengths = [n for a in lines.values() for n in a["choices"][0]["accept_lengths"]]
  return {
    "questions": len(lines),
    "tokens": sum(lengths),
    "tau": float(statistics.mean(lengths)),
    "tokens_per_s": statistics.mean(speeds),
    "speedup": statistics.mean(speeds) / statistics.mean(ar),
  }


def columns(categories) -> dict:
  """Spec-Bench's columns the run's categories fill, then those outside Spec-Bench's, each
  ``key -> (title, categories)``; ``overall`` last."""
  out = {k: (title, tuple(c for c in cats if c in categories))
         for k, (title, cats) in COLUMNS.items()}  # fmt: skip
  out = {k: v for k, v in out.items() if v[1]}
  known = {c for _, cats in COLUMNS.values() for c in cats}
  out |= {c: (c, (c,)) for c in categories if c not in known}
  return out | {"overall": ("Overall", tuple(categories))}


def summarize(questions: list[dict], answers: dict) -> dict:
  """Per category, per Spec-Bench column and overall, per method: ``_stats`` of the answer
  lines of ``questions``."""
  by_cat = {}
  for q in questions:
    by_cat.setdefault(q["category"], []).append(q["question_id"])
  group = lambda m, cats: {i: answers[m][i] for c in cats for i in by_cat[c]}  # noqa: E731
  stats = lambda cats: {m: _stats(group(m, cats), group(AR, cats)) for m in answers}  # noqa: E731
  return {
    "questions": len(questions),
    "categories": {c: stats((c,)) for c in by_cat},
    "columns": {k: {"title": t} | stats(cats) for k, (t, cats) in columns(by_cat).items()},
  }


def markdown(record: dict, config) -> str:
  """Spec-Bench's leaderboard table (rows: methods; columns: its categories, mean accepted
  tokens, overall speedup), then τ and tokens/s per column."""
  cols = record["columns"]
  keys = [k for k in cols if k != "overall"]
  titles = [cols[k]["title"] for k in keys]
  head = ["Method", *titles, "#Mean Accepted Tokens", "Overall"]
  rows = []
  for m in record["methods"]:
    rows.append({"Method": "vanilla (AR)" if m == AR else m,
                 **{cols[k]["title"]: f"{cols[k][m]['speedup']:.2f}x" for k in keys},
                 "#Mean Accepted Tokens": f"{cols['overall'][m]['tau']:.2f}",
                 "Overall": f"{cols['overall'][m]['speedup']:.2f}x"})  # fmt: skip
  measures = (("τ", "tau", 2), ("tokens/s", "tokens_per_s", 1))
  detail = [
    {"Method": "vanilla (AR)" if m == AR else m, "measure": what,
     **{cols[k]["title"]: f"{cols[k][m][key]:.{p}f}" for k in [*keys, "overall"]}}
    for m in record["methods"] for what, key, p in measures
  ]  # fmt: skip
  turns = "first turns" if config.specbench.turns == 1 else "both turns"
  about = (
    f"Spec-Bench, {record['questions']} questions ({turns}), target {record['target']}, "
    f"temperature {config.temperature:g}, max_new_tokens {config.max_new_tokens}, batch 1, "
    f"{record['machine']['device']} ({record['machine']['platform']}). Speedup over AR:"
  )
  return "\n".join([
    about, "", results.markdown_table(rows, head), "",
    "Mean accepted tokens τ and tokens/s per column:", "",
    results.markdown_table(detail, ["Method", "measure", *titles, "Overall"]),
  ])  # fmt: skip


def finished(path) -> dict | None:
  """The ``specbench.json`` at ``path`` once its run has summarized every answer (it holds
  ``columns``); None while the file is missing or its run is still answering."""
  path = Path(path)
  record = json.loads(path.read_text()) if path.exists() else {}
  return record if "columns" in record else None
