"""The eagle_smollm2 experiment's report: the README's results block (the headline tables),
notes.md's (every table) and the figures, from its results/ (``python -m specjax.report
experiments/eagle_smollm2``)."""

import json

from ml_collections import ConfigDict

from experiments.eagle_smollm2.config import (
  ABLATION_SWEEPS,
  ABLATIONS,
  LONG_RUN,
  SCALE_RUNS,
)
from specjax import results
from specjax.drafters.eagle import objective as eagle_objective
from specjax.measure import sweep

CONTINUED_RUNS = ("tasks", "volume", "requests", "broad", "more", "wide", *SCALE_RUNS, LONG_RUN)
# runs with a results/<run>/train.json
TRAINED = ("eagle1", *CONTINUED_RUNS, "ttt_300", "eagle3_serve", "eagle3_requests")
SWEEP_TITLES = {
  "sweep_b1": "Greedy, batch 1",
  "sweep_b4": "Greedy, batch 4",
  "sweep_t1": "Temperature 1, batch 1 (sampled children, verified with their q)",
  "sweep_nalpha": "Equal budget (300 steps): EAGLE-1 vs EAGLE-1 + training-time test",
  "sweep_tasks": "Continued for 300 steps on the target's replies to task prompts",
  "sweep_volume": "Continued for 400 steps on 1,600 more chitchat rows (more text)",
  "sweep_requests": "Continued for 300 steps on the target's replies to assistant requests "
  "(five categories: chat_new is six more chat prompts)",
  "sweep_requests_t1": "The same two drafters at temperature 1, chat prompts (sampled "
  "children, verified with their q)",
  "sweep_broad": "Continued for 300 more steps on replies to the broad request set too "
  "(from the requests-continued drafter)",
  "sweep_lookup": "With prompt lookup's 4-token guess as one more branch, temperature 0 and 1",
  "sweep_scale_t1": "The most-data drafters (768 request replies; 300 and 900 steps) at "
  "temperature 1, chat prompts (sampled children, verified with their q)",
  "sweep_eagle3_serve": "The served drafter: the published EAGLE-3 on :requests' rows and "
  "budget (drafter_eagle3) beside :requests' drafter (specjax's architecture)",
}
ABLATION_TITLES = {
  "sweep_inputs": "Inputs: feature + shifted token vs token only vs feature only",
  "sweep_data": "Regenerated vs fixed data",
  "sweep_eagle3": "EAGLE-3 vs EAGLE-1",
  "sweep_init": "The layer started from the target's last layer vs random (fixed data)",
  "sweep_official_eagle3": "The published EAGLE-3 model on eagle3_300's features, rollout and "
  "loss (temperature 0 and 1)",
}


def _read(path):
  return json.loads(path.read_text()) if path.exists() else None


def _train_rows(record: dict) -> list[dict]:
  """Teacher-forced acceptance (top-1 of the draft vs the target) per rollout step, train and
  held out, from a run's train.json."""
  last = record["last"][-1] if record["last"] else {}
  ev = record["eval"][-1] if record["eval"] else {}
  rows = []
  for j in range(1, record["config"]["objective"]["eagle"]["rollout"] + 1):
    s = "" if j == 1 else f"_{j}"
    rows.append({
      "draft step": j,
      "train_top1": last.get(f"top1{s}"),
      "held_out_top1": ev.get(f"eval/top1{s}"),
      "held_out_token_xent": ev.get(f"eval/token{s}"),
      "held_out_feature_l1": ev.get(f"eval/feature{s}"),
    })  # fmt: skip
  return rows


def report(results_dir):
  """The README's results block: the training runs, every sweep's means, the committed
  drafter's sweep per category and the ablations; draws every figure (notes.md's too)."""
  out = []
  if figure(results_dir):
    out += ["![tau per category and acceptance by draft position](results/figure.png)", ""]
  scale = _read(results_dir / "scale.json")
  if scale:
    scale_figure(results_dir, scale)
  out += _runs(results_dir) + _summary(results_dir) + _main_sweep(results_dir)
  return "\n".join(out + _ablation(results_dir, headline=True))


