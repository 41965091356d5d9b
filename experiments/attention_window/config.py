"""Attention follows the live length: SmolLM2 on the demo prompts at max_len 256, 1024, 4096.

    bash scripts/install_models.sh smollm2
    python -m specjax.run --config=experiments/attention_window/config.py

Decodes the demo's three chat prompts (96 new tokens each, batch 1, greedy) autoregressively
and with prompt lookup (K = 4), with the KV cache sized for each max_len, all in one process
with interleaved timed passes (task=max_len). Prints tokens/s per size relative to 256 and
writes experiments/attention_window/results/max_len.json. The texts must be identical across
sizes and modes; the target is within 10% of the max_len 256 speed at 4096.
"""

from ml_collections import config_dict

from configs import demo


def get_config():
  c = demo.base()
  c.task = "max_len"
  c.output_dir = "experiments/attention_window/results"
  c.max_len_sweep = config_dict.ConfigDict()
  c.max_len_sweep.sizes = (256, 1024, 4096)  # cache sizes, each compiled once
  c.benchmark.repeats = 3
  return c


def report(results_dir):
  """The README's results block, from results/max_len.json (and before_refit.json)."""
  import json

  from specjax import results

  record = json.loads((results_dir / "max_len.json").read_text())
  rows = [r | {"calls_per_token": r["target_calls_per_token"]} for r in record["runs"]]
  cols = ("mode", "max_len", "tokens", "tau", "calls_per_token", "tokens_per_s", "vs_smallest")
  out = [results.markdown_table(rows, cols), ""]
  out.append(f"Greedy texts identical across sizes and modes: {record['greedy_texts_identical']}.")
  before = results_dir / "before_refit.json"
  if before.exists():
    old = json.loads(before.read_text())
    rows = []
    for name, r in old.items():
      mode, size = name.rsplit("@", 1)
      base = old[f"{mode}@{min(int(k.rsplit('@', 1)[1]) for k in old)}"]
      rows.append(
        {"mode": mode, "max_len": int(size), "tokens_per_s": r["tokens_per_s"],
         "vs_smallest": r["tokens_per_s"] / base["tokens_per_s"]}
      )  # fmt: skip
    out += ["", "Before the refit (commit 47cc7fc, `before_refit.py`, a separate process):", ""]
    out.append(results.markdown_table(rows, ("mode", "max_len", "tokens_per_s", "vs_smallest")))
  return "\n".join(out)
