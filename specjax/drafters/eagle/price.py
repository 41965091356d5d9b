"""How the cost model times an EAGLE step's own forwards on this machine (the family record's
``price.timers``): the catch-up forward over T pairs with its head on the last one
(``"eagle"``), and a level's forward with its head on all ``top_k`` rows (``"eagle_level"``)."""

import functools

import jax
import jax.numpy as jnp

from specjax.drafters.eagle import model as eagle
from specjax.drafters.timing import median_seconds
from specjax.models import llama


def catch_up_seconds(drafter, dparams, target_cfg, context, sizes, repeats) -> dict:
  del target_cfg, context
  return {t: _seconds(drafter, dparams, t, 1, repeats) for t in sorted(sizes)}


def level_seconds(drafter, dparams, target_cfg, context, sizes, repeats) -> dict:
  del target_cfg, context
  return {t: _seconds(drafter, dparams, t, drafter.top_k, repeats) for t in sorted(sizes)}


def _seconds(drafter, p, t: int, head_rows: int, repeats: int) -> float:
  """One EAGLE forward over t pairs (fc, the layer) with no cache, its head on the last
  ``head_rows``."""
  fwd = functools.partial(_logits, cfg=drafter.cfg, head_rows=head_rows)
  width = drafter.cfg.target.dim * len(drafter.feature_layers)
  s = jnp.ones((1, t, width), jnp.float32)
  return median_seconds(lambda: fwd(p, jnp.ones((1, t), jnp.int32), s), repeats)


@functools.partial(jax.jit, static_argnames=("cfg", "head_rows"))
def _logits(p, tokens_1xT, s_1xTxF, *, cfg, head_rows: int):
  """The EAGLE forward that ``_seconds`` times."""
  t = tokens_1xT.shape[1]
  attn = llama.attention_inputs(jnp.zeros((1,), jnp.int32), llama.causal_mask(t), 0, 0, False)
  x = eagle.inputs(p, cfg, tokens_1xT, eagle.fuse(p, s_1xTxF))
  out, _, _ = eagle.layer(p, cfg, x, jnp.arange(t)[None], None, None, attn)
  return eagle.logits(p, cfg, out[:, t - head_rows :])
