"""The medusa_smollm2 experiment's report: the README's results block (the headline tables),
notes.md's (every table) and the figures, from its results/ (``python -m specjax.report
experiments/medusa_smollm2``)."""

import json

from specjax import results
from specjax.measure import sweep

TRAINING_RUNS = {
  "corpora": "corpus text (step 1)",
  "self_distilled": "greedy text (step 2)",
  "requests": "replies to assistant requests (step 7, from step 2's heads)",
}


def _read(path):
  return json.loads(path.read_text()) if path.exists() else None


def report(results_dir):
  """The README's results block: the training runs, the grown tree's budgets, every sweep's
  means, the batch-1 sweep per category and the replayed tree sizes; draws every figure."""
  out = []
  if figure(results_dir):
    out += ["![head accuracy and tau per category](results/figure.png)", ""]
  out += _runs(results_dir)
  tree = _read(results_dir / "medusa_tree.json")
  if tree:
    cols = ("nodes", "depth", "expected_tau", "verify_cost", "predicted_speedup")
    out += [
      "## The tree grown from held-out accuracy (step 3)",
      "",
      "Each budget's expected τ from the heads' rank-i accuracy on "
      f"{tree['held_out_positions']} held-out positions (per head: [notes.md](notes.md)), its "
      "verify cost timed here (one target forward over the tree, in one-token forwards) and "
      "the speedup they predict:",
      "",
      results.markdown_table(tree["budgets"], cols),
      "",
      f"Chosen: {tree['chosen']} nodes.",
      "",
    ]
  out += _summary(results_dir)
  if typical_figure(results_dir):
    out += ["![tau against the target's log-likelihood](results/typical.png)", ""]
  b1 = _read(results_dir / "sweep_b1" / "sweep.json")
  if b1:
    rows = [r | {"calls_per_token": r["target_calls_per_token"]} for r in b1["runs"]]
    cols = ("category", "variant", "tau", "calls_per_token", "tokens_per_s", "speedup")
    out += ["## Greedy, batch 1, per category (step 4)", ""]
    out += [results.markdown_table(rows, (*cols, "identical")), ""]
  return "\n".join(out + _replay(results_dir))


def details(results_dir):
  """notes.md's results block: each run's per-head accuracy, the heads' accuracy by rank, every
  sweep's full tables and the replayed tree sizes (the figures are report()'s)."""
  out = []
  for step, data in TRAINING_RUNS.items():
    record = _read(results_dir / step / "train.json")
    if record is None:
      continue
    last = record["last"][-1] if record["last"] else {}
    out += [
      f"**Training on {data}**: {record['train_s'] / 60:.1f} min, {last.get('step')} steps.",
      "",
    ]
    rows = _head_rows(record)
    out += [results.markdown_table(rows, tuple(rows[0])), ""]
    if "decode" in record:
      d = record["decode"]
      out += [
        f"Greedy tau on the demo prompts, tree (3, 2, 2, 1): before {d['init']['tau']:.3f}, "
        f"after {d['final']['tau']:.3f}.",
        "",
      ]
  if out:
    out = ["## Training runs: accuracy per head", "", *out]
  record = _read(results_dir / "medusa_tree.json")
  if record:
    out += ["## The tree grown from held-out accuracy (step 3)", ""]
    out += [f"Head accuracy on {record['held_out_positions']} held-out positions:", ""]
    out += [results.markdown_table(record["heads"], tuple(record["heads"][0])), ""]
    cols = ("nodes", "depth", "expected_tau", "verify_cost", "predicted_speedup")
    out += [results.markdown_table(record["budgets"], cols), ""]
    out += [f"Chosen: {record['chosen']} nodes.", ""]
  for arg, title in SWEEP_TITLES.items():
    record = _read(results_dir / arg / "sweep.json")
    if record is None:
      continue
    out += [f"## {title}", ""]
    if arg == "typical":
      out += ["![tau against the target's log-likelihood](results/typical.png)", ""]
    out += [sweep.markdown(record)]
  return "\n".join(out + _replay(results_dir))


