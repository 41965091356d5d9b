"""task=benchmark: AR and speculative decoding on the same prompts, in one process.

Each mode is run once to compile (saying what compiles), then ``benchmark.repeats`` timed
passes interleave the modes; the median of a mode's passes is its steady-state time
(``specjax/measure/timing.py``). A drafter that is itself a model (a draft model) is also timed
alone as an AR decoder, which gives the cost ratio c = draft step time / target step time.
Writes a JSON record and prints a table; speedups are ratios of times measured in this same
run.
"""

import dataclasses

import jax
import ml_collections

from specjax import baselines, build, drafters, metrics, parallel, profiling, results
from specjax.decode import generate
from specjax.measure import timing
from specjax.measure.machine import machine
from specjax.models import registry

COLUMNS = (
  "mode",
  "tokens",
  "target_calls",
  "tau",
  "calls_per_token",
  "compile_s",
  "steady_s",
  "tokens_per_s",
  "speedup",
)


def run(config: ml_collections.ConfigDict) -> dict:
  parallel.initialize(build.distributed(config))
  build.check(config)
  profiling.check(config)
  target = build.target(config, build.mesh(config))  # an HF directory loads onto it
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  mesh, tparams, dparams = build.placed(config, target, drafter, dparams)
  common = req.generate_kwargs() | {"mesh": mesh}
  modes = {
    "ar": lambda b: generate(tparams, target.cfg, b, **common),
    "speculative": lambda b: generate(
      tparams,
      target.cfg,
      b,
      drafter=drafter,
      drafter_params=dparams,
      verifier=build.verifier(config),
      **common,
    ),
  }
  alone = drafters.FAMILIES[config.drafter.name].price
  if alone is not None and alone.alone is not None:  # the drafter is itself an LM: time it AR
    modes["draft_ar"] = lambda b: generate(dparams, alone.alone(drafter), b, **common)

  record = {"config": config.to_dict(), "machine": machine(), "modes": {}}
  # The drafter as built (num_draft = "auto" settles its knobs only here).
  record["drafter"] = {
    f.name: getattr(drafter, f.name)
    for f in (dataclasses.fields(drafter) if dataclasses.is_dataclass(drafter) else ())
    if isinstance(getattr(drafter, f.name), (bool, int, float, str))
  }
  outputs = {}
  describe = f"{target.cfg.name}, batch {req.batch_size}, max_len {req.max_len}"
  timed = timing.run_modes(modes, req.batches(), config.benchmark.repeats, describe)
  profiling.decode(config, modes["speculative"], req.batches()[0])
  for mode, t in timed.items():
    outs = t.pop("outs")
    outputs[mode] = [row for out in outs for row in out.tokens]
    m = metrics.summarize(metrics.merge([out.counts for out in outs]))
    record["modes"][mode] = m | t | {"tokens_per_s": m["tokens"] / t["steady_s"]}

  ar, spec = record["modes"]["ar"], record["modes"]["speculative"]
  spec["speedup"] = spec["tokens_per_s"] / ar["tokens_per_s"]
  ar["speedup"] = 1.0
  summary = {"speedup": spec["speedup"], "tau": spec["tau"], "alpha": spec["alpha"]}
  summary["num_draft"] = record["drafter"].get("num_draft")
  if req.temperature == 0:
    summary["greedy_outputs_identical"] = outputs["ar"] == outputs["speculative"]
  if "draft_ar" in record["modes"]:
    d = record["modes"]["draft_ar"]
    d["speedup"] = d["tokens_per_s"] / ar["tokens_per_s"]
    summary["cost_ratio_c"] = ar["tokens_per_s"] / d["tokens_per_s"]
  _baselines(config, target, req, ar, summary)
  record["summary"] = summary

  for i, row in enumerate(outputs["speculative"][: len(req.prompts)]):
    shown = target.tokenizer.decode(row) if target.tokenizer else row
    print(f"[{i}] {shown!r}")
  rows = [
    {"mode": k, **v, "calls_per_token": v["target_calls_per_token"]}
    for k, v in record["modes"].items()
  ]
  print(results.table(rows, COLUMNS))
  print("summary:", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.items()})
  path = results.write_json(f"{config.output_dir}/benchmark.json", record)
  print(f"wrote {path}")
  return record


def _baselines(config, target, req, ar: dict, summary: dict) -> None:
  """The memory-bandwidth floor and HF transformers, measured here, as ratios to specjax AR."""
  if config.benchmark.bandwidth_floor:
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(target.params))
    gbs = baselines.streaming_bandwidth_gbs()
    floor_tok_s = gbs * 1e9 / weight_bytes
    summary |= {
      "weight_mb": weight_bytes / 1e6,
      "bandwidth_gbs": gbs,
      "floor_tokens_per_s": floor_tok_s,
      "ar_fraction_of_floor": ar["tokens_per_s"] / floor_tok_s,
    }
  if config.benchmark.hf_baseline:
    if config.target.source != "registry" or config.batch_size != 1:
      raise ValueError(
        "config.benchmark.hf_baseline needs target.source='registry' and batch_size=1."
      )
    hf = baselines.hf_tokens_per_s(
      registry.resolve(config.target.name),
      req.prompts,
      req.max_new_tokens,
      repeats=config.benchmark.repeats,
    )
    summary |= {"hf": hf, "ar_vs_hf": ar["tokens_per_s"] / hf["tokens_per_s"]}
