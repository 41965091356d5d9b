"""task=benchmark: AR and speculative decoding on the same prompts, in one process.

Each mode is run once to compile (saying what compiles), then ``benchmark.repeats`` timed
passes interleave the modes; the median of a mode's passes is its steady-state time
(``specjax/measure/timing.py``). A drafter that is itself a model (a draft model) is also timed
alone as an AR decoder, which gives the cost ratio c = draft step time / target step time.
Writes a JSON record and prints a table; speedups are ratios of times measured in this same
run, over the fastest AR it measured.

AR runs as the speculative run does (its dtype, its ``forward_rows``): greedy output is checked
against it. Where that AR is not the fastest this machine has, the faster ones run beside it,
so that no speedup is over a slow baseline: AR at one row each forward when the run uses
``forward_rows`` (``ar_one_row``), and AR in the other dtype when ``dtype = auto`` measured
the choice on this CPU (``ar_float32`` or ``ar_bfloat16``, weights cast from the run's).
``summary.speedup`` is over the fastest of them (``summary.baseline``), ``speedup_vs_ar``
over AR as the run decodes, ``summary.dtype`` how the dtype was chosen.
"""

import dataclasses

import jax
import ml_collections

from specjax import baselines, build, drafters, metrics, parallel, profiling, results
from specjax.decode import generate
from specjax.measure import timing
from specjax.measure.machine import machine
from specjax.models import llama, registry

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
  hf_baseline = config.benchmark.get("hf_baseline")
  if hf_baseline and (config.target.source != "registry" or config.batch_size != 1):
    raise ValueError(
      "config.benchmark.hf_baseline=True needs config.target.source='registry' and "
      "config.batch_size=1 (HF decodes one row of a registry model's GGUF)."
    )
  target = build.target(config, build.mesh(config))  # an HF directory loads onto it
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target, drafter)
  mesh, tparams, dparams = build.placed(config, target, drafter, dparams)
  common = req.generate_kwargs() | {"mesh": mesh}
  modes = {
    "ar": lambda b: generate(tparams, target.cfg, b, **common),
    **_faster_ar(config, tparams, target.cfg, common),
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
  ars = [m for m in record["modes"] if m == "ar" or m.startswith("ar_")]
  baseline = max(ars, key=lambda m: record["modes"][m]["tokens_per_s"])
  for m in record["modes"].values():
    m["speedup"] = m["tokens_per_s"] / record["modes"][baseline]["tokens_per_s"]
  summary = {"speedup": spec["speedup"], "baseline": baseline, "tau": spec["tau"]}
  summary |= {"alpha": spec["alpha"], "num_draft": record["drafter"].get("num_draft")}
  if baseline != "ar":
    summary["speedup_vs_ar"] = spec["tokens_per_s"] / ar["tokens_per_s"]
  summary["dtype"] = build.dtype_choice(config)
  summary["forward_rows"] = req.forward_rows
  if req.temperature == 0:
    summary["greedy_outputs_identical"] = outputs["ar"] == outputs["speculative"]
    if build.dtype(config) != "float32" and not req.forward_rows:
      summary["greedy_exactness"] = (
        f"off: {build.dtype(config)} with forward_rows = 0 (each forward its own rows) rounds a "
        "one-row step and a verify apart, so greedy text may leave AR's at near-ties"
      )
    if "ar_one_row" in outputs:
      summary["greedy_equal_to_one_row_ar"] = outputs["ar_one_row"] == outputs["speculative"]
  if "draft_ar" in record["modes"]:
    d = record["modes"]["draft_ar"]
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


def _faster_ar(config, tparams, cfg, common: dict) -> dict:
  """The AR modes that may beat AR as the run decodes it (the module docstring): at one row
  each forward, and in the other dtype when ``dtype = auto`` measured this CPU."""
  modes = {}
  one_row = common | {"forward_rows": 0}
  if common["forward_rows"]:
    modes["ar_one_row"] = lambda b: generate(tparams, cfg, b, **one_row)
  if build.dtype_choice(config)["how"].startswith("measured"):
    other = "float32" if build.dtype(config) == "bfloat16" else "bfloat16"
    cast = llama.cast(tparams, other)
    modes[f"ar_{other}"] = lambda b: generate(cast, cfg, b, **one_row)
  return modes


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
    hf = baselines.hf_tokens_per_s(
      registry.resolve(config.target.name),
      req.prompts,
      req.max_new_tokens,
      repeats=config.benchmark.repeats,
    )
    summary |= {"hf": hf, "ar_vs_hf": ar["tokens_per_s"] / hf["tokens_per_s"]}
