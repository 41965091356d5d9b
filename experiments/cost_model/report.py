"""The cost_model experiment's report: the README's results block and figure from its results/
(``python -m specjax.report experiments/cost_model``)."""

from pathlib import Path

from specjax import results


def figure(records: dict, path) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  pairs = (("tau", "predicted_tau", "τ"), ("speedup", "predicted_speedup", "speedup vs AR"))
  for ax, (m, p, label) in zip(axes[:2], pairs, strict=True):
    everything = []
    for name, record in records.items():
      x, y = [r[m] for r in record["rows"]], [r[p] for r in record["rows"]]
      ax.scatter(x, y, label=name)
      for r, xi, yi in zip(record["rows"], x, y, strict=True):
        ax.annotate(r["variant"], (xi, yi), fontsize=6)
      everything += x + y
    lo, hi = min(everything) * 0.95, max(everything) * 1.05
    ax.plot([lo, hi], [lo, hi], "k:", lw=0.8)
    ax.fill_between([lo, hi], [0.9 * lo, 0.9 * hi], [1.1 * lo, 1.1 * hi], alpha=0.1, color="grey")
    ax.set(xlabel=f"measured {label}", ylabel=f"predicted {label}", title=f"{label} (band: ±10%)")
    ax.legend(fontsize=7)
  rows = [(name, r) for name, record in records.items() for r in record["rows"]]
  chips = list(next(iter(records.values()))["chips"])
  width = 0.8 / (len(chips) + 1)
  xs = np.arange(len(rows))
  axes[2].bar(xs, [r["speedup"] for _, r in rows], width, label="this CPU (measured)")
  for i, chip in enumerate(chips, start=1):
    axes[2].bar(xs + i * width, [r[f"{chip}_speedup"] for _, r in rows], width,
                label=f"{chip} (roofline)")  # fmt: skip
  labels = [f"{n}: {r['variant']}" for n, r in rows]
  axes[2].set_xticks(xs + 0.4, labels, rotation=60, ha="right", fontsize=6)
  axes[2].axhline(1, color="grey", lw=0.5)
  axes[2].set(ylabel="speedup vs AR", title="the same predicted τ on other devices")
  axes[2].legend(fontsize=7)
  results.save_figure(fig, path, dpi=120)


def _grid_lines(record: dict) -> list[str]:
  """Prompt lookup at every (K, min_ngram): τ and the speedup predicted here, and the best."""
  grid = record.get("lookup_grid") or []
  if not grid:
    return []
  ks = sorted({g["num_draft"] for g in grid})
  rows = []
  for n in sorted({g["min_ngram"] for g in grid}):
    cells = {g["num_draft"]: g for g in grid if g["min_ngram"] == n}
    rows.append(
      {"min_ngram": n}
      | {f"K={k}": f"{cells[k]['tau']:.2f} / {cells[k]['predicted_speedup']:.2f}x" for k in ks}
    )
  best = max(grid, key=lambda g: g["predicted_speedup"])

  return [
    "Prompt lookup replayed at every K and min_ngram (all prompts pooled): τ / speedup "
    "predicted here. A row abstains (an AR step) unless its last min_ngram tokens occurred "
    f"before; best here: K={best['num_draft']}, min_ngram={best['min_ngram']} "
    f"({best['predicted_speedup']:.2f}x). Prompt lookup's num_draft = auto reads this grid "
    "and prices it with forwards it times where it runs:",
    "",
    results.markdown_table(rows, ("min_ngram",) + tuple(f"K={k}" for k in ks)),
    "",
  ]


def _eagle_lines(record: dict) -> list[str]:
  """EAGLE-2 at every tree budget: τ and the speedup predicted here and on the chips."""
  grid = record.get("eagle_grid") or []
  if not grid:
    return []

  chips = tuple(f"{c}_speedup" for c in record["chips"])
  rows = [{"budget": f"{g['top_k']} x {g['depth']}, {g['total']} nodes"} | g for g in grid]
  best = max(grid, key=lambda g: g["predicted_speedup"])
  return [
    "EAGLE-2 replayed at every tree budget (top_k x depth, total nodes; all prompts pooled): "
    f"greedy τ and the speedup predicted here; best here: {best['top_k']} x {best['depth']} "
    f"with {best['total']} nodes ({best['predicted_speedup']:.2f}x). EAGLE's total = auto "
    "reads this grid and prices it with forwards it times where it runs:",
    "",
    results.markdown_table(rows, ("budget", "tau", "predicted_speedup") + chips),
    "",
  ]


