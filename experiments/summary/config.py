"""The summary: every measured drafter per model, temperature and batch size, from the JSON.

    python -m specjax.run --config=experiments/summary/config.py:smollm2   # batch 4, T 0 and 1
    python -m specjax.run --config=experiments/summary/config.py:qwen      # T 1; batch 4, T 0 and 1
    python -m specjax.report experiments/summary      # rewrites README.md and results/summary.json

The table is assembled from the committed results of the experiments that measured it
(``SOURCES``), one row per (model, temperature, batch, drafter): τ, target calls per token and
the speedup over AR measured in the same process (means over that experiment's prompt
categories), and, where ``experiments/cost_model`` priced the drafter, its predicted speedup on
an H200 (the measured τ over the H200 roofline's step cost). The two runs above (task=sweep)
measure the cells no other experiment covers: SmolLM2 at batch 4 with the temperature sweep's
drafters, and the Qwen pair at temperature 1 and batch 4. Combinations nothing ran are listed
as missing.
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
  ("experiments/summary/results/smollm2/sweep.json", SMOL, None),
  ("experiments/summary/results/qwen/sweep.json", QWEN, None),
)
WANTED = [(m, t, b) for m in (SMOL, QWEN) for t in (0.0, 1.0) for b in (1, 4)]


def get_config(arg: str | None = None):
  """task=sweep over the cells the other experiments leave out (``smollm2`` or ``qwen``)."""
  from configs import demo, qwen_coder_pair
  from experiments import held_out
  from experiments.cost_model import config as cost_model
  from experiments.temperature_sweep import config as temperature_sweep
  from specjax.tasks import sweep

  if arg not in ("smollm2", "qwen"):
    raise ValueError(
      f"experiments/summary/config.py needs smollm2 or qwen (got {arg!r}); the table itself: "
      "python -m specjax.report experiments/summary."
    )
  c = demo.base() if arg == "smollm2" else qwen_coder_pair.get_config()
  c.task = "sweep"
  c.output_dir = f"experiments/summary/results/{arg}"
  c.max_new_tokens = 64
  c.max_len = 384
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  c.benchmark.repeats = 1
  c.sweep = sweep.default_config()
  c.sweep.temperatures = (0.0, 1.0)
  c.sweep.verify_sizes = ()
  if arg == "smollm2":  # the temperature sweep's drafters at batch 4 (ragged rows, per-row accept)
    c.drafter.draft_model.num_layers = 8
    c.sweep.batch_sizes = (4,)
    c.sweep.categories = {k: held_out.CATEGORIES[k] for k in ("chat", "code")}
    c.sweep.variants = temperature_sweep.variants()
  else:  # T = 0 at batch 1 is experiments/cost_model's; it is measured again here alongside
    c.sweep.batch_sizes = (1, 4)
    c.sweep.categories = {"code": tuple(c.prompts)}
    v = cost_model.qwen_variants()
    c.sweep.variants = {k: v[k] for k in ("draft_k4", "lookup_k4")}
  return c


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
