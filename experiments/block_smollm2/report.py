"""The block_smollm2 experiment's report: the README's results block, from results/.

python -m specjax.report experiments/block_smollm2
"""

import json
import math

import numpy as np

from specjax import results as results_lib
from specjax.measure import sweep


def _training(results_dir) -> list[str]:
  """Each training run's last logged step and evaluation, and its decode on the demo prompts."""
  rows = []
  runs = ("train", "requests", "peagle", "dspark", "block16", "block16_requests", "block4",
          "block4_requests")  # fmt: skip
  for run in runs:
    path = results_dir / run / "train.json"
    if not path.exists():
      continue
    record = json.loads(path.read_text())
    last, evaluation = record["last"][0], (record["eval"] or [{}])[0]
    decode = record.get("decode", {})
    rows.append({
      "run": run,
      "steps": last["step"],
      "train_min": round(record["train_s"] / 60, 1),
      "loss": round(last["loss"], 3),
      "top1_first": round(last["top1_first"], 3),
      "accept_len": round(last["accept_len"], 3),
      "eval_accept_len": round(evaluation.get("eval/accept_len", float("nan")), 3),
      "demo_tau_init": round(decode.get("init", {}).get("tau", float("nan")), 3),
      "demo_tau_final": round(decode.get("final", {}).get("tau", float("nan")), 3),
    })  # fmt: skip
  if not rows:
    return []
  return ["Training (`accept_len`: the greedy block chain's expected accepted length on the "
          "batch; demo τ: greedy decoding of the three demo prompts as a chain over the block, "
          "7 for DFlash, 8 for P-EAGLE; P-EAGLE's init: the EAGLE-3 it starts from, "
          "mask_hidden fresh):", "",
          results_lib.markdown_table(rows, tuple(rows[0])), ""]  # fmt: skip


def _step_cost(results_dir) -> list[str]:
  path = results_dir / "step_cost.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  rows = []
  for dtype, by_program in record["vs_ar_step"].items():
    for program, by_block in by_program.items():
      rows.append({"dtype": dtype, "step": program}
                  | {f"block {b}": round(v, 3) for b, v in by_block.items()})  # fmt: skip
  cpu = record["machine"].get("cpu_model", "")
  return [f"One drafter step over one AR step's forward (batch 1, {record['context']} cached "
          f"tokens; {cpu}):", "", results_lib.markdown_table(rows, tuple(rows[0])), ""]  # fmt: skip


def _curve(results_dir) -> list[str]:
  """1.'s held-out ``accept_len`` against log2(steps), fitted from step 300 on: its gain per
  doubling, and the steps a log-linear continuation would need to reach EAGLE's τ."""
  path = results_dir / "train" / "metrics.jsonl"
  if not path.exists():
    return []
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  pts = [
    (r["step"], r["eval/accept_len"]) for r in rows if "eval/accept_len" in r and r["step"] >= 300
  ]
  if len(pts) < 3:
    return []
  slope, icept = np.polyfit(np.log2([s for s, _ in pts]), [a for _, a in pts], 1)
  need = {t: 2 ** ((t - icept) / slope) for t in (2.0, 2.16)}
  return [
    f"1.'s held-out accept_len (the 7-chain's greedy τ on its 32 held-out rows) gains "
    f"{slope:.3f} per doubling of steps (steps 300-{pts[-1][0]}); continued log-linearly it "
    f"would reach 2.0 at ~{math.ceil(need[2.0] / 100) * 100:,} steps and 2.16 (EAGLE "
    f"`:requests`' tree and lookup branch on the held-out prompts) at "
    f"~{math.ceil(need[2.16] / 100) * 100:,}: an extrapolation, not a run.", "",
  ]  # fmt: skip


def _break_even(record) -> list[str]:
  """Per variant, over the categories: τ, speedup, and a step's cost in AR steps (τ / speedup:
  the τ it would need to break even at the cost it has here), and acceptance by depth."""
  runs = [r for r in record["runs"] if r["variant"] != "ar"]
  rows = []
  temps = sorted({r.get("temperature", 0.0) for r in runs})
  for v, temp in [(v, t) for t in temps for v in dict.fromkeys(r["variant"] for r in runs)]:
    mine = [r for r in runs if r["variant"] == v and r.get("temperature", 0.0) == temp]
    attempts = np.sum([r["position_attempts"] for r in mine], axis=0)
    accepted = np.sum([[a * n for a, n in zip(r["alpha"], r["position_attempts"], strict=True)]
                       for r in mine], axis=0)  # fmt: skip
    alpha = [f"{a / n:.2f}" if n else "-" for a, n in zip(accepted, attempts, strict=True)][:4]
    rows.append({
      "variant": v,
      **({"temperature": temp} if len(temps) > 1 else {}),
      "tau": round(float(np.mean([r["tau"] for r in mine])), 3),
      "speedup": round(float(np.mean([r["speedup"] for r in mine])), 3),
      "step_in_ar_steps": round(float(np.mean([r["tau"] / r["speedup"] for r in mine])), 2),
      "alpha_by_depth_1_4": " ".join(alpha),
    })  # fmt: skip
  n = len({r["category"] for r in runs})
  return [f"Per variant, means over the {n} categories; a step's cost in AR steps is τ / "
          "speedup, the τ at which it would break even:", "",
          results_lib.markdown_table(rows, tuple(rows[0])), ""]  # fmt: skip


