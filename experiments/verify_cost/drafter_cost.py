"""What a drafter's own step costs against an AR step: the committed EAGLE drafter's ``propose``
(a chain and two EAGLE-2 trees) and the committed Medusa heads', in float32 and bfloat16, one
process, and where an EAGLE step's time goes.

    bash scripts/install_models.sh smollm2
    python experiments/verify_cost/drafter_cost.py                 # ~5 min on 2 CPU cores
    python -m specjax.report experiments/verify_cost               # README's results block

SmolLM2-135M-Instruct, batch 1, ``--context`` cached tokens (default 192), the drafters built
as decoding builds them (``build.drafter``: weights in the target's dtype). Programs, each
timed as ``verify_cost.measure`` times them (compiled first, interleaved rounds, medians):

- ``ar``: the target's one-token forward (an AR step's forward);
- ``propose``: one whole drafter step, jitted: EAGLE's catch-up (the last step's accepted
  pairs into the draft cache) and every tree level, or Medusa's heads and its tree;
- ``propose_recompute`` (EAGLE): the same step as it ran before a level kept its nodes' keys
  and values: level d re-ran all d x top_k nodes expanded so far through the layer;
- EAGLE's parts, each alone: ``catch_up`` (the catch-up forward and its head row), ``level``
  (the deepest level's layer over its top_k nodes), ``head`` (the draft head on top_k rows) and
  ``top_k`` (log-softmax and top-k of top_k rows' draft logits).

Writes ``results/drafter_cost.json``.
"""

import argparse
import dataclasses
import functools
import importlib.util
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's configs

from configs import demo  # noqa: E402
from specjax import build, sampling
from specjax.drafters.base import DraftContext, Prefill
from specjax.drafters.eagle import Eagle, Expanded, Pool, inputs, layer, logits
from specjax.models import llama

HERE = Path(__file__).resolve().parent
EAGLE_DRAFTER = "experiments/eagle_smollm2/drafter"
MEDUSA_HEADS = "experiments/medusa_smollm2/heads"
EAGLE_BUDGETS = ((1, 6, 6), (4, 5, 12), (4, 6, 16))  # (top_k, depth, total)


def _verify_cost():
  spec = importlib.util.spec_from_file_location("_verify_cost", HERE / "verify_cost.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@dataclasses.dataclass(frozen=True)
class Recompute(Eagle):
  """EAGLE's step before a level kept its nodes' keys and values: level d runs all d x top_k
  nodes expanded so far through the layer and reads the newest top_k outputs."""

  def propose(self, params, state, ctx):
    keys = jax.random.split(ctx.key, self.depth)
    root_BxF, cache = self._catch_up(params, state, ctx)
    tok, score, q = self._children(
      logits(params, self.cfg, root_BxF)[:, None], keys[0], ctx.sampling
    )
    pool = Pool.start(tok[:, 0], score[:, 0], None if q is None else q[:, 0], root_BxF)
    expanded = Expanded.empty(ctx.tokens.shape[0])
    for d in range(1, self.depth):
      frontier_BxK = pool.best_of_level(d, self.top_k)
      expanded = expanded.add(frontier_BxK, pool.parent_BxP, d)
      nodes = expanded.nodes_BxM
      tokens = params["vocab_ids"][jnp.take_along_axis(pool.tok_BxP, nodes, axis=1)]
      s_in = jnp.take_along_axis(pool.s_in_BxPxF, nodes[..., None], axis=1)
      positions = ctx.lengths[:, None] + jnp.asarray(np.asarray(expanded.depths) - 1)
      attn = llama.attention_inputs(ctx.lengths, expanded.ancestors_BxMxM, cache.num_slots,
                                    write=False)  # fmt: skip
      x = inputs(params, self.cfg, tokens, s_in)
      out, _, _ = layer(params, self.cfg, x, positions, cache.k[0], cache.v[0], attn)
      out_BxKxF = out[:, -self.top_k :]
      tok, score, q = self._children(logits(params, self.cfg, out_BxKxF), keys[d], ctx.sampling)
      pool = pool.offer(frontier_BxK, tok, score, q, out_BxKxF)
    return self._rerank(params, pool), state.replace(cache=cache)


def programs(config, target, context: int, num_slots: int) -> dict:
  """``{name: (jitted fn, args_for(budget))}`` for every program, at every EAGLE budget (the
  AR forward and Medusa's step are the same at each; they are timed once per budget)."""
  rng = np.random.default_rng(0)
  tokens = jnp.asarray(rng.integers(0, target.cfg.vocab_size, (1, num_slots)), jnp.int32)
  dtype = llama.param_dtype(target.params)
  features = jnp.asarray(rng.standard_normal((1, context, target.cfg.dim)), dtype)
  prefill = Prefill(tokens[:, :context], jnp.asarray([context], jnp.int32), features, num_slots)
  ctx = DraftContext(  # the last step accepted two tokens: three pairs are pending
    tokens=tokens, lengths=jnp.asarray([context + 2], jnp.int32), key=jax.random.key(0),
    sampling=sampling.SamplingParams.create(temperature=0.0), vocab_size=target.cfg.vocab_size,
  )  # fmt: skip

  cache = llama.init_cache(target.cfg, 1, num_slots, dtype).replace(
    lengths=jnp.asarray([context], jnp.int32)
  )
  ar = jax.jit(lambda p, c, t: llama.forward_kv(p, target.cfg, t, jnp.full((1, 1), context), c,
                                                llama.causal_mask(1))[0])  # fmt: skip

  def drafter(name, **kw):
    c = config.copy_and_resolve_references()
    c.drafter.name = name
    c.drafter[name].update(kw)
    return build.drafter(c, target)

  medusa, mparams = drafter("medusa", path=MEDUSA_HEADS)  # the tree saved with the heads
  mstate = medusa.init(mparams, prefill)
  eagle, eparams = drafter("eagle", path=EAGLE_DRAFTER)

  def budget(b):
    return dataclasses.replace(eagle, top_k=b[0], depth=b[1], total=b[2])

  def state(b):  # its pending pairs: as many as the budget's deepest node, plus one
    return budget(b).init(eparams, prefill).replace(count_B=jnp.asarray([3], jnp.int32))

  def recompute(b):
    d = budget(b)
    return Recompute(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)})

  propose = jax.jit(lambda d, p, s, c: d.propose(p, s, c)[0].tokens, static_argnums=0)
  catch_up = jax.jit(lambda d, p, s, c: logits(p, d.cfg, d._catch_up(p, s, c)[0]), static_argnums=0)
  head = jax.jit(lambda p, o: logits(p, eagle.cfg, o))
  top_k = jax.jit(lambda d, lg: d._children(lg, ctx.key, ctx.sampling)[0], static_argnums=0)

  @functools.partial(jax.jit, static_argnums=0)
  def level(d, p, cache, x_1xKxF, tree_kv):
    """The deepest level: top_k nodes over the cache and the (depth - 2) x top_k before them."""
    k, m = d.top_k, tree_kv[0].shape[2]
    attn = llama.attention_inputs(ctx.lengths, jnp.ones((1, k, m + k), bool), cache.num_slots,
                                  write=False)  # fmt: skip
    positions = jnp.full((1, k), context + d.depth - 1)
    return layer(p, d.cfg, x_1xKxF, positions, cache.k[0], cache.v[0], attn, tree_kv)[0]

  def out(k):
    return jnp.asarray(rng.standard_normal((1, k, target.cfg.dim)), dtype)

  def tree_kv(b):
    shape = (1, eagle.cfg.layer.num_kv_heads, (b[1] - 2) * b[0], eagle.cfg.layer.head_dim)
    return (jnp.ones(shape, dtype), jnp.ones(shape, dtype))

  draft_logits = {k: jnp.asarray(rng.standard_normal((1, k, eagle.cfg.draft_vocab)), jnp.float32)
                  for k in {b[0] for b in EAGLE_BUDGETS}}  # fmt: skip
  return {
    "ar": (ar, lambda b: (target.params, cache, tokens[:, :1])),
    "medusa_propose": (propose, lambda b: (medusa, mparams, mstate, ctx)),
    "propose": (propose, lambda b: (budget(b), eparams, state(b), ctx)),
    "propose_recompute": (propose, lambda b: (recompute(b), eparams, state(b), ctx)),
    "catch_up": (catch_up, lambda b: (budget(b), eparams, state(b), ctx)),
    "level": (level, lambda b: (budget(b), eparams, state(b).cache, out(b[0]), tree_kv(b))),
    "head": (head, lambda b: (eparams, out(b[0]))),
    "top_k": (top_k, lambda b: (budget(b), draft_logits[b[0]])),
  }


