"""The verify_cost experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/verify_cost
"""

import importlib.util
import json
from pathlib import Path

from experiments.verify_cost.config import FLOAT32_SWEEP, ONE_SHAPE_ROWS
from specjax import results


def _script(name: str = "verify_cost"):
  path = Path(__file__).with_name(f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def report(results_dir):
  """The README's results block, from results/verify_cost.json."""

  record = json.loads((Path(results_dir) / "verify_cost.json").read_text())
  m = record["machine"]
  head = (
    f"{record['model']}, batch 1, {record['context']} cached tokens, median of "
    f"{record['rounds']} interleaved rounds; {m['cpu']}, {m['cores']} cores, jax {m['jax']}. "
    "Milliseconds per forward."
  )
  out = [head, "", _script().report_table(record)]
  before = Path(results_dir) / "verify_cost_before.json"
  if before.exists():
    from specjax import results

    old = json.loads(before.read_text())["ms"]
    rows = [
      {
        "dtype": dtype,
        "T": int(t),
        "forward_before": round(old[dtype]["forward"][t], 1),
        "forward_after": round(cells["forward"][t], 1),
        "before_vs_after": round(old[dtype]["forward"][t] / cells["forward"][t], 2),
      }
      for dtype, cells in record["ms"].items()
      for t in sorted(cells["forward"], key=int)
    ]
    out += ["", "The forward before (weights promoted to float32 in every product; "
            "`results/verify_cost_before.json`, 5 rounds) and after:", ""]  # fmt: skip
    out.append(results.markdown_table(rows, tuple(rows[0])))
  results_dir = Path(results_dir)
  parts = _loop_cost(results_dir) + _drafter_cost(results_dir) + _eagle_levels(results_dir)
  parts += _bf16_sweep(results_dir) + _bf16_one_shape(results_dir) + _bf16_exact(results_dir)
  parts += _auto_default(results_dir)
  return "\n".join(out + parts)


def _loop_cost(results_dir: Path) -> list[str]:
  """A token inside the decode loop with and without the weights' barrier
  (results/loop_cost.json)."""

  path = results_dir / "loop_cost.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  return [
    "",
    "### The weights inside the loop",
    "",
    f"`loop_cost.py`: milliseconds per generated token, batch 1, {record['max_new_tokens']} new "
    "tokens, median of 3 decodes; each barrier mode in its own process.",
    "",
    _script("loop_cost").report_table(record),
  ]


def _drafter_cost(results_dir: Path) -> list[str]:
  """The drafters' own step against an AR step (results/drafter_cost.json)."""

  path = results_dir / "drafter_cost.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  m = record["machine"]
  return [
    "",
    "### The drafter's own step",
    "",
    f"`drafter_cost.py`: {record['model']}, batch 1, {record['context']} cached tokens, median "
    f"of {record['rounds']} interleaved rounds; {m['cpu']}, {m['cores']} cores, jax {m['jax']}. "
    "Milliseconds; EAGLE budgets as top_k x depth _ total; `level` is the deepest level's layer, "
    "`head` and `top_k` one level's head and selection.",
    "",
    _script("drafter_cost").report_table(record),
  ]


def _eagle_levels(results_dir: Path) -> list[str]:
  """The float32 EAGLE sweep rerun with levels that keep their keys and values, beside the
  committed run from before (another run: each speedup is a ratio within its own run)."""

  path = results_dir / "eagle_levels" / "sweep.json"
  if not path.exists():
    return []
  now = json.loads(path.read_text())["runs"]
  was = {(r["variant"], r["category"]): r for r in json.loads(Path(FLOAT32_SWEEP).read_text())[
    "runs"] if not r.get("temperature")}  # fmt: skip
  same = sum(r["tau"] == was[r["variant"], r["category"]]["tau"] for r in now)
  rows = []
  for variant in dict.fromkeys(r["variant"] for r in now):
    mine = [r for r in now if r["variant"] == variant]
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    before = [was[variant, r["category"]] for r in mine]
    rows.append({"variant": variant, "tau": round(mean(mine, "tau"), 3),
                 "speedup_before": round(mean(before, "speedup"), 3),
                 "speedup_now": round(mean(mine, "speedup"), 3)})  # fmt: skip
  return [
    "",
    "### EAGLE decoding before and after",
    "",
    f"`{FLOAT32_SWEEP}` (before) and `results/eagle_levels/sweep.json` (now: that sweep rerun "
    "at temperature 0, `--config.sweep.temperatures='(0.0,)' "
    "--config.output_dir=experiments/verify_cost/results/eagle_levels`), float32, greedy, the "
    f"training_free prompts; means over the four categories. τ equal in {same} of {len(now)} "
    "(variant, category) runs; every text equal to AR's.",
    "",
    results.markdown_table(rows, tuple(rows[0])),
  ]


