"""The one place logits become probabilities: temperature, top-k, top-p.

Draft and target both pass through ``probs``; if they didn't, the output distribution would
not be the target's. Temperature 0 is greedy: the distribution is one-hot on the argmax, so
greedy decoding is the sampling algorithm run on one-hot distributions and needs no separate
code path.

All three knobs are traced arrays: changing their values never recompiles. Two facts about
them are static (``SamplingParams``): whether the temperature is 0, and whether top-k/top-p
filtering is on at all. A greedy program then compiles no softmax, draw or sampled verdict,
and one without filtering no filter (its sort and nucleus mass, at every draft and verify
distribution of a step, were 13-15% of a tiny decode loop's XLA compile). Built any other way
(``greedy=None``), the temperature decides at run time.
"""

import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specjax import indexing


@struct.dataclass
class SamplingParams:
  """Traced sampling knobs, shared by every row of a batch."""

  temperature: jax.Array  # float32 scalar; 0 = greedy.
  top_k: jax.Array  # int32 scalar; 0 = off.
  top_p: jax.Array  # float32 scalar in (0, 1]; 1 = off.
  # Static: False when top-k and top-p are both off (or the temperature is 0), so ``probs``
  # compiles no filter. True compiles it, and the traced knobs decide whether it applies.
  filtering: bool = struct.field(pytree_node=False, default=True)
  # Static: whether the temperature is 0 (``create`` sets it); None decides at run time.
  greedy: bool | None = struct.field(pytree_node=False, default=None)

  @classmethod
  def create(cls, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    validate(temperature, top_k, top_p)
    greedy = bool(temperature == 0)
    return cls(
      temperature=jnp.asarray(temperature, jnp.float32),
      top_k=jnp.asarray(top_k, jnp.int32),
      top_p=jnp.asarray(top_p, jnp.float32),
      filtering=not greedy and bool(top_k > 0 or top_p < 1),
      greedy=greedy,
    )


def is_greedy(params: SamplingParams) -> bool | jax.Array:
  """Temperature 0: a Python bool where it is static, else a traced scalar."""
  return params.temperature <= 0 if params.greedy is None else params.greedy


def by_temperature(params: SamplingParams, greedy_fn, sampled_fn, *args):
  """``greedy_fn(*args)`` at temperature 0, else ``sampled_fn(*args)``: only the one traced
  where the temperature is static, else both, as the two branches of a ``lax.cond``."""
  if params.greedy is None:
    return jax.lax.cond(params.temperature <= 0, greedy_fn, sampled_fn, *args)
  return greedy_fn(*args) if params.greedy else sampled_fn(*args)


def validate(temperature: float, top_k: int, top_p: float) -> None:
  """Raises a ValueError naming the bad field and the fix."""
  for field, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
    if not _is_number(value):
      raise ValueError(f"{field} must be a number, got {value!r:.40}.")
  if not 0 <= temperature < float("inf"):
    raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}.")
  if int(top_k) != top_k or not 0 <= top_k < 2**31:
    raise ValueError(f"top_k must be an integer in [0, 2**31) (0 = off), got {top_k}.")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}.")


def _is_number(value) -> bool:
  """A real number (numpy's and a scalar jax array too), not a bool, a string or None."""
  if isinstance(value, (bool, np.bool_)):
    return False
  if isinstance(value, numbers.Real):
    return True
  return (
    isinstance(value, (np.ndarray, jax.Array))
    and value.shape == ()
    and (jnp.issubdtype(value.dtype, jnp.integer) or jnp.issubdtype(value.dtype, jnp.floating))
  )


def _filter(logits_xV: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """Sets logits outside the top-k / top-p (nucleus) set to -inf; ties at the edge are kept."""
  v = logits_xV.shape[-1]
  sorted_desc = -jnp.sort(-logits_xV, axis=-1)
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
  kth = indexing.take(sorted_desc, k - 1, axis=-1)[..., None]
  sorted_desc = jnp.where(jnp.arange(v) < k, sorted_desc, -jnp.inf)
  # Nucleus over what top-k kept: keep the smallest prefix whose mass reaches top_p.
  sorted_probs = jax.nn.softmax(sorted_desc, axis=-1)
  mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
  keep = (mass_before < top_p) & (jnp.arange(v) < k)
  last = jnp.sum(keep, axis=-1, keepdims=True) - 1
  pth = indexing.take_along(sorted_desc, last, axis=-1)
  threshold = jnp.maximum(kth, pth)
  return jnp.where(logits_xV >= threshold, logits_xV, -jnp.inf)


def probs(logits_xV: jax.Array, params: SamplingParams) -> jax.Array:
  """Logits ``[..., V]`` -> the distribution to sample from, ``[..., V]`` float32."""
  logits_xV = logits_xV.astype(jnp.float32)
  greedy = is_greedy(params)
  one_hot = lambda: jax.nn.one_hot(jnp.argmax(logits_xV, axis=-1), logits_xV.shape[-1])  # noqa: E731
  if greedy is True:
    return one_hot()
  scaled = logits_xV / jnp.where(greedy, 1.0, params.temperature)
  if params.filtering:
    filtering = (params.top_k > 0) | (params.top_p < 1)
    # A real branch (the knobs are batch-shared scalars): the sort is skipped when unused.
    scaled = jax.lax.cond(
      filtering & ~greedy, lambda x: _filter(x, params.top_k, params.top_p), lambda x: x, scaled
    )
  soft = jax.nn.softmax(scaled, axis=-1)
  return soft if greedy is False else jnp.where(greedy, one_hot(), soft)


def sample(key: jax.Array, probs_xV: jax.Array, params: SamplingParams | None = None) -> jax.Array:
  """Draws one token per leading index from ``probs`` (unnormalised; may hold zeros).

  Inverse-CDF sampling: one uniform per draw instead of V Gumbel variates, which matters
  when V is 150k and a step draws a few tokens. Never returns a zero-probability token.
  With ``params`` of a static temperature 0, ``probs`` is one-hot (``probs``): its token is
  the argmax, taken without a draw (the same token the draw gives).
  """
  if params is not None and params.greedy is True:
    return jnp.argmax(probs_xV, axis=-1).astype(jnp.int32)
  cdf_xV = jnp.cumsum(probs_xV, axis=-1)
  u_x1 = jax.random.uniform(key, probs_xV.shape[:-1] + (1,)) * cdf_xV[..., -1:]
  idx = jnp.sum(cdf_xV <= u_x1, axis=-1)  # first index whose cdf exceeds u
  v = probs_xV.shape[-1]
  last_nonzero = v - 1 - jnp.argmax(jnp.flip(probs_xV > 0, axis=-1), axis=-1)
  return jnp.minimum(idx, last_nonzero).astype(jnp.int32)
