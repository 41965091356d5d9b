"""What a block drafter's step costs against an AR step on this machine: one DFlash ``propose``
(the catch-up of a verdict's features into the context, then the block forward and the chain's
picks) at blocks of 4, 8 and 16 with the full vocabulary (random weights), and the trained
drafters' (``drafter/``: DFlash, blocks of 8, an 8,192-token draft vocabulary;
``drafter_peagle/``: P-EAGLE, 8 tokens per forward, the same vocabulary), beside the target's
one-token forward and EAGLE ``:requests``' 16-node tree step, in float32 and bfloat16, in one
process.

    bash scripts/install_models.sh smollm2
    python experiments/block_smollm2/step_cost.py            # ~5 min on 2 CPU cores

SmolLM2-135M-Instruct, batch 1, ``--context`` cached tokens (default 192); DFlash with one
draft layer over layers 2, 14 and 27 (random weights: a step costs the same whatever they
are), its weights in the target's dtype, as ``build.drafter`` makes them. Each program is
compiled first, then timed in interleaved rounds (``verify_cost.measure``; medians). Writes
``results/step_cost.json``: milliseconds per program and dtype, and each step over the AR
forward.
"""

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's configs

from configs import demo  # noqa: E402
from specjax import build, results, sampling  # noqa: E402
from specjax.drafters.base import DraftContext, Prefill  # noqa: E402
from specjax.measure.machine import machine  # noqa: E402
from specjax.models import llama  # noqa: E402

HERE = Path(__file__).resolve().parent
BLOCKS = (4, 8, 16)
FEATURE_LAYERS = (2, 14, 27)
DFLASH = "experiments/block_smollm2/drafter"  # the trained one: blocks of 8, V' = 8192
PEAGLE = "experiments/block_smollm2/drafter_peagle"  # 8 tokens per forward, V' = 8192
EAGLE = {"path": "experiments/eagle_smollm2/drafter_requests", "top_k": 4, "depth": 6,
         "total": 16, "lookup": 4}  # fmt: skip


def _verify_cost():
  path = HERE.parent / "verify_cost" / "verify_cost.py"
  spec = importlib.util.spec_from_file_location("_verify_cost", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def programs(config, target, context: int, num_slots: int) -> dict:
  """``{name: (jitted fn, args_for(block))}``: the AR forward, DFlash's step at each block,
  EAGLE's 16-node step (the same at every block; timed once per block)."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, target.cfg.vocab_size, (1, num_slots)), jnp.int32)
  dtype = llama.param_dtype(target.params)
  ctx = DraftContext(  # the last step accepted two tokens
    tokens=tokens, lengths=jnp.asarray([context + 3], jnp.int32), key=jax.random.key(0),
    sampling=sampling.SamplingParams.create(temperature=0.0), vocab_size=target.cfg.vocab_size,
  )  # fmt: skip
  cache = llama.init_cache(target.cfg, 1, num_slots, dtype).replace(
    lengths=jnp.asarray([context], jnp.int32)
  )
  ar = jax.jit(lambda p, c, t: llama.forward_kv(p, target.cfg, t, jnp.full((1, 1), context), c,
                                                llama.causal_mask(1))[0])  # fmt: skip
  propose = jax.jit(lambda d, p, s, c: d.propose(p, s, c)[0].tokens, static_argnums=0)

  def drafter(name, **kw):
    c = config.copy_and_resolve_references()
    c.drafter.name = name
    c.drafter[name].update(kw)
    return build.drafter(c, target)

  def prefill(width):
    f = jnp.asarray(rng.standard_normal((1, context, width)), dtype)
    return Prefill(tokens[:, :context], jnp.asarray([context], jnp.int32), f, num_slots)

  dflash = {b: drafter("dflash", block_size=b, feature_layers=FEATURE_LAYERS, mask_id=16)
            for b in BLOCKS}  # fmt: skip
  dstate = {b: d.init(p, prefill(target.cfg.dim * len(FEATURE_LAYERS)))
            for b, (d, p) in dflash.items()}  # fmt: skip
  trained, tparams = drafter("dflash", path=DFLASH)
  tstate = trained.init(tparams, prefill(target.cfg.dim * len(trained.feature_layers)))
  eagle, eparams = drafter("eagle", **EAGLE)
  estate = eagle.init(eparams, prefill(target.cfg.dim)).replace(count_B=jnp.asarray([3]))
  peagle, pparams = drafter("peagle", path=PEAGLE)
  pstate = peagle.init(pparams, prefill(target.cfg.dim * len(peagle.feature_layers)))
  pstate = pstate.replace(count=jnp.asarray([3]))
  return {
    "ar": (ar, lambda b: (target.params, cache, tokens[:, :1])),
    "dflash_propose": (propose, lambda b: (dflash[b][0], dflash[b][1], dstate[b], ctx)),
    "dflash_trained_8_propose": (propose, lambda b: (trained, tparams, tstate, ctx)),
    "peagle_trained_8_propose": (propose, lambda b: (peagle, pparams, pstate, ctx)),
    "eagle_16_lookup4_propose": (propose, lambda b: (eagle, eparams, estate, ctx)),
  }


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--context", type=int, default=192)
  ap.add_argument("--rounds", type=int, default=9)
  ap.add_argument("--out", default=str(HERE / "results"))
  args = ap.parse_args()
  if args.rounds < 1 or args.context < 1:
    ap.error("--rounds and --context must be >= 1")
  vc = _verify_cost()
  num_slots = args.context + 64
  ms, vs_ar = {}, {}
  for dtype in ("float32", "bfloat16"):
    config = demo.base()
    config.dtype = dtype
    target = build.target(config)
    secs = vc.measure(programs(config, target, args.context, num_slots), BLOCKS, args.rounds)
    ms[dtype] = {n: {str(b): s * 1e3 for b, s in by.items()} for n, by in secs.items()}
    vs_ar[dtype] = {n: {str(b): s / secs["ar"][b] for b, s in by.items()}
                    for n, by in secs.items() if n != "ar"}  # fmt: skip
    del target
  record = {
    "model": "smollm2-135m-instruct",
    "dflash": {"feature_layers": list(FEATURE_LAYERS), "num_layers": 1, "blocks": list(BLOCKS)},
    "eagle": EAGLE,
    "trained": {"dflash": DFLASH, "peagle": PEAGLE},
    "context": args.context,
    "rounds": args.rounds,
    "machine": machine() | {"cpu_model": vc.cpu_model()},
    "ms": ms,
    "vs_ar_step": vs_ar,
  }
  path = results.write_json(Path(args.out) / "step_cost.json", record)
  print(json.dumps(vs_ar, indent=1))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