def figure(results_dir) -> bool:
  """results/figure.png: run 1.'s held-out accept_len against steps (log axis) with the fitted
  line, and τ per held-out category per variant. False until both records are there."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  metrics, sweep_json = (
    results_dir / "train" / "metrics.jsonl",
    results_dir / "sweep_requests" / "sweep.json",
  )
  if not metrics.exists() or not sweep_json.exists():
    return False
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  pts = [(r["step"], r["eval/accept_len"]) for r in rows if "eval/accept_len" in r]
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  left.plot([s for s, _ in pts], [a for _, a in pts], "o-", label="held-out accept_len")
  fit = [(s, a) for s, a in pts if s >= 300]
  slope, icept = np.polyfit(np.log2([s for s, _ in fit]), [a for _, a in fit], 1)
  xs = np.geomspace(300, 16000, 50)
  left.plot(xs, slope * np.log2(xs) + icept, "--", label=f"fit: +{slope:.3f} per doubling")
  left.axhline(2.16, color="gray", lw=0.8, label="EAGLE :requests' held-out τ")
  left.set(xscale="log", xlabel="training steps", ylabel="7-chain τ", title="DFlash run 1.")
  left.legend(fontsize=8)
  runs = [r for r in json.loads(sweep_json.read_text())["runs"] if r["variant"] != "ar"]
  variants = list(dict.fromkeys(r["variant"] for r in runs))
  cats = list(dict.fromkeys(r["category"] for r in runs))
  width = 0.8 / len(variants)
  for i, v in enumerate(variants):
    taus = [next(r["tau"] for r in runs if r["variant"] == v and r["category"] == c) for c in cats]
    right.bar(np.arange(len(cats)) + i * width, taus, width, label=v)
  right.set(xticks=np.arange(len(cats)) + 0.4 - width / 2, ylabel="greedy τ",
            title="Held-out prompts, batch 1, float32")  # fmt: skip
  right.set_xticklabels(cats)
  right.legend(fontsize=7)
  results_lib.save_figure(fig, results_dir / "figure.png")
  return True


def report(results_dir):
  """The README's results block: training, its curve, step cost, the held-out sweep."""
  out = _training(results_dir) + _curve(results_dir) + _step_cost(results_dir)
  if figure(results_dir):
    out += ["![training curve and tau per category](results/figure.png)", ""]
  for name, what in (
    ("sweep_requests", "DFlash beside EAGLE `:requests` and prompt lookup"),
    ("sweep_peagle", "P-EAGLE beside the served EAGLE-3 and prompt lookup"),
    ("sweep_dspark", "DSpark (DFlash with the Markov head) beside 2.'s DFlash"),
    ("sweep_blocks", "DFlash chains of 3, 7 and 15 (blocks of 8 and 16), at T = 0 and 1"),
    ("sweep_block4", "DFlash 3-chains trained in blocks of 4 and of 8, at T = 0 and 1"),
  ):
    path = results_dir / name / "sweep.json"
    if path.exists():
      record = json.loads(path.read_text())
      out += [f"`:{name}` ({what}, one process):", ""]
      out += _break_even(record) + [sweep.markdown(record), ""]
  out += _specbench(results_dir / "specbench_bf16") + _specbench(results_dir / "specbench_f32")
  return "\n".join(out).rstrip()


def _specbench(directory) -> list[str]:
  """7. and 7b.: per method, Spec-Bench's overall τ and speedup (and its best and worst
  column), and how many greedy answers leave AR's (where, and the logit gap)."""
  path = directory / "specbench.json"
  if not path.exists():
    return []
  record = json.loads(path.read_text())
  if "columns" not in record:  # a run still under way
    return []
  cols, m = record["columns"], record["machine"]
  cpu = m.get("cpu", {})
  cpu = f"{cpu['model']} ({' '.join(cpu['flags'])})" if cpu else m["device"]
  keys = [k for k in cols if k != "overall"]
  differ = {}
  for d in record.get("greedy_differences", []):
    differ.setdefault(d["method"], []).append(d)
  rows = []
  for method in record["methods"]:
    if method == "vanilla":
      continue
    speed = {cols[k]["title"].split()[0]: cols[k][method]["speedup"] for k in keys}
    best, worst = max(speed, key=speed.get), min(speed, key=speed.get)
    gaps = [abs(d["logit_gap"]) for d in differ.get(method, [])]
    rows.append({
      "method": method,
      "tau": f"{cols['overall'][method]['tau']:.2f}",
      "speedup": f"{cols['overall'][method]['speedup']:.2f}x",
      "best column": f"{best} {speed[best]:.2f}x",
      "worst column": f"{worst} {speed[worst]:.2f}x",
      "answers leaving AR's": len(differ.get(method, [])),
      "largest logit gap there": f"{max(gaps):.3f}" if gaps else "-",
    })  # fmt: skip
  ar = cols["overall"]["vanilla"].get("tokens_per_s")
  head = (f"Spec-Bench's {record['questions']}-question subset, {record['config']['dtype']}, "
          f"greedy, {record['config']['max_new_tokens']} new tokens, batch 1, {cpu}"
          + (f"; AR {ar:.1f} tokens/s" if ar else ""))  # fmt: skip
  if record["config"]["dtype"] == "float32":
    same = "every" if record["greedy_outputs_identical"] else "not every"
    return [
      f"`:specbench_float32` (7b.): {head}, AR and each method alternating per question "
      f"(the run shared the two cores with training jobs); {same} greedy answer equals AR's:",
      "", results_lib.markdown_table(rows, tuple(rows[0])), "",
    ]  # fmt: skip
  return [
    f"`:specbench` (7.): {head} (the run shared the two cores with this "
    "experiment's training and sweeps: AR and each method alternate per question, so a "
    "ratio is of neighbours, but the absolute rates are low). A greedy answer that leaves "
    "AR's does so "
    "at a near-tie of bfloat16 logits (a verify's rows and an AR step round differently; "
    "issue: exact bfloat16 greedy); it is recorded and the run goes on:", "",
    results_lib.markdown_table(rows, tuple(rows[0])), "",
  ]  # fmt: skip
