"""The Spec-Bench experiment's report: its tables and figure from results/specbench.json, beside
Spec-Bench's own published speedups.

    python -m specjax.report experiments/specbench_smollm2
"""

import json
from pathlib import Path

from specjax import results
from specjax.tasks import specbench_report

# Spec-Bench's own leaderboard (Leaderboard.md, "Leaderboard on A100", Vicuna-7B-v1.3, greedy,
# fp16, batch 1): speedup per column, for the methods run here. Their pattern, not their size,
# is what a 135M model on a CPU can be held against.
PUBLISHED = {
  "prompt_lookup": {"mt_bench": 1.60, "translation": 1.06, "summarization": 2.66, "qa": 1.19,
                    "math_reasoning": 1.62, "rag": 1.86, "overall": 1.66},  # PLD
  "medusa": {"mt_bench": 1.97, "translation": 1.65, "summarization": 1.57, "qa": 1.65,
             "math_reasoning": 1.94, "rag": 1.49, "overall": 1.71},
  "eagle": {"mt_bench": 2.84, "translation": 1.88, "summarization": 2.34, "qa": 2.15,
            "math_reasoning": 2.79, "rag": 2.13, "overall": 2.36},  # EAGLE-2
}  # fmt: skip


def report(results_dir):
  """The README's results block: τ and speedup per Spec-Bench column and method, then ours
  beside the published pattern (each method's columns ordered by speedup); the figure."""
  record = json.loads((Path(results_dir) / "specbench.json").read_text())
  cols = record["columns"]
  keys = [k for k in cols if k != "overall"]
  title = {k: cols[k]["title"] for k in cols}
  m = record["machine"]
  out = [
    f"{record['questions']} questions (the first {record['config']['specbench']['per_category']} "
    "of each category, first turns), "
    f"{record['target']}, greedy, 256 new tokens, batch 1, {m['device']} ({m['platform']}); "
    "every drafter's answers equal AR's "
    f"(`greedy_outputs_identical`: {record['greedy_outputs_identical']}).",
    "",
  ]
  rows = []
  for method in record["methods"]:
    for what, key, fmt in (("speedup", "speedup", "{:.2f}x"), ("τ", "tau", "{:.2f}")):
      cells = {title[k]: fmt.format(cols[k][method][key]) for k in [*keys, "overall"]}
      rows.append({"method": method, "measure": what} | cells)
  out.append(results.markdown_table(rows, tuple(rows[0])))
  out += [
    "",
    "Spec-Bench's published speedups (A100, Vicuna-7B; PLD, Medusa, EAGLE-2) beside ours, and "
    "the order of the columns by speedup, fastest first:",
    "",
  ]
  rows = []
  for method, published in PUBLISHED.items():
    if method not in record["methods"]:
      continue
    ours = {k: cols[k][method]["speedup"] for k in keys}
    for source, speedups in (("Spec-Bench (A100)", published), ("specjax (this CPU)", ours)):
      order = " > ".join(title[k].split()[0] for k in sorted(keys, key=lambda k: -speedups[k]))
      cells = {title[k]: f"{speedups[k]:.2f}x" for k in keys}
      rows.append({"method": method, "source": source} | cells | {"order": order})
  out.append(results.markdown_table(rows, tuple(rows[0])))
  _figure(record, Path(results_dir) / "specbench.png")
  out += ["", "![τ and speedup per Spec-Bench column](results/specbench.png)"]
  return "\n".join(out + _bfloat16(Path(results_dir) / "bfloat16" / "specbench.json"))


def _bfloat16(path: Path) -> list[str]:
  """``:bfloat16``: the same methods in bfloat16 at the default forward rows, each answer
  checked against AR's at the method's rows; speedups over one-row bfloat16 AR."""
  record = specbench_report.finished(path)
  if record is None:
    return []
  cols = record["columns"]
  rows = []
  for m in record["methods"]:
    if m == "vanilla":
      continue
    cells = {cols[k]["title"]: f"{cols[k][m]['speedup']:.2f}x" for k in cols}
    rows.append({"method": m, "forward_rows": record.get("forward_rows", {}).get(m),
                 "tau": round(cols["overall"][m]["tau"], 2)} | cells)  # fmt: skip
  cpu, ar = record["machine"]["cpu"], cols["overall"]["vanilla"]["tokens_per_s"]
  return [
    "",
    "### bfloat16 at the default forward rows (`:bfloat16`)",
    "",
    f"{record['questions']} questions (the first {record['config']['specbench']['per_category']} "
    f"of each category, first turns), {record['config']['max_new_tokens']} new tokens, greedy, "
    f"batch 1, bfloat16 weights and caches ({cpu['model']}, flags {', '.join(cpu['flags'])}). "
    "Each method runs every forward at its rows per step (`forward_rows = auto`) and each of "
    "its answers is checked against AR's at those rows (decoded beside it, untimed); a "
    "difference would stop the run. Every answer equal: "
    f"**{record['greedy_outputs_identical']}** "
    f"({len(record.get('greedy_differences', []))} differences). Speedups over one-row bfloat16 "
    f"AR ({ar:.1f} tok/s overall):",
    "",
    results.markdown_table(rows, tuple(rows[0])),
  ]


def _figure(record, path):
  """τ and speedup per column, one bar per method; Spec-Bench's published speedups as marks."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = record["columns"]
  keys = [k for k in cols if k != "overall"] + ["overall"]
  methods = [m for m in record["methods"] if m != "vanilla"]
  fig, axes = plt.subplots(1, 2, figsize=(13, 4))
  width = 0.8 / len(methods)
  panels = (("tau", "τ (mean accepted tokens)"), ("speedup", "speedup over AR"))
  for j, (ax, (key, title)) in enumerate(zip(axes, panels, strict=True)):
    for i, m in enumerate(methods):
      xs = [x + (i - (len(methods) - 1) / 2) * width for x in range(len(keys))]
      ax.bar(xs, [cols[k][m][key] for k in keys], width, label=f"{m} (specjax, this CPU)")
      if key == "speedup" and m in PUBLISHED:
        ax.plot(xs, [PUBLISHED[m][k] for k in keys], "k_", markersize=10 * width * 4,
                label="Spec-Bench, A100 Vicuna-7B" if i == 0 else None)  # fmt: skip
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(keys)), [cols[k]["title"].replace(" ", "\n", 1) for k in keys],
                  fontsize=7)  # fmt: skip
    ax.set_title(title)
    if j == 1:
      ax.legend(fontsize=7)
  results.save_figure(fig, path)
