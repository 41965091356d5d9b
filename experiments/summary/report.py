"""The summary experiment's report: the README's results block,
from results/.

    python -m specjax.report experiments/summary
"""

import json
from pathlib import Path

from experiments.summary.config import CHIP, COST_MODEL, QWEN, ROOT, SMOL, SOURCES, WANTED
from specjax import results


def _drafter_section(base: dict, override: dict) -> tuple[str, dict]:
  """The drafter a sweep variant runs: its name and its whole subsection (the record's base
  drafter config under the variant's overrides)."""
  name = override.get("name", base["name"])
  section = base.get(name, {}) | override.get(name, {})
  if name == "draft_model" and section.get("source") == "model":
    section.pop("num_layers", None)  # read only when the draft truncates the target
  return name, section


def _same(a: tuple[str, dict], b: tuple[str, dict]) -> bool:
  """Same drafter and the same values for every field both records have (records written
  before a field existed lack it)."""
  return a[0] == b[0] and all(a[1][k] == b[1][k] for k in a[1].keys() & b[1].keys())


def _step_ratios() -> list:
  """``[(model, drafter, step seconds / AR step seconds on CHIP)]`` for every drafter
  ``experiments/cost_model`` priced (its roofline at batch 1)."""
  out = []
  for model, folder in COST_MODEL.items():
    cm = ROOT / folder / "cost_model.json"
    if cm.exists():
      record = json.loads(cm.read_text())
      for r in record["rows"]:
        if f"{CHIP}_step_vs_ar" in r:
          drafter = _drafter_section(record["config"]["drafter"], r["drafter"])
          out.append((model, drafter, r[f"{CHIP}_step_vs_ar"]))
  return out


def rows() -> list[dict]:
  """One row per (model, temperature, batch, drafter); the first source measuring it wins."""
  ratios = _step_ratios()
  out, seen = [], set()
  for path, model, temps in SOURCES:
    if not (ROOT / path).exists():  # not run yet: its cells are listed as missing
      continue
    record = json.loads((ROOT / path).read_text())
    variants = record["config"]["sweep"]["variants"]
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
      # The measured τ priced on the chip: a fraction `a` of the calls were one-token steps.
      drafter = _drafter_section(record["config"]["drafter"], variants[s["variant"]])
      ratio = next((r for m, d, r in ratios if m == model and _same(d, drafter)), None)
      a = sum(r.get("abstained_calls", 0) for r in runs) / sum(r["target_calls"] for r in runs)
      chip = s["mean_tau"] / (a + (1 - a) * ratio) if ratio and s["batch"] == 1 else None
      out.append(
        {
          "model": model,
          "temperature": temp,
          "batch": s["batch"],
          "drafter": s["variant"],
          "tau": s["mean_tau"],
          "calls_per_token": sum(r["target_calls_per_token"] for r in runs) / len(runs),
          "speedup": s["mean_speedup"],
          f"{CHIP}_predicted": chip,
          "source": path.split("/")[1],
        }
      )
  order = {SMOL: 0, QWEN: 1}
  out.sort(key=lambda r: (order[r["model"]], r["temperature"], r["batch"], r["drafter"]))
  return out


def report(results_dir):

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
    f"`{CHIP}_predicted`: the measured τ priced with the {CHIP} roofline's step cost for that "
    "drafter (`experiments/cost_model`: one step with it over one AR step, at batch 1; steps "
    "where the drafter abstained priced as AR steps); empty at batch 4 and for drafters that "
    "experiment did not price.",
    "",
    "Not measured yet (model, temperature, batch): "
    + ("; ".join(f"{m}, T={t:g}, B={b}" for m, t, b in missing) or "none")
    + ".",
  ]
  return "\n".join(out)
