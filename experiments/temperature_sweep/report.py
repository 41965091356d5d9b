"""The temperature_sweep experiment's report: the README's results block and its figure,
from results/.

    python -m specjax.report experiments/temperature_sweep
"""

import json

import matplotlib
import matplotlib.pyplot as plt

from specjax import results


def rows(record: dict) -> list[dict]:
  """Per temperature and variant, over categories: mean tau, alpha at draft position 1
  (accepted / attempted, pooled) and mean speedup."""
  out = []
  for s in record["summary"]:
    sel = [
      r
      for r in record["runs"]
      if (r["temperature"], r["batch"], r["variant"])
      == (s["temperature"], s["batch"], s["variant"])
    ]
    tries = sum(r["position_attempts"][0] for r in sel if r["position_attempts"])
    hits = sum(r["alpha"][0] * r["position_attempts"][0] for r in sel if r["position_attempts"])
    out.append(
      {
        "temperature": s["temperature"],
        "variant": s["variant"],
        "tau": s["mean_tau"],
        "alpha_1": hits / tries if tries else None,
        "speedup": s["mean_speedup"],
      }
    )
  return out


def figure(table: list[dict], path) -> None:

  matplotlib.use("Agg")

  fig, axes = plt.subplots(1, 3, figsize=(14, 4))
  names = [v for v in dict.fromkeys(r["variant"] for r in table) if v not in ("ar", "draft_ar")]
  for name in names:
    sel = sorted((r for r in table if r["variant"] == name), key=lambda r: r["temperature"])
    temps = [r["temperature"] for r in sel]
    for ax, key in zip(axes, ("tau", "alpha_1", "speedup"), strict=True):
      ax.plot(temps, [r[key] for r in sel], "o-", label=name)
  labels = ("τ (tokens per target call)", "α at draft position 1", "speedup vs AR")
  for ax, label in zip(axes, labels, strict=True):
    ax.set(xlabel="temperature", ylabel=label)
  axes[2].axhline(1, color="grey", lw=0.5)
  axes[0].legend(fontsize=7)
  results.save_figure(fig, path, dpi=120)


def report(results_dir):

  record = json.loads((results_dir / "sweep.json").read_text())
  table = rows(record)
  figure(table, results_dir / "figure.png")
  cols = ("temperature", "variant", "tau", "alpha_1", "speedup")
  out = [results.markdown_table([r for r in table if r["variant"] != "ar"], cols), ""]
  out += ["![tau, alpha and speedup against temperature](results/figure.png)"]
  return "\n".join(out)