def details(results_dir):
  """notes.md's results block: every run's and sweep's full tables, the offline replays and
  the ablations' (the figures are report()'s)."""
  out = []
  for run in TRAINED:
    record = _read(results_dir / run / "train.json")
    if record is None:
      continue
    o = record["config"]["objective"]["eagle"]
    last = record["last"][-1] if record["last"] else {}
    out += [
      f"**{run}** (features {o['feature_layers']}, rollout {o['rollout']}): "
      f"{record['train_s'] / 60:.1f} min, {last.get('step')} steps of "
      f"{record['config']['train']['global_batch']} x {record['config']['data']['seq_len']} "
      "tokens.",
      "",
    ]
    rows = _train_rows(record)
    out += [results.markdown_table(rows, tuple(rows[0])), ""]
  if out:
    out = ["## Training runs: teacher-forced acceptance at every draft step", "", *out]
  out += _sweeps(results_dir) + _hit_rates(results_dir) + _replay(results_dir) + _fit(results_dir)
  out += _scale(results_dir)
  return "\n".join(out + _ablation(results_dir))


def _runs(results_dir) -> list[str]:
  """One row per training run (its first draft step; notes.md has every step)."""
  rows = []
  for run in TRAINED:
    record = _read(results_dir / run / "train.json")
    if record is None:
      continue
    o = record["config"]["objective"]["eagle"]
    last = record["last"][-1] if record["last"] else {}
    rows.append({
      "run": run,
      "features": ",".join(map(str, o["feature_layers"])),
      "rollout": o["rollout"],
      "train_min": record["train_s"] / 60,
      "steps": last.get("step"),
    } | {k: v for k, v in _train_rows(record)[0].items() if k != "draft step"})  # fmt: skip
  intro = (
    "Teacher-forced acceptance at the first draft step (top-1 of the draft vs the target's "
    "greedy token) on the last training batches and on held-out rows of each run's own mix; "
    "every step's, and each run's batch shape: [notes.md](notes.md)."
  )
  return results.section("Training runs", intro, rows)


def _summary(results_dir) -> list[str]:
  """Every sweep's mean over its prompt categories, per variant (AR, 1 by definition, left
  out), and how many of its greedy texts equal AR's."""
  rows = []
  for name in (*SWEEP_TITLES, *ABLATION_SWEEPS):
    record = _read(results_dir / name / "sweep.json")
    if record is not None:
      rows += sweep.mean_rows(name, record)
  intro = (
    "τ (tokens per target call) and speedup over AR in the same process, averaged over the "
    "sweep's prompt categories; `identical`: greedy categories whose text equals AR's. Each "
    "sweep's title and per-category table: [notes.md](notes.md)."
  )
  return results.section("Every sweep: mean over the prompt categories", intro, rows)


def _main_sweep(results_dir) -> list[str]:
  """The committed drafter's sweep (``:sweep_b1``) per prompt category."""
  record = _read(results_dir / "sweep_b1" / "sweep.json")
  if record is None:
    return []
  rows = [r | {"calls_per_token": r["target_calls_per_token"]} for r in record["runs"]]
  cols = ("category", "variant", "tau", "calls_per_token", "tokens_per_s", "speedup")
  return [
    "## The committed drafter, greedy, batch 1 (`:sweep_b1`), per category",
    "",
    results.markdown_table(rows, (*cols, "identical")),
    "",
  ]


def _fit(results_dir) -> list[str]:
  """``fit.py``'s table: greedy τ replayed on rows trained on, unseen rows of the same request
  sets, and the held-out prompts."""
  path = results_dir / "fit.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  return [
    "## Trained rows, unseen rows of the same kind, new prompts (`fit.py`)",
    "",
    f"Greedy τ replayed offline on {record['rows_per_split']} replies per request set and split "
    f"(their first {record['new_tokens']} tokens): `*_trained` rows every run here trained on, "
    "`*_unseen` replies to requests of the same set that no run read; then the held-out "
    "prompts' AR text.",
    "",
    results.markdown_table(record["table"], tuple(record["table"][0])),
    "",
  ]


def _scale(results_dir) -> list[str]:
  """``scale.py``'s table and figure (drawn by report()): greedy τ against the number of
  distinct replies the drafter was continued on."""
  path = results_dir / "scale.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  n = record["texts"]
  return [
    "## τ against the number of distinct replies trained on (`scale.py`)",
    "",
    "![greedy tau against the number of request replies](results/scale.png)",
    "",
    "The committed drafter (`eagle1`, no request replies) and `:rows_<n>`: it continued 300 "
    "steps on n replies to the two request sets (nested draws). Greedy τ replayed offline "
    f"(`{record['budget']}`) on replies per request set that every `:rows_<n>` run trained on "
    f"(`*_trained`, {n['broad_trained']} and {n['basic_trained']}: the smallest run's rows "
    f"that no run held out) and that none read (`*_unseen`, {n['broad_unseen']} and "
    f"{n['basic_unseen']}), each cut to its first {record['new_tokens']} tokens, and on the "
    f"held-out prompts' AR text. `{LONG_RUN}` read the 768 replies for 900 steps (one cosine) "
    "instead of 300.",
    "",
    results.markdown_table(record["table"], tuple(record["table"][0])),
    "",
  ] + _scale_wide(record)