def budget_name(b) -> str:
  return f"{b[0]}x{b[1]}_{b[2]}"


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
  ms = {}
  for dtype in ("float32", "bfloat16"):
    config = demo.base()
    config.dtype = dtype
    target = build.target(config)
    secs = vc.measure(programs(config, target, args.context, num_slots), EAGLE_BUDGETS,
                      args.rounds)  # fmt: skip
    ms[dtype] = {n: {budget_name(b): s * 1e3 for b, s in by.items()} for n, by in secs.items()}
    del target
  record = {
    "model": "smollm2-135m-instruct",
    "eagle": EAGLE_DRAFTER,
    "medusa": {"path": MEDUSA_HEADS, "tree": "saved with the heads"},
    "context": args.context,
    "rounds": args.rounds,
    "machine": {
      "cpu": vc.cpu_model(),
      "cores": os.cpu_count(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
    },  # fmt: skip
    "ms": ms,
  }
  path = Path(args.out) / "drafter_cost.json"
  vc.write_json(path, record)
  print(report_table(record))
  print(f"wrote {path}")


def report_table(record: dict) -> str:
  """Rows per (dtype, EAGLE budget): each program's ms, the step against an AR step, and the
  step before levels kept their keys and values against now; then Medusa's step."""
  from specjax import results

  rows = []
  for dtype, cells in record["ms"].items():
    for b in cells["propose"]:
      ar = cells["ar"][b]
      row = {"dtype": dtype, "budget": b, "ar": ar}
      row |= {n: cells[n][b] for n in ("propose", "propose_recompute", "catch_up", "level",
                                       "head", "top_k")}  # fmt: skip
      row |= {
        "propose_vs_ar": cells["propose"][b] / ar,
        "recompute_vs_now": cells["propose_recompute"][b] / cells["propose"][b],
      }
      rows.append(row)
    ar = float(np.median(list(cells["ar"].values())))
    medusa = float(np.median(list(cells["medusa_propose"].values())))
    # The heads' saved tree (4 nodes): the record of 2026-12-05 names tree_spec (3, 2, 2, 1),
    # which the saved tree overrode unsaid; the run decoded the saved one.
    rows.append({"dtype": dtype, "budget": "medusa (saved tree)", "ar": ar, "propose": medusa,
                 "propose_vs_ar": medusa / ar})  # fmt: skip
  columns = ("dtype", "budget", "ar", "propose", "propose_vs_ar", "propose_recompute",
             "recompute_vs_now", "catch_up", "level", "head", "top_k")  # fmt: skip
  return results.markdown_table(rows, columns)


if __name__ == "__main__":
  main()
