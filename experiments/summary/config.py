"""The summary: every measured drafter per model, temperature and batch size, from the JSON.

    python -m specjax.report experiments/summary      # rewrites README.md and results/summary.json

Nothing is decoded here: the table is assembled from the committed results of the experiments
that measured it (``SOURCES``), one row per (model, temperature, batch, drafter): τ, target
calls per token and the speedup over AR measured in the same process (means over that
experiment's prompt categories), and, where ``experiments/cost_model`` priced the drafter, its
predicted speedup on an H200 (roofline). Combinations no experiment ran are listed as missing.
"""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHIP = "H200"
# (experiment results file, model, temperatures taken from it)
SMOL, QWEN = "SmolLM2-135M", "Qwen2.5-Coder 1.5B + 0.5B"
COST_MODEL = {
  SMOL: "experiments/cost_model/results/smollm2",
  QWEN: "experiments/cost_model/results/qwen",
}
SOURCES = (
  (f"{COST_MODEL[SMOL]}/sweep.json", SMOL, None),
  (f"{COST_MODEL[QWEN]}/sweep.json", QWEN, None),
  ("experiments/eagle_smollm2/results/sweep_b1/sweep.json", SMOL, None),
  ("experiments/temperature_sweep/results/sweep.json", SMOL, (1.0,)),
  ("experiments/eagle_smollm2/results/sweep_t1/sweep.json", SMOL, None),
  ("experiments/speculative_theory/results/qwen/sweep.json", QWEN, None),
)
WANTED = [(m, t, b) for m in (SMOL, QWEN) for t in (0.0, 1.0) for b in (1, 4)]


def get_config(arg: str | None = None):
  raise ValueError(
    "experiments/summary decodes nothing: run python -m specjax.report experiments/summary."
  )


def rows() -> list[dict]:
  """One row per (model, temperature, batch, drafter); the first source measuring it wins."""
  predicted = {}  # (model, variant) -> the chip's predicted speedup
  for model, folder in COST_MODEL.items():
    cm = ROOT / folder / "cost_model.json"
    if cm.exists():
      for r in json.loads(cm.read_text())["rows"]:
        predicted[model, r["variant"]] = r[f"{CHIP}_speedup"]
  out, seen = [], set()
  for path, model, temps in SOURCES:
    record = json.loads((ROOT / path).read_text())
    for s in record["summary"]:
      temp = s.get("temperature", record["config"]["temperature"])
      key = (model, temp, s["batch"], s["variant"])
      if s["variant"] in ("ar", "draft_ar") or key in seen or (temps and temp not in temps):
        continue
      seen.add(key)
      want = (temp, s["batch"], s["variant"])
      runs = [
        r for r in record["runs"] if (r.get("temperature", temp), r["batch"], r["variant"]) == want
      ]
      from_cost_model = path.startswith("experiments/cost_model")
      out.append(
        {
          "model": model,
          "temperature": temp,
          "batch": s["batch"],
          "drafter": s["variant"],
          "tau": s["mean_tau"],
          "calls_per_token": sum(r["target_calls_per_token"] for r in runs) / len(runs),
          "speedup": s["mean_speedup"],
          f"{CHIP}_predicted": predicted.get((model, s["variant"])) if from_cost_model else None,
          "source": path.split("/")[1],
        }
      )
  order = {SMOL: 0, QWEN: 1}
  out.sort(key=lambda r: (order[r["model"]], r["temperature"], r["batch"], r["drafter"]))
  return out


def report(results_dir):
  from specjax import results

  table = rows()
  have = {(r["model"], r["temperature"], r["batch"]) for r in table}
  missing = [w for w in WANTED if w not in have]
  tmp = Path(results_dir) / ".summary.json.tmp"
  tmp.write_text(json.dumps({"rows": table, "missing": missing}, indent=1))
  tmp.replace(Path(results_dir) / "summary.json")
  cols = ("model", "temperature", "batch", "drafter", "tau", "calls_per_token", "speedup",
          f"{CHIP}_predicted", "source")  # fmt: skip
  shown = [{k: "—" if v is None else v for k, v in r.items()} for r in table]
  out = [results.markdown_table(shown, cols), ""]
  out += [
    f"`{CHIP}_predicted`: the drafter's τ predicted offline and priced by the {CHIP} roofline "
    "(`experiments/cost_model`); empty where that experiment did not price the drafter.",
    "",
    "Not measured yet (model, temperature, batch): "
    + ("; ".join(f"{m}, T={t:g}, B={b}" for m, t, b in missing) or "none")
    + ".",
  ]
  return "\n".join(out)
