"""Chain verification: how many draft tokens each row keeps, and the one token the target adds.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), per batch row: draft token
``x_i ~ q_i`` is accepted while ``U_i < p_i(x_i) / q_i(x_i)``; at the first rejection the
target's token is drawn from the residual ``norm(max(p_i - q_i, 0))``; if all K pass, a bonus
token is drawn from ``p_K``. The emitted tokens are then distributed exactly as the target's.

Greedy decoding is the same rule on one-hot distributions (``sampling.probs`` at temperature
0): a draft token survives iff it is the target's argmax, and the residual is the target's
argmax. No separate greedy code path exists, so greedy and sampling cannot drift apart.
"""

import jax
import jax.numpy as jnp

from specjax import sampling


def num_accepted(accept_BxK: jax.Array) -> jax.Array:
  """Length of the all-true prefix of each row: the number of accepted draft tokens."""
  return jnp.sum(jnp.cumprod(accept_BxK.astype(jnp.int32), axis=-1), axis=-1)


def residual(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """``norm(max(p - q, 0))``; falls back to ``p`` where p == q (the residual is never used then)."""
  r = jnp.maximum(p_xV - q_xV, 0.0)
  total = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p_xV)


def _pick(x_BxKx: jax.Array, n_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_BxKx, n_B[:, None, None], axis=1)[:, 0]


def rejection_sample_chain(
  key: jax.Array, draft_BxK: jax.Array, q_BxKxV: jax.Array, p_BxK1xV: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Returns ``(n[B], token[B])``: accepted draft count in [0, K] and the target's next token.

  ``q`` must be the distribution each draft token was really drawn from, and ``p`` the
  target's distribution at the K+1 verified positions, both after ``sampling.probs``.
  """
  b, k = draft_BxK.shape
  key_accept, key_sample = jax.random.split(key)
  p_x_BxK = jnp.take_along_axis(p_BxK1xV[:, :k], draft_BxK[..., None], axis=-1)[..., 0]
  q_x_BxK = jnp.take_along_axis(q_BxKxV, draft_BxK[..., None], axis=-1)[..., 0]
  u_BxK = jax.random.uniform(key_accept, (b, k))
  n_B = num_accepted(u_BxK * q_x_BxK < p_x_BxK)
  # With a zero row appended to q, the residual at n == K is p_K itself: the bonus token.
  q_pad_BxK1xV = jnp.concatenate([q_BxKxV, jnp.zeros_like(q_BxKxV[:, :1])], axis=1)
  next_dist_BxV = residual(_pick(p_BxK1xV, n_B), _pick(q_pad_BxK1xV, n_B))
  return n_B, sampling.sample(key_sample, next_dist_BxV)