def _scale_wide(record: dict) -> list[str]:
  """The most-data runs replayed as a wider tree (none in a scale.json written before it)."""
  if "wide" not in record:
    return []
  ((name, budget),) = record["wide_budget"].items()
  return [
    f"The same two runs as `{name}` (top_k, depth, total, lookup = {tuple(budget)}):",
    "",
    results.markdown_table(record["wide"], tuple(record["wide"][0])),
    "",
  ]


def scale_figure(results_dir, record: dict) -> None:
  """results/scale.png: τ per kind of text against n (log axis); the n = 0 drafter dashed."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  table = record["table"]
  base = next(r for r in table if r["replies"] == 0)
  runs = [r for r in table if r["replies"] > 0 and r["run"] != LONG_RUN]
  longer = [r for r in table if r["run"] == LONG_RUN]
  n = [r["replies"] for r in runs]
  fig, ax = plt.subplots(figsize=(6, 4))
  for i, kind in enumerate(k for k in table[0] if k not in ("run", "replies", "steps")):
    ax.plot(n, [r[kind] for r in runs], "o-", label=kind, color=f"C{i}")
    ax.axhline(base[kind], ls="--", lw=0.8, color=f"C{i}")
    for r in longer:
      ax.plot([r["replies"]], [r[kind]], "*", ms=10, color=f"C{i}")
  for r in longer:
    ax.plot([], [], "*", ms=10, color="grey", label=f"{r['run']}: {r['steps']} steps")
  ax.set_xscale("log")
  ax.set_xticks(n, [str(x) for x in n])
  ax.minorticks_off()
  ax.set(xlabel="distinct request replies trained on (dashed: none)", ylabel="greedy tau")
  ax.set_title(f"EAGLE continued 300 steps on n replies ({record['budget']})", fontsize=9)
  ax.legend(fontsize=7)
  results.save_figure(fig, results_dir / "scale.png")


def _replay(results_dir) -> list[str]:
  """``replay.py``'s tables: the draft vocabulary's coverage and τ on the full head; τ of wide
  trees."""
  path = results_dir / "replay.json"
  if not path.exists():
    return []
  vocab, trees = (json.loads(path.read_text())[k] for k in ("draft_vocab", "tree_budget"))
  return [
    "## Offline replays: the draft vocabulary and wide trees (`replay.py`)",
    "",
    f"Share of the target's greedy tokens inside the drafter's {vocab['size']:,}-token "
    "vocabulary, and greedy τ replayed offline (4-chain, 8- and 16-node trees) with that head "
    "(`saved`) and with the target's whole head (`full`), the same trained layer.",
    "",
    results.markdown_table(vocab["rows"], tuple(vocab["rows"][0])),
    "",
    "Greedy τ of EAGLE-2 trees up to 128 nodes (budgets (top_k, depth, total): "
    f"{', '.join(str(tuple(b)) for b in trees['budgets'])}), without and with prompt lookup's "
    "4-token branch.",
    "",
    results.markdown_table(trees["rows"], tuple(trees["rows"][0])),
    "",
  ]


def _hit_rates(results_dir) -> list[str]:
  """``hit_rates.py``'s table: the first draft token's teacher-forced hit rate by text."""
  path = results_dir / "hit_rates.json"
  if not path.exists():
    return []
  rows = json.loads(path.read_text())["rows"]
  return (
    [
      "## First-token hit rate by text (teacher-forced, `hit_rates.py`)",
      "",
      "Share of positions where the first draft token is the target's greedy token: at every "
      "position (`all`) and at a 4-chain's step starts (`step_starts`, its 1-alpha).",
      "",
      results.markdown_table(rows, ("drafter", "text", "rows", "all", "step_starts")),
      "",
    ]
    + _hit_rates_by_confidence([r for r in rows if "share_0" in r])
    + _hit_rates_by_copy([r for r in rows if "share_copy" in r])
  )


CONFIDENCE_BUCKETS = {
  "0": "p < 0.5",
  "0.5": "0.5 <= p < 0.8",
  "0.8": "0.8 <= p < 0.95",
  "0.95": "0.95 <= p",
}  # fmt: skip  (hit_rates.BUCKETS' keys -> headings)


def _hit_rates_by_confidence(rows: list[dict]) -> list[str]:
  """The same hit rates split by the target's confidence at each position."""
  if not rows:
    return []
  table = []
  for r in rows:
    cells = {"drafter": r["drafter"], "text": r["text"]}
    for key, heading in CONFIDENCE_BUCKETS.items():
      hit = r[f"hit_{key}"]
      cells[heading] = f"{r[f'share_{key}']:.2f} / " + ("—" if hit is None else f"{hit:.2f}")
    table.append(cells)
  return [
    "By the target's confidence p (its probability of its greedy token there): the share of "
    "positions / the first draft token's hit rate among them.",
    "",
    results.markdown_table(table, ("drafter", "text", *CONFIDENCE_BUCKETS.values())),
    "",
  ]


