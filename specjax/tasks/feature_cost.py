"""task=feature_cost: what asking for target features costs, in the compiled program and in time.

    python -m specjax.run --config=experiments/feature_cost/config.py

Drafters that read no target features (AR, prompt lookup, Lookahead, a draft model) must pay
nothing for the feature path. This task compiles the whole generation of the configured
drafter three ways: as is (``feature_layers = ()``), and wrapped to ask for the final hidden
state or for three layers (EAGLE-3's choice), keep per row the newest valid one in its state
and read it in every proposal, as a Medusa or EAGLE drafter does (features nobody reads are
dead code that XLA drops, so a wrapper that only asked would measure nothing). AR runs as is,
for reference. For each it reads
XLA's cost analysis of the compiled program (flops, bytes accessed), counts the optimised HLO
instructions, and times decoding with interleaved passes in this process. Writes
``feature_cost.json`` and prints a table.
"""

import jax.numpy as jnp
import ml_collections
import numpy as np

from specjax import build, decode, metrics, results
from specjax.drafters.base import Prefill, Verdict, WithFeatures
from specjax.measure import timing
from specjax.measure.machine import machine

COLUMNS = ("mode", "features", "hlo_ops", "gflops", "gbytes", "tokens_per_s", "vs_none")


class KeepFeatures(WithFeatures):
  """``inner`` plus the newest valid target feature of every row, kept in the drafter state
  (what Medusa heads and EAGLE draft from) and read by every proposal: the feature path as a
  real consumer uses it. (A state nothing reads is dead code to XLA, features included.)"""

  def init(self, params, prefill: Prefill):
    last = jnp.take_along_axis(prefill.features, (prefill.lengths - 1)[:, None, None], axis=1)
    return self.inner.init(params, prefill), last[:, 0]

  def propose(self, params, state, ctx):
    draft, inner = self.inner.propose(params, state[0], ctx)
    # Read the feature as a head would, without changing the draft: it is never NaN.
    nan_B = jnp.isnan(state[1]).any(axis=-1)
    return draft.replace(tokens=jnp.where(nan_B[:, None], 0, draft.tokens)), (inner, state[1])

  def commit(self, state, verdict: Verdict, ctx):
    n = verdict.num_accepted
    last = jnp.take_along_axis(verdict.features, n[:, None, None], axis=1)[:, 0]
    return self.inner.commit(state[0], verdict, ctx), last


def compiled_cost(target, drafter, dparams, prompts, kw) -> dict:
  """Cost analysis and instruction count of ``generate``'s compiled program for these shapes."""
  keys = ("max_new_tokens", "max_len", "pad_to", "temperature", "top_k", "top_p")
  program = decode.compiled(
    target.params, target.cfg, prompts, drafter=drafter, drafter_params=dparams,
    **{k: kw[k] for k in keys if k in kw},
  )  # fmt: skip
  cost = program.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {
    "hlo_ops": sum(" = " in line for line in program.as_text().splitlines()),
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
    # A K = 0 drafter proposes nothing a feature could shape: its features would be dead code.
    for label, layers in variants.items() if d.num_draft else [("none", ())]:
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
