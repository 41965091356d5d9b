"""τ simulator and cost model on SmolLM2-135M-Instruct: predicted vs measured, per drafter.

    python -m specjax.run --config=experiments/cost_model/config.py        # SmolLM2, ~55 min
    python -m specjax.run --config=experiments/cost_model/config.py:qwen   # Qwen pair, 14 min quiet
    python -m specjax.run --config=experiments/cost_model/config.py:smollm2_eagle   # ~45 min
    python -m specjax.report experiments/cost_model                        # README

task=cost_model: AR and every drafter below decode the four prompt categories of
``experiments/training_free`` greedily (64 new tokens, batch 1, interleaved timed passes); each
drafter's τ is also predicted without speculative decoding (one teacher-forced pass over the AR
text, then the steps replayed: ``specjax/simulate.py``) and its speedup from this machine's
profile (forwards timed one by one: ``specjax/costmodel.py``); the same predicted τ is priced on
four accelerators by their roofline. Drafters: prompt lookup (chains of 2 and 4, a 2 x 3 tree,
and chains that abstain unless 2 or 3 tokens match: K = 4 and 8),
the target's first 8 layers as a draft model (K = 1, 2), Medusa's trained heads with their
saved tree, the trained EAGLE drafter as 4- and 6-token chains and as EAGLE-2 dynamic trees
(2 x 5 with 8 nodes, 4 x 6 with 16). ``qwen``: Qwen2.5-Coder-1.5B with the 0.5B as a draft
(K = 2, 4, 6) and prompt lookup on the pair config's four code prompts. ``smollm2_eagle``:
the EAGLE drafter replayed at the tree budgets of ``EAGLE_BUDGETS`` (the grid that
``drafter.eagle.total = "auto"`` reads), three of them also decoded. Writes
``results/{smollm2,qwen,smollm2_eagle}/cost_model.json`` and ``sweep.json``.
"""

import functools

from ml_collections import config_dict

from configs import demo, qwen_coder_pair
from experiments.eagle_smollm2 import config as eagle_smollm2
from experiments.training_free import config as training_free
from specjax import results
from specjax.tasks import cost_model, sweep

HERE = "experiments/cost_model"
CHIPS = ("H100-SXM", "H200", "TPU-v5e", "TPU-v5p")


def variants() -> dict:
  eagle = functools.partial(eagle_smollm2.eagle_variant, eagle_smollm2.DRAFTER)
  lookup = lambda k, g=1, n=1: {  # noqa: E731
    "name": "prompt_lookup",
    "prompt_lookup": {"num_draft": k, "num_branches": g, "min_ngram": n},
  }  # fmt: skip
  return {
    "lookup_k2": lookup(2),
    "lookup_k4": lookup(4),
    "lookup_2x3": lookup(3, 2),
    "lookup_k4_min2": lookup(4, n=2),  # abstain unless the last 2 tokens match
    "lookup_k8_min3": lookup(8, n=3),
    "draft_8l_k1": {"name": "draft_model", "draft_model": {"num_draft": 1}},
    "draft_8l_k2": {"name": "draft_model", "draft_model": {"num_draft": 2}},
    "medusa": {"name": "medusa", "medusa": {"path": eagle_smollm2.MEDUSA_HEADS}},
    "eagle_chain_4": eagle(1, 4, 4),
    "eagle_chain_6": eagle(1, 6, 6),
    "eagle_tree_2x5_8": eagle(2, 5, 8),
    "eagle_tree_4x6_16": eagle(4, 6, 16),
  }


def qwen_variants() -> dict:
  """The Qwen pair: the 0.5B draft as chains of 2, 4 and 6, and prompt lookup."""
  draft = lambda k: {"name": "draft_model", "draft_model": {"num_draft": k}}  # noqa: E731
  return {
    "draft_k2": draft(2),
    "draft_k4": draft(4),
    "draft_k6": draft(6),
    "lookup_k4": {"name": "prompt_lookup", "prompt_lookup": {"num_draft": 4}},
  }


# smollm2_eagle: EAGLE-2 budgets replayed, and three of them decoded to check the grid.
EAGLE_BUDGETS = ((1, 2, 2), (1, 4, 4), (2, 3, 4), (2, 5, 8), (3, 4, 8), (4, 4, 12), (4, 6, 16))


def eagle_variants() -> dict:
  """Three budgets of the EAGLE grid, decoded: the 2-chain, a 2 x 3 tree of 4 nodes, and
  the 4 x 6 tree of 16."""
  return {k: v for k, v in variants().items() if k == "eagle_tree_4x6_16"} | {
    "eagle_chain_2": eagle_smollm2.eagle_variant(eagle_smollm2.DRAFTER, 1, 2, 2),
    "eagle_tree_2x3_4": eagle_smollm2.eagle_variant(eagle_smollm2.DRAFTER, 2, 3, 4),
  }


def get_config(arg: str = "smollm2"):
  if arg not in ("smollm2", "qwen", "smollm2_eagle"):
    raise ValueError(f"config argument {arg!r} is unknown; use smollm2, qwen or smollm2_eagle.")
  c = qwen_coder_pair.get_config() if arg == "qwen" else demo.base()
  c.task = "cost_model"
  c.output_dir = f"{HERE}/results/{arg}"
  c.max_new_tokens = 64
  c.max_len = 384
  c.benchmark.repeats = 2  # timed passes per mode (the median): this machine is noisy
  c.sweep = sweep.default_config()
  c.sweep.batch_sizes = (1,)
  c.sweep.verify_sizes = ()
  if arg == "smollm2":
    c.drafter.draft_model.num_layers = 8
    c.sweep.categories = training_free.CATEGORIES
    c.sweep.variants = variants()
  elif arg == "smollm2_eagle":
    c.sweep.categories = training_free.CATEGORIES
    c.sweep.variants = eagle_variants()
  else:
    c.sweep.categories = {"code": tuple(c.prompts)}
    c.sweep.variants = qwen_variants()
  c.cost_model = config_dict.ConfigDict()
  c.cost_model.chips = CHIPS
  c.cost_model.context = 192  # cached tokens behind the timed forwards (prompt + half a reply)
  c.cost_model.max_k = 8  # chains: tau for K = 1..8 (what num_draft = "auto" chooses from)
  c.cost_model.reuse_sweep = ""  # a sweep.json of this config: re-predict without re-measuring
  # EAGLE-2 budgets (top_k, depth, total) replayed: what drafter.eagle.total = "auto" reads.
  c.cost_model.eagle_budgets = EAGLE_BUDGETS if arg == "smollm2_eagle" else cost_model.EAGLE_BUDGETS
  return c


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


def report(results_dir):
  import json

  records = {}
  for name in ("smollm2", "qwen", "smollm2_eagle"):
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
