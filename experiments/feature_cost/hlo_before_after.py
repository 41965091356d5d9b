"""Compiled-program cost of AR and prompt lookup, runnable against the code before and after the
engine refit, so the two can be compared (this code's programs are deterministic).

    python experiments/feature_cost/hlo_before_after.py \
      experiments/feature_cost/results/hlo_after.json
    git worktree add /tmp/before 47cc7fc
    PYTHONPATH=/tmp/before python experiments/feature_cost/hlo_before_after.py \
      experiments/feature_cost/results/hlo_before.json

SmolLM2-135M-Instruct, batch 1, prompt width 128, 96 new tokens, greedy, at max_len 128 (the
cache holds one attention window: the same attention as before) and 256 (two windows).
"""

import inspect
import json
import sys

import jax
import jax.numpy as jnp

from specjax import decode, sampling, verify
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.models import registry

try:
  from specjax import loop  # the decode loop's own module
except ImportError:  # older checkouts: the loop lived in decode.py
  loop = decode


def cost(cfg, params, drafter, max_len):
  st = (getattr(loop, "Static", None) or loop._Static)(cfg, drafter, max_len, verify.verify)
  prompt, lengths = jnp.zeros((1, 128), jnp.int32), jnp.asarray([100], jnp.int32)
  sp, key = sampling.SamplingParams.create(0.0), jax.random.key(0)
  budget, stops = jnp.asarray([96], jnp.int32), decode._stop_ids(None)
  if "limits" in inspect.signature(loop._generate).parameters:  # after the refit
    args = (params, None, prompt, lengths, sp, loop.Limits(budget, stops), key)
  else:
    args = (params, None, prompt, lengths, budget, sp, stops, key)
  compiled = loop._generate_jit.lower(*args, st=st).compile()
  c = compiled.cost_analysis()
  c = c[0] if isinstance(c, list) else c
  ops = sum(" = " in line for line in compiled.as_text().splitlines())
  return {"hlo_ops": ops, "gflops": c["flops"] / 1e9, "gbytes": c["bytes accessed"] / 1e9}


def main(out_path):
  cfg, params, _ = registry.load("smollm2-135m-instruct")
  rows = []
  for max_len in (128, 256):
    for mode, drafter in (("ar", decode.AUTOREGRESSIVE), ("prompt_lookup", PromptLookup(4))):
      rows.append({"mode": mode, "max_len": max_len} | cost(cfg, params, drafter, max_len))
      print(rows[-1], flush=True)
  with open(out_path, "w") as f:
    json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
  main(sys.argv[1])
