"""The block_smollm2 experiment's report: the README's results block, from results/.

python -m specjax.report experiments/block_smollm2
"""

import json

from specjax import results as results_lib
from specjax.measure import sweep


def _training(results_dir) -> list[str]:
  """Each training run's last logged step and evaluation, and its decode on the demo prompts."""
  rows = []
  for run in ("train", "requests"):
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
          "batch; demo τ: greedy decoding of the three demo prompts, 7-chain):", "",
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


def report(results_dir):
  """The README's results block: training, step cost, the held-out sweep."""
  out = _training(results_dir) + _step_cost(results_dir)
  path = results_dir / "sweep_requests" / "sweep.json"
  if path.exists():
    out.append(sweep.markdown(json.loads(path.read_text())))
  return "\n".join(out)
