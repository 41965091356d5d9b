"""task=device_bench: the benchmark set on whatever device JAX finds, as one JSON record.

    bash scripts/device_bench.sh            # python -m specjax.run --config=configs/device_bench.py

Per entry of ``device_bench.drafters`` (a drafter as ``config.drafter`` sets it, or a label of
``device_bench.variants``: label -> drafter overrides, e.g. a block drafter's tree), dtype in
``device_bench.dtypes``
(default: the config's) and batch size in ``device_bench.batch_sizes``: AR and speculative
decoding on the same prompts in one process (task=benchmark, each mode compiled
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
  "drafter", "dtype", "batch", "tau", "calls_per_token", "baseline", "ar_tokens_per_s",
  "tokens_per_s", "speedup", "greedy_identical",
)  # fmt: skip


def _runs(config) -> list[tuple[str, ml_collections.ConfigDict]]:
  """``(label, config)`` per benchmark: each of ``device_bench.drafters``, a ``config.drafter``
  section's name (that drafter as set) or a label of ``device_bench.variants`` (label ->
  drafter overrides, as a sweep's), in each of ``device_bench.dtypes``; every one checked
  before any model loads."""
  bench = config.device_bench
  variants = dict(bench.get("variants") or {})
  for name in bench.drafters:
    if name not in variants and name not in config.drafter:
      raise ValueError(
        f"config.device_bench.drafters has {name!r}, which is neither a config.drafter section "
        f"nor a label of config.device_bench.variants ({', '.join(variants) or 'none'})."
      )
  sweep.check_sizes(bench.batch_sizes, "config.device_bench.batch_sizes")
  if bench.get("verify_sizes"):
    sweep.check_sizes(bench.verify_sizes, "config.device_bench.verify_sizes", verify=True)
  dtypes = tuple(bench.get("dtypes") or (config.dtype,))
  bad = [d for d in dtypes if d not in build.DTYPES]
  if bad:
    raise ValueError(
      f"config.device_bench.dtypes has {bad}; each is one of {', '.join(build.DTYPES)}."
    )
  runs = []
  for dtype in dtypes:
    for name in bench.drafters:
      c = sweep.variant_config(config, dict(variants.get(name, {"name": name})))
      c.dtype = dtype
      build.check(c)
      runs.append((name, c))
  resolved = [(name, build.dtype(c)) for name, c in runs]  # auto: what it is here
  if len(set(resolved)) < len(resolved):
    raise ValueError(
      f"config.device_bench.dtypes={dtypes} runs a drafter twice in one dtype here (auto is "
      f"{build.dtype(config)}): list each dtype once."
    )
  return runs


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  bench = config.device_bench
  runs = _runs(config)
  several = len({c.dtype for _, c in runs}) > 1
  machine = machine_facts()
  print(f"device: {machine['platform']} {machine['device']} x{machine['devices']}", flush=True)
  rows = []
  for label, base in runs:
    dtype = build.dtype(base)
    for b in bench.batch_sizes:
      c = base.copy_and_resolve_references()
      c.task, c.batch_size = "benchmark", b
      c.output_dir = f"{config.output_dir}/{label}_b{b}" + (f"_{dtype}" if several else "")
      rec = benchmark.run(c)
      spec, baseline = rec["modes"]["speculative"], rec["summary"]["baseline"]
      rows.append(
        {
          "drafter": label,
          "dtype": dtype,
          "batch": b,
          "tau": spec["tau"],
          "calls_per_token": spec["target_calls_per_token"],
          "baseline": baseline,  # the fastest AR beside it (benchmark's summary.baseline)
          "ar_tokens_per_s": rec["modes"][baseline]["tokens_per_s"],
          "tokens_per_s": spec["tokens_per_s"],
          "speedup": rec["summary"]["speedup"],
          "greedy_identical": rec["summary"].get("greedy_outputs_identical"),
        }
      )
  curves = {}
  for _, c in runs:  # one verify-cost curve per dtype
    dtype = build.dtype(c)
    if dtype not in curves:
      curves[dtype] = sweep.verify_cost(build.target(c), bench.verify_sizes, config.max_len)
  record = {
    "config": config.to_dict(),
    "machine": machine,
    "dtype": build.dtype(runs[0][1]),  # the first run's (one dtype: every run's)
    "dtypes": list(curves),
    "runs": rows,
    "verify_cost": curves[build.dtype(runs[0][1])],
    "verify_cost_by_dtype": curves,
  }
  print(results.table(rows, COLUMNS))
  for dtype, curve in curves.items():
    print(f"verify cost ({dtype}):")
    print(results.table(curve, ("tokens", "ms", "vs_1_token")))
  print(f"wrote {results.write_json(f'{config.output_dir}/device_bench.json', record)}")
  return record