def _head_rows(record: dict) -> list[dict]:
  """Top-1 and top-5 accuracy per head on the last training batches and held out."""
  last = record["last"][-1] if record["last"] else {}
  ev = record["eval"][-1] if record["eval"] else {}
  h = record["config"]["objective"]["medusa"]["num_heads"]
  return [
    {"head": k, "train_top1": last.get(f"top1_{k}"), "train_top5": last.get(f"top5_{k}"),
     "held_out_top1": ev.get(f"eval/top1_{k}"), "held_out_top5": ev.get(f"eval/top5_{k}")}
    for k in range(1, h + 1)
  ]  # fmt: skip


def _runs(results_dir) -> list[str]:
  """One row per training run: its time, held-out top-1 / top-5 per head, and the demo τ."""
  rows = []
  for step in TRAINING_RUNS:
    record = _read(results_dir / step / "train.json")
    if record is None:
      continue
    last = record["last"][-1] if record["last"] else {}
    heads = _head_rows(record)
    row = {
      "run": step,
      "train_min": record["train_s"] / 60,
      "steps": last.get("step"),
      "held_out_top1 (heads 1-4)": " / ".join(f"{r['held_out_top1']:.3g}" for r in heads),
      "held_out_top5": " / ".join(f"{r['held_out_top5']:.3g}" for r in heads),
    }
    if "decode" in record:
      d = record["decode"]
      row["demo_tau"] = f"{d['init']['tau']:.3f} → {d['final']['tau']:.3f}"
    rows.append(row)
  intro = (
    "Each run's held-out accuracy per head and its greedy τ on the demo prompts with the tree "
    "(3, 2, 2, 1) before → after; per head on training batches too: [notes.md](notes.md)."
  )
  columns = dict.fromkeys(k for r in rows for k in r)
  return results.section("Training runs (steps 1, 2, 7)", intro, rows, columns)


def _summary(results_dir) -> list[str]:
  """Every sweep's mean over its prompt categories, per variant (AR, 1 by definition, left
  out), and how many of its greedy texts equal AR's."""
  rows = []
  for name in SWEEP_TITLES:
    record = _read(results_dir / name / "sweep.json")
    if record is not None:
      rows += sweep.mean_rows(name, record, log_likelihood=True)
  intro = (
    "τ (tokens per target call) and speedup over AR in the same process, averaged over the "
    "sweep's prompt categories (`:typical`: also the target's log-likelihood per token of the "
    "text, AR's included); `identical`: greedy categories whose text equals AR's. Each sweep's "
    "title and per-category table: [notes.md](notes.md)."
  )
  return results.section("Every sweep: mean over the prompt categories", intro, rows)


def _replay(results_dir) -> list[str]:
  """``replay.py``'s table and figure: greedy τ of the continued heads on every grown tree."""
  record = _read(results_dir / "replay.json")
  if record is None:
    return []
  replay_figure(results_dir, record)
  return [
    "## Wider grown trees, with and without the lookup branch (greedy τ replayed)",
    "",
    "`replay.py`: the continued heads on each tree step 3 grew, greedy τ replayed by the "
    "simulator on the AR text of step 8's prompts (the 4- and 16-node rows equal the decoded "
    "τ, which the script checks).",
    "",
    results.markdown_table(record["rows"], tuple(record["rows"][0])),
    "",
    "![replayed tau against tree size](results/replay.png)",
    "",
  ]


