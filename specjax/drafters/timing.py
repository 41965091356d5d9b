"""Wall-clock timing of jitted forwards on this machine: what the cost model and every
drafter's timers (``drafters/family.py``) measure with."""

import functools
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from specjax import trees
from specjax.models import llama
from specjax.models.config import ModelConfig


def median_seconds(fn: Callable[[], jax.Array], repeats: int = 9) -> float:
  """Median wall time of ``fn()`` (compiled by a first call that is not timed)."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def llama_forward_seconds(
  params,
  cfg: ModelConfig,
  sizes,
  context: int,
  repeats: int = 9,
  num_slots: int = 0,
  masks: tuple[str, ...] = ("causal",),
) -> dict[str, dict[int, float]]:
  """``{mask: {T: seconds}}`` of one batch-1 forward over T tokens after ``context`` cached
  ones, run as verification runs it (``llama.forward_kv``: the cache of ``num_slots`` slots,
  by default just enough, read only), under a causal mask (a constant) and/or a tree mask
  (``"tree"``: data, as a tree's ancestors are), and/or causal as ``forward_rows`` runs it
  (``"one_shape"``: one attention sum over every slot, each row in path order). The median of
  ``repeats`` rounds, each timing every (mask, T) once: a slow spell of a shared machine then
  lands on every size alike."""

  fwd = functools.partial(_forward_logits, cfg=cfg, context=context)
  num_slots = num_slots or context + max(sizes) + 1
  if context + max(sizes) > num_slots:
    raise ValueError(f"context {context} + {max(sizes)} tokens do not fit {num_slots} slots.")
  cache = llama.init_cache(cfg, 1, num_slots, llama.param_dtype(params))
  cache = cache.replace(lengths=jnp.asarray([context], jnp.int32))
  tree = lambda t: trees.ancestors(jnp.zeros((1, t - 1), jnp.int32))  # noqa: E731  (a star)
  mask = lambda m, t: llama.causal_mask(t) if m != "tree" or t == 1 else tree(t)  # noqa: E731
  jobs = {(m, t): (jnp.ones((1, t), jnp.int32), mask(m, t)) for m in masks for t in sizes}
  call = lambda m, tokens, mask: fwd(params, cache, tokens, mask, one_shape=m == "one_shape")  # noqa: E731
  for (m, _), (tokens, mask) in jobs.items():  # compile
    jax.block_until_ready(call(m, tokens, mask))
  times = {job: [] for job in jobs}
  for _ in range(repeats):
    for job, (tokens, mask) in jobs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(call(job[0], tokens, mask))
      times[job].append(time.perf_counter() - t0)
  return {m: {t: statistics.median(times[m, t]) for t in sizes} for m in masks}


@functools.partial(jax.jit, static_argnames=("cfg", "context", "one_shape"))
def _forward_logits(params, cache, tokens_1xT, mask, *, cfg: ModelConfig, context: int,
                    one_shape: bool = False):  # fmt: skip
  """The verify forward that ``llama_forward_seconds`` times (one program per model, context
  and shape, shared by every call that times it); ``one_shape``: as ``forward_rows`` runs it
  (``loop.target_forward``)."""
  positions = context + jnp.arange(tokens_1xT.shape[1])[None]
  if one_shape:
    logits, _, _ = llama.forward(params, cfg, tokens_1xT, positions, cache, mask,
                                 window=cache.num_slots, path_order=True)  # fmt: skip
  else:
    logits, _, _ = llama.forward_kv(params, cfg, tokens_1xT, positions, cache, mask)
  return logits
