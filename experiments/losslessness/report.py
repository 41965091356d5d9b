"""The losslessness experiment's report: the README's results block and its figure,
from results/.

    python -m specjax.report experiments/losslessness
"""

import json

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from specjax import results


def figure(record: dict, path) -> None:

  matplotlib.use("Agg")

  fig, axes = plt.subplots(1, 4, figsize=(18, 4))
  pairs = record["random_pairs"]
  axes[0].plot([0, 1], [0, 1], color="grey", lw=0.8)
  axes[0].scatter([r["tv"] for r in pairs], [r["rejected"] for r in pairs], s=8)
  draws = record["config"]["losslessness"]["rows"]
  axes[0].set(
    xlabel="TV(p, q)",
    ylabel="rejection rate",
    title=f"{len(pairs)} random pairs, {draws} draws each",
  )
  bins = record["real_logits"]["bins"]
  axes[1].plot([0, 1], [0, 1], color="grey", lw=0.8)
  axes[1].scatter([b["mean_tv"] for b in bins], [b["rejected"] for b in bins],
                  s=[max(8, b["positions"] / 4) for b in bins])  # fmt: skip
  axes[1].set(xlabel="mean TV in bin", ylabel="rejection rate",
              title="SmolLM2: 30 layers (p) vs first 20 (q), T = 1")  # fmt: skip
  for ax, (name, j) in zip(axes[2:], record["joint"].items(), strict=True):
    seqs = j["sequences"][:20]
    x = np.arange(len(seqs))
    ax.bar(x - 0.2, [s["exact"] for s in seqs], 0.4, label="enumerated")
    ax.bar(x + 0.2, [s["empirical"] for s in seqs], 0.4, label=f"sampled ({j['samples']})")
    ax.set_xticks(x, ["".join(map(str, s["seq"])) for s in seqs], rotation=90, fontsize=7)
    ax.set(title=f"{name}: χ² p = {j['pvalue']:.2f}", ylabel="probability")
    ax.legend(fontsize=7)
  results.save_figure(fig, path, dpi=120)


def report(results_dir):

  record = json.loads((results_dir / "losslessness.json").read_text())
  pairs = record["random_pairs"]
  gaps = [abs(r["tv"] - r["rejected"]) for r in pairs]
  rl = record["real_logits"]
  out = [
    f"Random pairs: {len(pairs)}; |rejection rate - TV| mean {sum(gaps) / len(gaps):.4f}, "
    f"largest {max(gaps):.4f} ({record['config']['losslessness']['rows']} draws per pair: "
    f"binomial standard error up to {0.5 / record['config']['losslessness']['rows'] ** 0.5:.4f}).",
    "",
    f"Real logits: {rl['positions']} positions of {rl['corpus']}; mean TV {rl['mean_tv']:.4f}, "
    f"rejection rate {rl['rejected']:.4f}.",
    "",
    results.markdown_table(rl["bins"], ("lo", "hi", "positions", "mean_tv", "rejected")),
    "",
  ]
  rows = [{"drafter": k, "samples": j["samples"], "chi2_p": j["pvalue"]}
          for k, j in record["joint"].items()]  # fmt: skip
  out += [results.markdown_table(rows, ("drafter", "samples", "chi2_p")), ""]
  figure(record, results_dir / "figure.png")
  out += ["![rejection vs TV, and sampled vs enumerated](results/figure.png)"]
  return "\n".join(out)
