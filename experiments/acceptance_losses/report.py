"""The acceptance_losses experiment's report: the README's results block and the τ curve
figure, from its results/ (``python -m specjax.report experiments/acceptance_losses``)."""

import json
from pathlib import Path

from experiments.acceptance_losses.config import RUNS
from specjax import results
from specjax.measure import sweep
from specjax.tasks import specbench_report


def _record(results_dir: Path, run: str) -> tuple[dict, list[dict]] | None:
  """A run's train.json and its metrics records, if it has finished."""
  path = results_dir / run / "train.json"
  if not path.exists():
    return None
  lines = (results_dir / run / "metrics.jsonl").read_text().splitlines()
  return json.loads(path.read_text()), [json.loads(ln) for ln in lines if ln.strip()]


def _objective(record: dict) -> str:
  o = record["config"]["objective"]["eagle"]
  what = o["loss"] + (f" + HASS top-{o['hass_top_k']}" if o["hass_top_k"] else "")
  return what + (f", {o['rollout']}-step rollout" if o["rollout"] != 2 else "")


def _training(results_dir: Path) -> tuple[list[str], dict]:
  rows, curves = [], {}
  for run in RUNS:
    got = _record(results_dir, run)
    if got is None:
      continue
    record, metrics = got
    curve = {m["step"]: m["tau/simulated"] for m in metrics if "tau/simulated" in m}
    curves[run] = curve
    check = record.get("tau_check", {})
    evaluation = (record["eval"] or [{}])[0]
    rows.append({
      "run": run,
      "token term": _objective(record),
      "train_min": round(record["train_s"] / 60, 1),
      "eval_top1": round(evaluation.get("eval/top1", float("nan")), 3),
      **{f"τ sim @{s}": round(t, 3) for s, t in sorted(curve.items())},
      "τ decoded": round(check.get("decoded", float("nan")), 3),
      "sim vs decoded": f"{abs(check['simulated'] / check['decoded'] - 1):.1%}" if check else "",
    })  # fmt: skip
  if not rows:
    return [], curves
  cols = tuple(dict.fromkeys(k for r in rows for k in r))
  return [
    "Training (300 steps from `eagle_smollm2:eagle3_serve` on `:requests`' rows; τ: the 16-node "
    "EAGLE-2 tree with the lookup branch, greedy, over the 12 held-out chat, new-chat and code "
    "prompts, 64 tokens; `τ sim @s`: the simulator's replay at step s; `τ decoded`: a real "
    "decode of the same prompts with the final drafter):",
    "",
    results.markdown_table(rows, cols),
    "",
    "![τ on the training curve](results/tau_curve.png)",
    "",
  ], curves


def _figure(results_dir: Path, curves: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  for run, curve in curves.items():
    steps = sorted(curve)
    ax.plot(steps, [curve[s] for s in steps], marker="o", label=run)
  ax.set_xlabel("step (continued from eagle3_serve)")
  ax.set_ylabel("simulated τ (held-out prompts)")
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(results_dir / "tau_curve.png", dpi=110)
  plt.close(fig)


def _sweep(results_dir: Path) -> list[str]:
  path = results_dir / "sweep" / "sweep.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  rows = [r for r in record["runs"] if r["variant"] != "ar"]
  table = [{"category": r["category"], "variant": r["variant"], "tau": round(r["tau"], 3),
            "speedup": round(r["speedup"], 2), "identical": r.get("identical")}
           for r in rows]  # fmt: skip
  means = sweep.mean_rows("sweep", record)
  return [
    "Decoded (`:sweep`: greedy, batch 1, 64 tokens, each drafter beside AR in one process, "
    f"{record['dtype']['dtype']}; {record['machine']['cpu']['model']}, flags "
    f"{', '.join(record['machine']['cpu']['flags'])}):",
    "",
    results.markdown_table(means, tuple(means[0])),
    "",
    results.markdown_table(table, tuple(table[0])),
    "",
  ]


def _specbench(results_dir: Path, name: str) -> list[str]:
  """``:specbench`` (or ``:specbench_later``): τ per Spec-Bench column for each trained
  drafter and EAGLE :requests'."""
  path = results_dir / name / "specbench.json"
  record = specbench_report.finished(path)
  if record is None:
    return []
  cols = record["columns"]
  methods = [m for m in record["methods"] if m != "vanilla"]
  rows = []
  for m in methods:
    cells = {cols[k]["title"]: round(cols[k][m]["tau"], 2) for k in cols}
    rows.append({"drafter": m} | cells | {"speedup": round(cols["overall"][m]["speedup"], 2)})
  cpu = record["machine"]["cpu"]
  return [
    f"Spec-Bench (`:{name}`: the first {record['config']['specbench']['per_category']} "
    f"questions of each category, {record['questions']} first turns, "
    f"{record['config']['max_new_tokens']} new tokens, greedy, {record['dtype']['dtype']}, each "
    f"drafter beside AR; {cpu['model']}, flags {', '.join(cpu['flags'])}): τ per column, the "
    "overall speedup; "
    + (
      "every answer equal to AR's"
      if record["greedy_outputs_identical"]
      else "NOT every answer equal to AR's"
    )  # fmt: skip
    + f" (`greedy_outputs_identical`: {record['greedy_outputs_identical']}).",
    "",
    results.markdown_table(rows, tuple(rows[0])),
    "",
  ]


def report(results_dir) -> str:
  results_dir = Path(results_dir)
  lines, curves = _training(results_dir)
  if curves:
    _figure(results_dir, curves)
  spec = _specbench(results_dir, "specbench") + _specbench(results_dir, "specbench_later")
  return "\n".join(lines + _sweep(results_dir) + spec)