def _hit_rates_by_copy(rows: list[dict]) -> list[str]:
  """The same hit rates at positions that copy earlier text (a 2-gram prompt lookup is right)
  and elsewhere."""
  if not rows:
    return []
  return [
    "At copyable positions (prompt lookup's 2-gram match proposes the right token: text "
    "repeated from the prompt or the reply) and elsewhere: their share, and the first draft "
    "token's hit rate at each.",
    "",
    results.markdown_table(rows, ("drafter", "text", "share_copy", "hit_copy", "hit_no_copy")),
    "",
  ]


def _sweeps(results_dir) -> list[str]:
  out = []
  for arg, title in SWEEP_TITLES.items():
    record = _read(results_dir / arg / "sweep.json")
    if record is not None:
      out += [f"## {title}", "", sweep.markdown(record)]
      if arg in ("sweep_nalpha", "sweep_tasks", "sweep_volume", "sweep_requests", "sweep_broad"):
        out += _nalpha_table(record["runs"])
  return out


def _ablation(results_dir, headline: bool = False) -> list[str]:
  """The ablations: each run's data, inputs, CPU time and held-out teacher-forced acceptance
  (its train.json), then greedy decoding as 6-token chains (the ``ABLATION_SWEEPS``); with
  ``headline``, the runs and the figure (drawn here) only."""
  rows = []
  for name in ABLATIONS:
    record = _read(results_dir / name / "train.json")
    if record is not None:
      o = record["config"]["objective"]["eagle"]
      ev = record["eval"][-1] if record["eval"] else {}
      rows.append({
        "run": name,
        "architecture": eagle_objective.architecture(ConfigDict(o)),  # auto resolved
        "data": "+".join(s.rsplit("/", 1)[-1] for s in record["config"]["data"]["sources"]),
        "inputs": o["inputs"],
        "features": ",".join(map(str, o["feature_layers"])),
        "rollout": o["rollout"],
        "layer_init": _layer_init(o["copy_layer"]),
        "train_min": record["train_s"] / 60,
        "held_out_top1": ev.get("eval/top1"),
        "held_out_token_xent": ev.get("eval/token"),
      })  # fmt: skip
  if all(r["architecture"] == "specjax" for r in rows):  # named once another one ran
    rows = [{k: v for k, v in r.items() if k != "architecture"} for r in rows]
  sweeps = {s: _read(results_dir / s / "sweep.json") for s in ABLATION_SWEEPS}
  sweeps = {s: record for s, record in sweeps.items() if record is not None}
  if not rows and not sweeps:
    return []
  out = ["## Ablations at equal budget (300 steps): inputs, data, EAGLE-3, layer init", ""]
  if rows:
    out += [results.markdown_table(rows, tuple(rows[0])), ""]
  if sweeps and (not headline or ablation_figure(results_dir, sweeps)):
    out += ["![ablations: tau per category and n-alpha](results/ablation.png)", ""]
  if headline:
    return out
  for name in ABLATIONS:  # the training-time test's later steps, where a run trained them
    record = _read(results_dir / name / "train.json")
    if record is not None and record["config"]["objective"]["eagle"]["rollout"] > 1:
      out += [f"Teacher-forced acceptance of **{name}** at every draft step:", ""]
      rows = _train_rows(record)
      out += [results.markdown_table(rows, tuple(rows[0])), ""]
  for s, record in sweeps.items():
    out += [f"### {ABLATION_TITLES.get(s, s)}", "", sweep.markdown(record)]
    temperatures = sorted({r.get("temperature", 0.0) for r in record["runs"]})
    for t in temperatures:  # one table per temperature where the sweep decoded several
      runs = [r for r in record["runs"] if r.get("temperature", 0.0) == t]
      out += _nalpha_table(runs, f" at temperature {t:g}" if len(temperatures) > 1 else "")
  return out


def _layer_init(copy_layer: int) -> str:
  return "random" if copy_layer < 0 else f"target layer {copy_layer}"


def _chains(runs: list[dict]) -> list[str]:
  return [v for v in dict.fromkeys(r["variant"] for r in runs) if v != "ar"]