def replay_figure(results_dir, record: dict) -> None:
  """results/replay.png: ``replay.py``'s greedy τ against the grown tree's node count, per
  category and their mean, without (solid) and with (dashed) the lookup branch."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = record["rows"]
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, cat in enumerate([*record["categories"], "mean"]):
    style = dict(color="black", lw=2) if cat == "mean" else dict(color=f"C{i}", lw=1)
    for lookup, ls in ((0, "-"), (max(r["lookup"] for r in rows), "--")):
      mine = [r for r in rows if r["lookup"] == lookup]
      label = cat if lookup == 0 else None
      ax.plot([r["nodes"] for r in mine], [r[cat] for r in mine], ls, marker="o", ms=3,
              label=label, **style)  # fmt: skip
  nodes = sorted({r["nodes"] for r in rows})
  ax.set_xscale("log")
  ax.set_xticks(nodes, [str(n) for n in nodes])
  ax.minorticks_off()
  ax.set(xlabel="grown tree nodes (dashed: + lookup branch)", ylabel="greedy tau (replayed)")
  ax.set_title("Medusa heads: tau levels off with the tree size (issue bar: 2.5)", fontsize=9)
  ax.axhline(2.5, color="grey", lw=0.8, ls=":")
  ax.set_ylim(top=2.75)
  ax.legend(fontsize=7, loc="upper left", ncol=3)
  results.save_figure(fig, results_dir / "replay.png")


SWEEP_TITLES = {
  "sweep_b1": "Greedy, batch 1",
  "sweep_b4": "Greedy, batch 4",
  "typical": "Typical acceptance (lossy) vs lossless sampling at temperature 0.7",
  "sweep_t1": "Temperature 1, batch 1 and 4 (lossless: sampled children verified with their q)",
  "sweep_requests": "The heads continued on replies to assistant requests (step 7), greedy, "
  "batch 1 (chat_new is six more chat prompts)",
  "sweep_lookup": "With prompt lookup's 4-token guess as one more branch (step 8), greedy, batch 1",
  "sweep_lookup_t1": "The same at temperature 1 (sampled children verified with their q)",
}
PAPER_TOP1_TOP5 = ((0.56, 0.78), (0.32, 0.56), (0.20, 0.42), (0.15, 0.34))  # Vicuna-7B, heads 1-4


def figure(results_dir) -> bool:
  """results/figure.png: held-out top-1/top-5 per head next to the paper's, and tau per prompt
  category per variant from the batch-1 sweep. False when the JSON is not there yet."""

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  tree_json, sweep_json = results_dir / "medusa_tree.json", results_dir / "sweep_b1" / "sweep.json"
  if not (tree_json.exists() and sweep_json.exists()):
    return False
  heads = json.loads(tree_json.read_text())["heads"]
  runs = json.loads(sweep_json.read_text())["runs"]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  k = np.arange(1, len(heads) + 1)
  for i, (name, style) in enumerate((("top1", "-o"), ("top5", "--s"))):
    left.plot(k, [h[name] for h in heads], style, color="C0", label=f"specjax {name}")
    left.plot(k, [p[i] for p in PAPER_TOP1_TOP5], style, color="C1", label=f"paper {name}")
  left.set(xlabel="head k (drafts depth k)", ylabel="held-out accuracy", xticks=k, ylim=(0, 1))
  left.set_title("Head accuracy: SmolLM2-135M here vs Vicuna-7B (paper)")
  left.legend(fontsize=8)
  categories = sorted({r["category"] for r in runs})
  variants = [v for v in dict.fromkeys(r["variant"] for r in runs) if v != "ar"]
  width = 0.8 / len(variants)
  for j, v in enumerate(variants):
    tau = [
      next(r["tau"] for r in runs if r["category"] == c and r["variant"] == v) for c in categories
    ]
    right.bar(np.arange(len(categories)) + j * width, tau, width, label=v)
  right.axhline(1.0, color="gray", lw=0.8)
  right.set(
    ylabel="tau (tokens per target call)", xticks=np.arange(len(categories)) + 0.4 - width / 2
  )
  right.set_xticklabels(categories)
  right.set_title("Greedy tau per prompt category, batch 1")
  right.legend(fontsize=7)
  results.save_figure(fig, results_dir / "figure.png")
  return True


def typical_figure(results_dir) -> bool:
  """results/typical.png: mean tau against the mean log-likelihood per token of each
  ``:typical`` variant's outputs (and AR's). False when the JSON is not there yet."""

  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  path = results_dir / "typical" / "sweep.json"
  if not path.exists():
    return False
  summary = json.loads(path.read_text())["summary"]
  fig, ax = plt.subplots(figsize=(6, 4))
  for row in summary:
    v = row["variant"]
    marker = "s" if v.startswith("typical") else "o"
    ax.plot(row["mean_log_likelihood"], row["mean_tau"], marker, label=v)
    ax.annotate(v, (row["mean_log_likelihood"], row["mean_tau"]), fontsize=7,
                xytext=(4, 2), textcoords="offset points")  # fmt: skip
  ax.set(xlabel="target log-likelihood per token (nats)", ylabel="tau (tokens per target call)")
  ax.set_title("Temperature 0.7: typical acceptance (lossy) vs lossless", fontsize=10)
  results.save_figure(fig, results_dir / "typical.png")
  return True
