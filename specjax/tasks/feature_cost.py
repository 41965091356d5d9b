"""task=feature_cost: what asking for target features costs, in the compiled program and in time.

    python -m specjax.run --config=experiments/feature_cost/config.py

Drafters that read no target features (AR, prompt lookup, Lookahead, a draft model) must pay
nothing for the feature path. For AR and the configured drafter, this task compiles the whole
generation three ways: as is (``feature_layers = ()``), and wrapped to ask for the final
hidden state or for three layers (EAGLE-3's choice) and to keep, per row, the newest valid one
in its state, as a Medusa or EAGLE drafter does (features nobody uses are dropped by XLA, so a
wrapper that only asked would measure nothing). For each it reads
XLA's cost analysis of the compiled program (flops, bytes accessed), counts the optimised HLO
instructions, and times decoding with interleaved passes in this process. Writes
``feature_cost.json`` and prints a table.
"""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import build, decode, metrics, results, sampling
from specjax.drafters.base import Prefill, Verdict, WithFeatures
from specjax.tasks import timing
from specjax.tasks.benchmark import machine

COLUMNS = ("mode", "features", "hlo_ops", "gflops", "gbytes", "tokens_per_s", "vs_none")


class KeepFeatures(WithFeatures):
  """``inner`` plus the newest valid target feature of every row, kept in the drafter state
  (what Medusa heads and EAGLE draft from): the feature path as a real consumer uses it."""

  def init(self, params, prefill: Prefill):
    last = jnp.take_along_axis(prefill.features, (prefill.lengths - 1)[:, None, None], axis=1)
    return self.inner.init(params, prefill), last[:, 0]

  def propose(self, params, state, ctx):
    draft, inner = self.inner.propose(params, state[0], ctx)
    return draft, (inner, state[1])

  def commit(self, state, verdict: Verdict, ctx):
    n = verdict.num_accepted
    last = jnp.take_along_axis(verdict.features, n[:, None, None], axis=1)[:, 0]
    return self.inner.commit(state[0], verdict, ctx), last


def compiled_cost(target, drafter, dparams, prompts, kw) -> dict:
  """Cost analysis and instruction count of ``generate``'s compiled program for these shapes."""
  width = decode.prompt_width(max(kw["pad_to"], *map(len, prompts)), kw["max_len"])
  st = decode._Static(target.cfg, drafter, kw["max_len"], decode.verify.verify)
  args = (
    target.params, dparams, jnp.zeros((len(prompts), width), jnp.int32),
    jnp.asarray([len(p) for p in prompts], jnp.int32), sampling.SamplingParams.create(0.0),
    decode.Limits(jnp.full((len(prompts),), kw["max_new_tokens"]), decode._stop_ids(None)),
    jax.random.key(0),
  )  # fmt: skip
  compiled = decode._generate_jit.lower(*args, st=st).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  hlo = compiled.as_text()
  return {
    "hlo_ops": sum(" = " in line for line in hlo.splitlines()),
    "gflops": float(cost.get("flops", np.nan)) / 1e9,
    "gbytes": float(cost.get("bytes accessed", np.nan)) / 1e9,
  }


def run(config: ml_collections.ConfigDict) -> dict:
  build.check(config)
  target = build.target(config)
  drafter, dparams = build.drafter(config, target)
  req = build.request(config, target)
  n = target.cfg.num_layers
  variants = {"none": (), "final": ("final",), "3 layers": (1, n // 2, n - 1)}
  bases = {"ar": (decode.AUTOREGRESSIVE, None)}
  if drafter.name != "none":
    bases[drafter.name] = (drafter, dparams)
  kw = req.generate_kwargs()
  modes, rows = {}, []
  for base, (d, dp) in bases.items():
    for label, layers in variants.items():
      wrapped = d if not layers else KeepFeatures(d, layers)
      rows.append(
        {"mode": base, "features": label}
        | compiled_cost(target, wrapped, dp, req.prompts[: req.batch_size], kw)
      )
      modes[f"{base}/{label}"] = lambda b, d=wrapped, dp=dp: decode.generate(
        target.params, target.cfg, b, drafter=d, drafter_params=dp, **kw
      )
  describe = f"{target.cfg.name}, batch {req.batch_size}, max_len {req.max_len}"
  timed = timing.run_modes(modes, req.batches(), config.benchmark.repeats, describe)
  for row in rows:
    t = timed[f"{row['mode']}/{row['features']}"]
    m = metrics.summarize(metrics.merge([o.counts for o in t.pop("outs")]))
    row |= {"tokens": m["tokens"], "tau": m["tau"], "steady_s": t["steady_s"]}
    row["tokens_per_s"] = m["tokens"] / t["steady_s"]
  for row in rows:
    none = next(r for r in rows if r["mode"] == row["mode"] and r["features"] == "none")
    row["vs_none"] = row["tokens_per_s"] / none["tokens_per_s"]
  record = {"config": config.to_dict(), "machine": machine(), "runs": rows}
  print(results.table(rows, COLUMNS))
  print(f"wrote {results.write_json(f'{config.output_dir}/feature_cost.json', record)}")
  return record
