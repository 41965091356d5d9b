"""task=benchmark: AR and speculative decoding on the same prompts, in one process.

Each mode is run once to compile, then ``benchmark.repeats`` times; the median of those is
the steady-state time. The draft model is also timed alone as an AR decoder, which gives
the cost ratio c = draft step time / target step time. Writes a JSON record and prints a
table; speedups are ratios of times measured in this same run.
"""

import platform
import statistics
import time

import jax
import ml_collections

from specjax import build, results
from specjax.decode import generate

COLUMNS = ("mode", "tokens", "target_calls", "tau", "calls_per_token", "compile_s", "steady_s",
           "tokens_per_s", "speedup")


def _time(fn, repeats: int):
  t0 = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t0
  steady = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = fn()
    steady.append(time.perf_counter() - t0)
  med = statistics.median(steady)
  return out, {"first_call_s": first, "compile_s": max(first - med, 0.0), "steady_s": med,
               "steady_all_s": steady}


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  common = dict(max_new_tokens=req.max_new_tokens, max_len=req.max_len,
                temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed,
                eos_id=req.eos_id)
  modes = {
      "ar": lambda: generate(target.params, target.cfg, req.prompts, **common),
      "speculative": lambda: generate(target.params, target.cfg, req.prompts, drafter=drafter,
                                      drafter_params=dparams, **common),
  }
  if drafter.name == "draft_model":
    modes["draft_ar"] = lambda: generate(dparams, drafter.cfg, req.prompts, **common)

  record = {"config": config.to_dict(), "machine": _machine(), "modes": {}}
  outputs = {}
  for mode, fn in modes.items():
    out, timing = _time(fn, config.benchmark.repeats)
    outputs[mode] = out
    m = out.metrics
    record["modes"][mode] = m | timing | {"tokens_per_s": m["tokens"] / timing["steady_s"]}

  ar, spec = record["modes"]["ar"], record["modes"]["speculative"]
  spec["speedup"] = spec["tokens_per_s"] / ar["tokens_per_s"]
  ar["speedup"] = 1.0
  summary = {"speedup": spec["speedup"], "tau": spec["tau"], "alpha": spec["alpha"]}
  if req.temperature == 0:
    summary["greedy_outputs_identical"] = outputs["ar"].tokens == outputs["speculative"].tokens
  if "draft_ar" in record["modes"]:
    d = record["modes"]["draft_ar"]
    d["speedup"] = d["tokens_per_s"] / ar["tokens_per_s"]
    summary["cost_ratio_c"] = ar["tokens_per_s"] / d["tokens_per_s"]
  record["summary"] = summary

  first = outputs["speculative"].tokens[0]
  shown = target.tokenizer.decode(first) if target.tokenizer else first
  print(f"speculative output, row 0: {shown!r}")
  rows = [{"mode": k, **v, "calls_per_token": v["target_calls_per_token"]}
          for k, v in record["modes"].items()]
  print(results.table(rows, COLUMNS))
  print("summary:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()})
  path = results.write_json(f"{config.output_dir}/benchmark.json", record)
  print(f"wrote {path}")
  return record


def _machine() -> dict:
  dev = jax.devices()[0]
  return {"platform": dev.platform, "device": str(dev.device_kind), "devices": jax.device_count(),
          "jax": jax.__version__, "python": platform.python_version(),
          "processor": platform.processor() or platform.machine()}