def _bf16_sweep(results_dir: Path) -> list[str]:
  """The drafters decoded in bfloat16 beside the same variants in float32 (another run: each
  speedup is a ratio within its own run)."""

  path = results_dir / "bf16_sweep" / "sweep.json"
  if not path.exists():
    return []
  bf16 = json.loads(path.read_text())
  f32 = json.loads(Path(FLOAT32_SWEEP).read_text())
  f32_runs = {(r["variant"], r["category"]): r for r in f32["runs"] if not r.get("temperature")}
  rows = []
  for r in bf16["runs"]:
    if r["variant"] == "ar":
      continue
    row = {"category": r["category"], "variant": r["variant"], "tau_bf16": round(r["tau"], 3)}
    row |= {"speedup_bf16": round(r["speedup"], 2), "identical_to_bf16_ar": r["identical"]}
    was = f32_runs.get((r["variant"], r["category"]))
    if was:
      row |= {"tau_f32": round(was["tau"], 3), "speedup_f32": round(was["speedup"], 2)}
    rows.append(row)
  same = sum(r["identical_to_bf16_ar"] is True for r in rows)
  return [
    "",
    "### The drafters in bfloat16",
    "",
    "Greedy, batch 1, 64 new tokens, the training_free prompts: `results/bf16_sweep/sweep.json` "
    f"(bfloat16) beside `{FLOAT32_SWEEP}` (float32, its own run). {same} of {len(rows)} "
    "(category, drafter) texts equal bfloat16 AR's token for token.",
    "",
    results.markdown_table(rows, tuple(rows[0])),
  ]


def _bf16_one_shape(results_dir: Path) -> list[str]:
  """The bfloat16 sweep with every forward at one shape (``:one_shape``), beside the one where
  AR steps run one row (another run: each speedup is a ratio within its own run)."""

  path, plain = results_dir / "bf16_one_shape" / "sweep.json", results_dir / "bf16_sweep"
  if not path.exists() or not (plain / "sweep.json").exists():
    return []
  runs = json.loads(path.read_text())["runs"]
  was = {(r["variant"], r["category"]): r for r in json.loads(
    (plain / "sweep.json").read_text())["runs"]}  # fmt: skip
  rows = []
  for r in runs:
    one_row = was[r["variant"], r["category"]]
    row = {"category": r["category"], "variant": r["variant"], "tau": round(r["tau"], 3)}
    if r["variant"] == "ar":
      row |= {"tokens_per_s": round(r["tokens_per_s"], 1),
              "one_row_ar_tokens_per_s": round(one_row["tokens_per_s"], 1)}  # fmt: skip
    else:
      row |= {"speedup": round(r["speedup"], 2), "identical_to_ar": r["identical"],
              "speedup_one_row_ar": round(one_row["speedup"], 2),
              "identical_to_one_row_ar": one_row["identical"]}  # fmt: skip
    rows.append(row)
  drafts = [r for r in rows if r["variant"] != "ar"]
  same = sum(r["identical_to_ar"] is True for r in drafts)
  before = sum(r["identical_to_one_row_ar"] is True for r in drafts)
  return [
    "",
    "### bfloat16 with every forward at one shape",
    "",
    f"`results/bf16_one_shape/sweep.json`: the bfloat16 sweep with `forward_rows = "
    f"{ONE_SHAPE_ROWS}`, AR included, beside `results/bf16_sweep` (AR steps of one row; its "
    f"own run). {same} of {len(drafts)} (category, drafter) texts equal AR's token for token, "
    f"against {before} of {len(drafts)} there.",
    "",
    results.markdown_table(drafts, tuple(drafts[0])),
    "",
    results.markdown_table([r for r in rows if r["variant"] == "ar"],
                           ("category", "variant", "tokens_per_s", "one_row_ar_tokens_per_s")),
  ]  # fmt: skip