# n-alpha at a position fewer steps reached than this is not plotted (a ratio of few tries).
MIN_TRIES = 20


def _nalpha(runs: list[dict], variant: str) -> tuple[list, list[int]]:
  """Acceptance at each draft position pooled over the prompt categories (None where no step
  reached that position), and how many steps reached each position."""
  sel = [r for r in runs if r["variant"] == variant]
  n = len(sel[0]["alpha"])
  tries = [sum(r["position_attempts"][i] for r in sel) for i in range(n)]
  kept = [sum(r["alpha"][i] * r["position_attempts"][i] for r in sel) for i in range(n)]
  return [k / t if t else None for k, t in zip(kept, tries, strict=True)], tries


def _nalpha_table(runs: list[dict], where: str = "") -> list[str]:
  """Acceptance at each draft position, pooled over the prompt categories, with the number of
  steps that reached it."""
  rows = []
  for v in _chains(runs):
    alphas, tries = _nalpha(runs, v)
    cells = ["—" if a is None else f"{a:.3g} ({t})" for a, t in zip(alphas, tries, strict=True)]
    rows.append({"variant": v} | {f"{i + 1}-alpha": c for i, c in enumerate(cells)})
  return [f"Acceptance by draft position (n-alpha){where}, all categories, with the number of "
          "steps that reached the position in brackets (—: none did):",
          "", results.markdown_table(rows, tuple(rows[0])), ""]  # fmt: skip


def _tau_bars(ax, runs: list[dict], title: str) -> None:
  import numpy as np

  categories = sorted({r["category"] for r in runs})
  variants = _chains(runs)
  width = 0.8 / len(variants)
  for j, v in enumerate(variants):
    tau = [next(r["tau"] for r in runs if r["category"] == c and r["variant"] == v)
           for c in categories]  # fmt: skip
    ax.bar(np.arange(len(categories)) + j * width, tau, width, label=v)
  ax.axhline(1.0, color="gray", lw=0.8)
  ticks = np.arange(len(categories)) + 0.4 - width / 2
  ax.set(ylabel="tau (tokens per target call)", xticks=ticks)
  ax.set_xticklabels(categories)
  ax.set_title(title)
  ax.legend(fontsize=7)


def _nalpha_lines(ax, chains: list[tuple[list, str]]) -> None:
  for runs, v in chains:
    a, tries = _nalpha(runs, v)
    seen = [i for i, t in enumerate(tries) if t >= MIN_TRIES]
    ax.plot([i + 1 for i in seen], [a[i] for i in seen], "-o", label=f"{v} (all categories)")
  ax.set(xlabel="draft position n", ylabel="acceptance n-alpha", ylim=(0, 1), xticks=range(1, 7))
  ax.set_title(f"EAGLE chain: acceptance by draft position (reached >= {MIN_TRIES} times)")
  ax.legend(fontsize=7)


def figure(results_dir) -> bool:
  """results/figure.png: tau per prompt category per variant (batch-1 greedy sweep), and the
  chain's acceptance at each draft position (n-alpha). False when the sweep is not there."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  sweep_json = results_dir / "sweep_b1" / "sweep.json"
  if not sweep_json.exists():
    return False
  runs = json.loads(sweep_json.read_text())["runs"]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  _tau_bars(left, runs, "Greedy tau per prompt category, batch 1")
  chains = [(runs, v) for v in _chains(runs) if v.startswith("eagle_chain")]
  nalpha_json = results_dir / "sweep_nalpha" / "sweep.json"
  if nalpha_json.exists():  # the equal-budget pair: EAGLE-1 vs the training-time test
    other = json.loads(nalpha_json.read_text())["runs"]
    chains += [(other, v) for v in _chains(other)]
  _nalpha_lines(right, chains)
  results.save_figure(fig, results_dir / "figure.png")
  return True


def ablation_figure(results_dir, sweeps: dict) -> bool:
  """results/ablation.png: the ablations' tau per category and n-alpha (each drafter once)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  runs, seen = [], set()
  for record in sweeps.values():  # regen_300 is in every sweep: keep its first; greedy only
    greedy = [r for r in record["runs"] if r.get("temperature", 0.0) == 0.0]
    new = [r for r in greedy if r["variant"] != "ar" and r["variant"] not in seen]
    seen |= {r["variant"] for r in new}
    runs += new
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  _tau_bars(left, runs, "Ablations (300 steps): greedy tau per category, 6-token chains")
  _nalpha_lines(right, [(runs, v) for v in _chains(runs)])
  results.save_figure(fig, results_dir / "ablation.png")
  return True
