"""What a token costs inside the decode loop, with and without the weights' barrier: AR and
prompt lookup (K = 4) on SmolLM2-135M-Instruct, float32 and bfloat16, batch 1, 64 new tokens.

    python experiments/verify_cost/loop_cost.py          # ~4 min on 2 CPU cores

``loop._step`` takes the weights through ``jax.lax.optimization_barrier`` with the loop's key.
Without it, XLA hoists work on the loop-invariant weights out of the while loop: on a CPU it
converts bfloat16 weights to a float32 copy once and runs every step's products on that copy.
Each mode runs in its own process (``--mode off`` replaces the barrier by the identity before
specjax is imported); a cell is the median of 3 timed decodes after a compiling one, in
milliseconds per generated token. Writes ``results/loop_cost.json``.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository's configs
PROMPT = "Repeat this list twice: apples, pears, plums, cherries, grapes, lemons, limes, figs."


def measure() -> dict:
  from configs import demo
  from specjax import build
  from specjax.decode import generate
  from specjax.drafters.prompt_lookup import PromptLookup

  out = {}
  for dtype in ("float32", "bfloat16"):
    c = demo.base()
    c.dtype = dtype
    target = build.target(c)
    prompt = target.tokenizer.encode(PROMPT)
    for name, kw in (("ar", {}), ("lookup_k4", {"drafter": PromptLookup(num_draft=4)})):
      args = (target.params, target.cfg, [prompt])
      g, times = generate(*args, max_new_tokens=64, max_len=256, **kw), []
      for _ in range(3):
        t0 = time.perf_counter()
        g = generate(*args, max_new_tokens=64, max_len=256, **kw)
        times.append(time.perf_counter() - t0)
      out.setdefault(dtype, {})[name] = statistics.median(times) / len(g.tokens[0]) * 1e3
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--mode", choices=("on", "off", "both"), default="both")
  ap.add_argument("--out", default=str(HERE / "results" / "loop_cost.json"))
  args = ap.parse_args()
  if args.mode != "both":
    if args.mode == "off":
      import jax

      jax.lax.optimization_barrier = lambda x: x
    print(json.dumps(measure()))
    return
  record = {"prompt": PROMPT, "max_new_tokens": 64, "ms_per_token": {}}
  for mode in ("off", "on"):
    done = subprocess.run([sys.executable, __file__, "--mode", mode], check=True,
                          capture_output=True, text=True)  # fmt: skip
    record["ms_per_token"][f"barrier_{mode}"] = json.loads(done.stdout.strip().splitlines()[-1])
  sys.path.insert(0, str(HERE))
  from verify_cost import write_json

  write_json(Path(args.out), record)
  print(report_table(record))


def report_table(record: dict) -> str:
  from specjax import results

  rows = []
  for mode, cells in record["ms_per_token"].items():
    for dtype, by in cells.items():
      rows.append({"barrier": mode.removeprefix("barrier_"), "dtype": dtype} | by)
  return results.markdown_table(rows, tuple(rows[0]))


if __name__ == "__main__":
  main()
