"""The speculative_theory experiment's report: the README's results block and its figure,
from results/.

    python -m specjax.report experiments/speculative_theory
"""

import json

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from experiments.speculative_theory.config import KS
from specjax import results, theory


def analyse(record: dict) -> dict:
  """Measured alpha (K = 1), c and verify cost -> predicted tau and speedup per K, beside the
  measured ones; the best K measured and predicted."""
  runs = {r["variant"]: r for r in record["runs"]}
  ar, draft = runs["ar"], runs["draft_ar"]
  c = ar["tokens_per_s"] / draft["tokens_per_s"]
  alpha = runs["k1"]["tau"] - 1  # K = 1: tau = 1 + P(accept)
  verify = theory.interpolate({r["tokens"]: r["vs_1_token"] for r in record["verify_cost"]})
  rows = []
  for k in KS:
    r = runs[f"k{k}"]
    rows.append(
      {
        "K": k,
        "tau": r["tau"],
        "predicted_tau": theory.expected_tokens(alpha, k),
        "speedup": r["speedup"],
        "leviathan_speedup": theory.speedup(alpha, k, c),
        "cost_model_speedup": theory.speedup_with_verify_cost(alpha, k, c, verify),
        "identical": r.get("identical"),
      }
    )
  best = lambda key: max(rows, key=lambda r: r[key])["K"]  # noqa: E731
  return {
    "alpha": alpha,
    "c": c,
    "rows": rows,
    "best_k": {
      "measured": best("speedup"),
      "leviathan": best("leviathan_speedup"),
      "cost_model": best("cost_model_speedup"),
      "rule_of_thumb": theory.rule_of_thumb_k(alpha, c),
    },
  }


def rule_grid() -> dict:
  """K* ~ sqrt(alpha / c) against the exact optimum over a grid of (alpha, c)."""
  alphas = [round(0.5 + 0.05 * i, 2) for i in range(10)]  # 0.5 .. 0.95
  cs = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5]
  cells = []
  for a in alphas:
    for c in cs:
      k_opt, k_rule = theory.optimal_k(a, c), theory.rule_of_thumb_k(a, c)
      cells.append(
        {
          "alpha": a, "c": c, "k_opt": k_opt, "k_rule": k_rule,
          "loss": 1 - theory.speedup(a, k_rule, c) / theory.speedup(a, k_opt, c),
        }
      )  # fmt: skip
  return {"alphas": alphas, "cs": cs, "cells": cells}


def formula_table() -> list[dict]:
  """E[tokens per step] and the best speedup for a few alpha at c = 0.05 (a draft ~20x cheaper)."""
  out = []
  for a in (0.6, 0.7, 0.8, 0.9):
    row = {"alpha": a} | {f"E[K={k}]": theory.expected_tokens(a, k) for k in (1, 2, 4, 8)}
    k = theory.optimal_k(a, 0.05)
    out.append(row | {"best K (c=0.05)": k, "speedup": theory.speedup(a, k, 0.05)})
  return out


def figure(analyses: dict, grid: dict, path) -> None:

  matplotlib.use("Agg")

  fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
  for name, an in analyses.items():
    ks = [r["K"] for r in an["rows"]]
    (line,) = axes[0].plot(ks, [r["tau"] for r in an["rows"]], "o-", label=f"{name} measured")
    axes[0].plot(ks, [r["predicted_tau"] for r in an["rows"]], "--", color=line.get_color(),
                 label=f"{name} formula (α={an['alpha']:.2f})")  # fmt: skip
    axes[1].plot(ks, [r["speedup"] for r in an["rows"]], "o-", color=line.get_color(),
                 label=f"{name} measured")  # fmt: skip
    axes[1].plot(ks, [r["leviathan_speedup"] for r in an["rows"]], ":", color=line.get_color(),
                 label=f"{name} Leviathan (verify = 1, c={an['c']:.2f})")  # fmt: skip
    axes[1].plot(ks, [r["cost_model_speedup"] for r in an["rows"]], "--", color=line.get_color(),
                 label=f"{name} with measured verify cost")  # fmt: skip
  axes[0].set(xlabel="K (draft tokens per step)", ylabel="τ (tokens per target call)")
  axes[1].set(xlabel="K", ylabel="speedup vs AR")
  axes[1].axhline(1, color="grey", lw=0.5)
  for ax in axes[:2]:
    ax.legend(fontsize=7)
  loss = np.array([[c["loss"] for c in grid["cells"] if c["alpha"] == a] for a in grid["alphas"]])
  im = axes[2].imshow(loss, origin="lower", aspect="auto", cmap="viridis")
  axes[2].set_xticks(range(len(grid["cs"])), grid["cs"])
  axes[2].set_yticks(range(len(grid["alphas"])), grid["alphas"])
  axes[2].set(xlabel="c", ylabel="α", title="speedup lost by K = round(√(α/c))")
  fig.colorbar(im, ax=axes[2])
  results.save_figure(fig, path, dpi=120)


def report(results_dir):
  """The README's results block (and figure.png) from results/*/sweep.json."""

  out = ["Formulas (no measurement): E[tokens per step] and the best K at c = 0.05.", ""]
  cols = ("alpha", "E[K=1]", "E[K=2]", "E[K=4]", "E[K=8]", "best K (c=0.05)", "speedup")
  out += [results.markdown_table(formula_table(), cols), ""]
  grid = rule_grid()
  hits = sum(c["k_rule"] == c["k_opt"] for c in grid["cells"])
  worst = max(grid["cells"], key=lambda c: c["loss"])
  mean = sum(c["loss"] for c in grid["cells"]) / len(grid["cells"])
  out += [
    f"Rule of thumb K = round(√(α/c)) vs the exact optimum over {len(grid['cells'])} (α, c) "
    f"cells (α 0.5-0.95, c 0.01-0.5): equal in {hits}; speedup lost at most "
    f"{100 * worst['loss']:.1f}% (α={worst['alpha']}, c={worst['c']}: K {worst['k_rule']} vs "
    f"{worst['k_opt']}); mean loss {100 * mean:.2f}%.",
    "",
  ]  # fmt: skip
  analyses = {}
  for name in ("smollm2", "qwen"):
    path = results_dir / name / "sweep.json"
    if not path.exists():
      continue
    an = analyses[name] = analyse(json.loads(path.read_text()))
    out += [f"### {name}: α = {an['alpha']:.3f} (K = 1), c = {an['c']:.3f}", ""]
    cols = ("K", "tau", "predicted_tau", "speedup", "leviathan_speedup", "cost_model_speedup",
            "identical")  # fmt: skip
    out += [results.markdown_table(an["rows"], cols), ""]
    out += [f"Best K: {an['best_k']}", ""]
  figure(analyses, grid, results_dir / "figure.png")
  out += ["![tau, speedup and the rule of thumb](results/figure.png)"]
  return "\n".join(out)