def _block_lines(record: dict) -> list[str]:
  """Each block drafter (and lookup branch) at every swept tree: τ and the speedup predicted
  here and on the chips."""
  grid = record.get("block_grid") or []
  if not grid:
    return []
  chips = tuple(f"{c}_speedup" for c in record["chips"])
  name = lambda g: (
    f"{g['family']} {Path(g['path']).name}"
    + (  # noqa: E731
      f" + lookup {g['lookup']}" if g["lookup"] else ""
    )
  )
  shape = lambda g: f"{'chain' if g['chain'] else 'tree'} of {len(g['tree_paths'])}"  # noqa: E731
  rows = [{"drafter": name(g), "tree": shape(g)} | g for g in grid]
  best = {}
  for g in grid:
    if g["predicted_speedup"] > best.get(name(g), {"predicted_speedup": 0})["predicted_speedup"]:
      best[name(g)] = g
  picks = "; ".join(f"{n}: {shape(g)} ({g['predicted_speedup']:.2f}x)" for n, g in best.items())
  return [
    "The block drafters replayed at every tree of `static_tree.swept_trees` (chains of every "
    "length, and each depth's second candidate beside a chain: a caterpillar; all prompts "
    f"pooled): greedy τ and the speedup predicted here; best here: {picks}. "
    '`tree = "auto"` reads this grid and prices it with forwards it times where it runs:',
    "",
    results.markdown_table(rows, ("drafter", "tree", "nodes", "tau", "predicted_speedup") + chips),
    "",
  ]


def report(results_dir):
  import json

  records = {}
  for name in ("smollm2", "qwen", "smollm2_eagle", "smollm2_blocks"):
    path = results_dir / name / "cost_model.json"
    if path.exists():
      records[name] = json.loads(path.read_text())
  figure(records, results_dir / "figure.png")
  out = []
  for name, record in records.items():
    rows = record["rows"]
    cols = ("variant", "tau", "predicted_tau", "tau_error", "speedup", "predicted_speedup",
            "speedup_error", "step_ms")  # fmt: skip
    within = sum(abs(r["speedup_error"]) <= 0.10 for r in rows)
    within_tau = sum(abs(r["tau_error"]) <= 0.10 for r in rows)
    chips = tuple(f"{c}_speedup" for c in record["chips"])
    forwards = ", ".join(f"T={t}: {ms:.1f}" for t, ms in record["target_forward_ms"].items())
    tree = record.get("target_tree_forward_ms")
    if tree:
      forwards += "; under a tree mask " + ", ".join(f"T={t}: {ms:.1f}" for t, ms in tree.items())
    drafts = "; ".join(
      f"{name}: "
      + ", ".join(f"{m} T={t}: {ms:.2f}" for m, v in models.items() for t, ms in v.items())
      for name, models in record["drafter_forward_ms"].items()
      if models
    )
    out += [
      f"### {name}: {record['target']}",
      "",
      f"AR step {record['ar_step_ms']:.1f} ms (of which {record['overhead_ms']:.1f} ms beyond one "
      f"target forward). Within 10% of measured: τ for {within_tau} of {len(rows)} drafters, "
      f"speedup for {within} of {len(rows)}.",
      "",
      results.markdown_table(rows, cols),
      "",
      "τ for every chain length K from one offline pass of the 8-token chain, pooled over all "
      "prompts (tokens / target calls; the table above averages the categories' τ), the curve "
      '`num_draft = "auto"` reads (rows of one drafter family are the same curve):',
      "",
      results.markdown_table(
        [
          {"variant": r["variant"]} | {f"K={k}": t for k, t in r["tau_by_k"].items()}
          for r in rows
          if r.get("tau_by_k")
        ],
        ("variant",)
        + tuple(f"K={k}" for k in range(1, record["config"]["cost_model"]["max_k"] + 1)),
      ),  # fmt: skip
      "",
      *_grid_lines(record),
      *_eagle_lines(record),
      *_block_lines(record),
      "The same predicted τ priced on named chips (roofline):",
      "",
      results.markdown_table(rows, ("variant", "predicted_tau") + chips),
      "",
      f"Forwards timed here (ms, batch 1, {record['config']['cost_model']['context']} cached): "
      f"target {forwards}. Drafters' own forwards: {drafts}.",
      "",
    ]
  if records:
    chips = next(iter(records.values()))["chips"]
    out += ["Chips: " + "; ".join(f"{c}: {s}" for c, s in chips.items()) + ".", ""]
  out += ["![predicted vs measured, and the same τ on other devices](results/figure.png)"]
  return "\n".join(out)