def _bf16_exact(results_dir: Path) -> list[str]:
  """The bfloat16 sweep at the default ``forward_rows = auto`` (``:exact``): each drafter at
  its rows per step against AR at those rows; the speedups over one-row AR."""
  path = results_dir / "bf16_exact" / "sweep.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  drafts = [
    {"category": r["category"], "variant": r["variant"], "forward_rows": r["forward_rows"],
     "tau": round(r["tau"], 3), "speedup_over_one_row_ar": round(r["speedup"], 2),
     "identical_to_ar_at_its_rows": r["identical"]}
    for r in record["runs"] if "forward_rows" in r
  ]  # fmt: skip
  ars = {}
  for r in record["runs"]:
    if r["variant"].startswith("ar"):
      ars.setdefault(r["variant"], []).append(r["tokens_per_s"])
  speeds = [{"AR": v, "mean_tokens_per_s": round(sum(t) / len(t), 1)} for v, t in ars.items()]
  same = sum(r["identical_to_ar_at_its_rows"] is True for r in drafts)
  cpu = record["machine"]["cpu"]
  return [
    "",
    "### bfloat16 at the default forward rows",
    "",
    "`results/bf16_exact/sweep.json` (`:exact`): the bfloat16 sweep at `forward_rows = auto`, "
    "each drafter at its own rows per step, each text checked against AR at those rows (one AR "
    f"run per row count); speedups over one-row AR, in the same run ({cpu['model']}, flags "
    f"{', '.join(cpu['flags'])}). {same} of {len(drafts)} (category, drafter) texts equal AR's "
    "token for token.",
    "",
    results.markdown_table(drafts, tuple(drafts[0])),
    "",
    results.markdown_table(speeds, ("AR", "mean_tokens_per_s")),
  ]


def _auto_default(results_dir: Path) -> list[str]:
  """README's demo and EAGLE commands at their defaults (``dtype = auto``), each benchmark's
  ARs side by side (results/auto_default/<run>/benchmark.json)."""
  rows, ratios, cpu = [], None, None
  for run in ("demo", "eagle"):
    path = results_dir / "auto_default" / run / "benchmark.json"
    if not path.exists():
      continue
    record = json.loads(path.read_text())
    s, modes = record["summary"], record["modes"]
    ratios, cpu = s["dtype"]["ratios"], record["machine"]["cpu"]
    rows.append({"command": run, "dtype": s["dtype"]["dtype"], "forward_rows": s["forward_rows"],
                 **{f"{m} tok/s": round(v["tokens_per_s"], 1) for m, v in modes.items()},
                 "tau": round(s["tau"], 3), "speedup": round(s["speedup"], 2),
                 "over": s["baseline"], "greedy = AR": s["greedy_outputs_identical"]})  # fmt: skip
  if not rows:
    return []
  shown = ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items())
  return [
    "",
    "### README's commands at their defaults",
    "",
    "`results/auto_default/{demo,eagle}/benchmark.json`: README's demo (prompt lookup, K auto) "
    "and its EAGLE command (`drafter_requests`, 16-node tree + lookup branch) as written, "
    f"`dtype = auto` ({cpu['model']}, flags {', '.join(cpu['flags'])}; measured bfloat16 / "
    f"float32 forward times {shown}). AR in the run's dtype and AR in the other dtype run in "
    "the same process; the speedup is over the faster.",
    "",
    results.markdown_table(rows, tuple(dict.fromkeys(k for r in rows for k in r))),
  ]
