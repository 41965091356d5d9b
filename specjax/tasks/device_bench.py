"""task=device_bench: the benchmark set on whatever device JAX finds, as one JSON record.

    bash scripts/device_bench.sh            # python -m specjax.run --config=configs/device_bench.py

Per drafter in ``device_bench.drafters`` and batch size in ``device_bench.batch_sizes``: AR and
speculative decoding on the same prompts in one process (task=benchmark, each mode compiled
first, then timed) give tokens/s, τ, target calls per token, the speedup and whether greedy
outputs are identical; then the verify-cost curve: one target forward over T tokens against
one token, the number a per-device cost model needs. Writes ``output_dir/device_bench.json``
(each run's full record beside it) and prints a table.
"""

import ml_collections

from specjax import build, results
from specjax.measure import sweep
from specjax.measure.machine import machine as machine_facts
from specjax.tasks import benchmark

COLUMNS = (
  "drafter", "batch", "tau", "calls_per_token", "ar_tokens_per_s", "tokens_per_s", "speedup",
  "greedy_identical",
)  # fmt: skip


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  bench = config.device_bench
  for name in bench.drafters:
    if name not in config.drafter:
      raise ValueError(f"config.device_bench.drafters has {name!r}, which has no config.drafter.")
  machine = machine_facts()
  print(f"device: {machine['platform']} {machine['device']} x{machine['devices']}", flush=True)
  rows = []
  for name in bench.drafters:
    for b in bench.batch_sizes:
      c = config.copy_and_resolve_references()
      c.task, c.batch_size = "benchmark", b
      c.drafter.name = name
      c.output_dir = f"{config.output_dir}/{name}_b{b}"
      rec = benchmark.run(c)
      ar, spec = rec["modes"]["ar"], rec["modes"]["speculative"]
      rows.append(
        {
          "drafter": name,
          "batch": b,
          "tau": spec["tau"],
          "calls_per_token": spec["target_calls_per_token"],
          "ar_tokens_per_s": ar["tokens_per_s"],
          "tokens_per_s": spec["tokens_per_s"],
          "speedup": spec["speedup"],
          "greedy_identical": rec["summary"].get("greedy_outputs_identical"),
        }
      )
  target = build.target(config)
  curve = sweep.verify_cost(target, bench.verify_sizes, config.max_len)
  record = {
    "config": config.to_dict(),
    "machine": machine,
    "dtype": build.dtype(config),
    "runs": rows,
    "verify_cost": curve,
  }
  print(results.table(rows, COLUMNS))
  print(results.table(curve, ("tokens", "ms", "vs_1_token")))
  print(f"wrote {results.write_json(f'{config.output_dir}/device_bench.json', record)}")
  return record
