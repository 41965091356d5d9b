"""Verification: which draft tokens each row keeps, and the one token the target adds.

Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), per batch row: draft token
``x_i ~ q_i`` is accepted while ``U_i < p_i(x_i) / q_i(x_i)``; at the first rejection the
target's token is drawn from the residual ``norm(max(p_i - q_i, 0))``; if all K pass, a bonus
token is drawn from ``p_K``. The emitted tokens are then distributed exactly as the target's.

Greedy decoding is the same rule on one-hot distributions (``sampling.probs`` at temperature
0): a draft token survives iff it is the target's argmax, and the residual is the target's
argmax. The decode loop computes that outcome from the argmax alone at temperature 0
(``greedy``: the longest path of argmax tokens, chosen with ``lax.cond``, so no V-wide softmax
or residual is built); the tests check it against these verifiers on one-hot p.

Trees (``rejection_sample_tree``) use recursive rejection sampling: walking down from the
root, the children of the current node are tried in order; child x is accepted with
``min(1, p'(x) / q'(x))``; on rejection ``p' <- norm(max(p' - q', 0))`` and x is removed from
the next siblings' q (renormalised), which is the distribution they were really drawn from when
children are drawn without replacement (Gumbel-top-k). An accepted child becomes the current
node with a fresh ``p'``; when every child fails, the target's token is drawn from ``p'``.
Deterministic candidates (``Draft.probs=None``, a one-hot q) make the same rule "accept with
p'(x), else remove x from p'". At temperature 0 the tree rule is the longest path whose every
token is the target's argmax. Typical acceptance (Medusa) is a separate, named, *lossy* verifier.

Every verifier has the signature ``(key, draft, p[B, N+1, V], sampling_params) -> (end[B],
next[B])``: the last accepted node (0 = only the root) and the target's next token.
"""

import dataclasses

import jax
import jax.numpy as jnp

from specjax import indexing, sampling


def num_accepted(accept_BxK: jax.Array) -> jax.Array:
  """Length of the all-true prefix of each row: the number of accepted draft tokens."""
  return jnp.sum(jnp.cumprod(accept_BxK.astype(jnp.int32), axis=-1), axis=-1)


def residual(p_xV: jax.Array, q_xV: jax.Array) -> jax.Array:
  """``norm(max(p - q, 0))``; falls back to ``p`` where p == q (the residual is never used then)."""
  r = jnp.maximum(p_xV - q_xV, 0.0)
  total = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(total > 0, r / jnp.where(total > 0, total, 1.0), p_xV)


def _pick(x_BxKx: jax.Array, n_B: jax.Array) -> jax.Array:
  return indexing.take_along(x_BxKx, n_B[:, None, None], axis=1)[:, 0]


def remove(p_xV: jax.Array, x_x: jax.Array) -> jax.Array:
  """``p`` with token ``x`` removed and renormalised: the residual after a rejected one-hot
  proposal, ``norm(max(p - onehot(x), 0))``. ``x = -1`` removes nothing."""
  return residual(p_xV, jax.nn.one_hot(x_x, p_xV.shape[-1], dtype=p_xV.dtype))


def rejection_sample_chain(
  key: jax.Array, draft_BxK: jax.Array, q_BxKxV: jax.Array | None, p_BxK1xV: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Returns ``(n[B], token[B])``: accepted draft count in [0, K] and the target's next token.

  ``q`` must be the distribution each draft token was really drawn from, or None for
  deterministic proposals (one-hot q); ``p`` is the target's distribution at the K+1 verified
  positions. Both after ``sampling.probs``.
  """
  b, k = draft_BxK.shape
  key_accept, key_sample = jax.random.split(key)
  p_x_BxK = indexing.take_along(p_BxK1xV[:, :k], draft_BxK[..., None], axis=-1)[..., 0]
  u_BxK = jax.random.uniform(key_accept, (b, k))
  if q_BxKxV is None:  # one-hot q: accept with p(x); the residual is p without x
    n_B = num_accepted(u_BxK < p_x_BxK)
    x_pad_BxK1 = jnp.concatenate([draft_BxK, jnp.full((b, 1), -1, draft_BxK.dtype)], axis=1)
    x_B = indexing.take_along(x_pad_BxK1, n_B[:, None], axis=1)[:, 0]
    return n_B, sampling.sample(key_sample, remove(_pick(p_BxK1xV, n_B), x_B))
  q_x_BxK = indexing.take_along(q_BxKxV, draft_BxK[..., None], axis=-1)[..., 0]
  n_B = num_accepted(u_BxK * q_x_BxK < p_x_BxK)
  # With a zero row appended to q, the residual at n == K is p_K itself: the bonus token.
  q_pad_BxK1xV = jnp.concatenate([q_BxKxV, jnp.zeros_like(q_BxKxV[:, :1])], axis=1)
  next_dist_BxV = residual(_pick(p_BxK1xV, n_B), _pick(q_pad_BxK1xV, n_B))
  return n_B, sampling.sample(key_sample, next_dist_BxV)


def verify(key, draft, p_BxN1xV, sp) -> tuple[jax.Array, jax.Array]:
  """The lossless verifier for any draft: chain rejection sampling or the tree rule."""
  if draft.parents is None:
    return rejection_sample_chain(key, draft.tokens, draft.probs, p_BxN1xV)
  return rejection_sample_tree(key, draft, p_BxN1xV, sp)


def _node_probs(p_BxN1xV, parents_BxN):
  """``[B, N, V]``: the target's distribution at each draft node's parent."""
  return indexing.take_along(p_BxN1xV, parents_BxN[..., None], axis=1)


def deepest_passing(parents_BxN, pass_BxN) -> jax.Array:
  """``[B]`` the deepest node whose every node from the root passes (lowest id on ties)."""
  b, n = parents_BxN.shape
  ok_BxN1 = jnp.ones((b, n + 1), bool)
  depth_BxN1 = jnp.zeros((b, n + 1), jnp.int32)
  for i in range(1, n + 1):  # parents come first, so one pass settles every path and depth
    parent_B1 = parents_BxN[:, i - 1 : i]
    parent_ok = indexing.take_along(ok_BxN1, parent_B1, axis=1)[:, 0]
    ok_BxN1 = ok_BxN1.at[:, i].set(parent_ok & pass_BxN[:, i - 1])
    depth_BxN1 = depth_BxN1.at[:, i].set(
      indexing.take_along(depth_BxN1, parent_B1, axis=1)[:, 0] + 1
    )
  return jnp.argmax(jnp.where(ok_BxN1, depth_BxN1, -1), axis=-1)


def greedy(draft, argmax_BxN1: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Temperature 0, from the target's argmax at the root and every node: the longest path
  whose every token is the argmax at its parent, and the argmax after it. What every verifier
  does on one-hot distributions, with no ``[B, N+1, V]`` array built."""
  n = draft.tokens.shape[1]
  if draft.parents is None:
    end_B = num_accepted(draft.tokens == argmax_BxN1[:, :n])
  else:
    hit_BxN = indexing.take_along(argmax_BxN1, draft.parents, axis=1) == draft.tokens
    end_B = deepest_passing(draft.parents, hit_BxN)
  return end_B, indexing.take_along(argmax_BxN1, end_B[:, None], axis=1)[:, 0]


def greedy_tree(draft, p_BxN1xV) -> tuple[jax.Array, jax.Array]:
  """The longest path whose every token is the target's argmax, and the argmax after it."""
  return greedy(draft, jnp.argmax(p_BxN1xV, axis=-1))


def rejection_sample_tree(
  key, draft, p_BxN1xV, sp, renormalise: bool = True, remove_rejected: bool = True
):
  """Recursive rejection sampling over the tree (greedy longest path at temperature 0).

  ``draft.probs=None`` (deterministic candidates): child x is accepted with p'(x), and on
  rejection x is removed from p'; a repeated sibling then has p'(x) = 0 and is rejected with no
  change. The same one-hot rule is lossless for *sampled* children too (each is a proposal
  drawn without looking at the target), only less often accepting than the rule with their q.
  ``renormalise=False`` (keep rejected siblings in a soft q) and ``remove_rejected=False``
  (keep a rejected one-hot candidate in p') are wrong; tests show it.
  """
  is_greedy = sampling.is_greedy(sp)
  if is_greedy is True:  # a static temperature 0: nothing to sample
    return greedy_tree(draft, p_BxN1xV)
  b, n = draft.tokens.shape
  key_accept, key_sample = jax.random.split(key)
  u_BxN = jax.random.uniform(key_accept, (b, n))
  one_hot = draft.probs is None

  def row(tokens_N, q_NxV, parents_N, p_N1xV, u_N):
    def visit(carry, node):
      cur, p_cur, removed_V = carry
      x, u = tokens_N[node], u_N[node]
      active = parents_N[node] == cur
      if one_hot:
        accept = active & (u < p_cur[x])
        p_rejected = remove(p_cur, x) if remove_rejected else p_cur
      else:
        q_V = q_NxV[node]
        if renormalise:
          q_V = jnp.where(removed_V, 0.0, q_V)
          total = jnp.sum(q_V)
          q_V = q_V / jnp.where(total > 0, total, 1.0)
        accept = active & (q_V[x] > 0) & (u * q_V[x] < p_cur[x])
        p_rejected = residual(p_cur, q_V)
        removed_V = jnp.where(accept, False, removed_V.at[x].set(removed_V[x] | (active & ~accept)))
      reject = active & ~accept
      p_next = jnp.where(accept, p_N1xV[node + 1], jnp.where(reject, p_rejected, p_cur))
      return (jnp.where(accept, node + 1, cur), p_next, removed_V), None

    removed = jnp.zeros((0,) if one_hot else p_N1xV.shape[-1:], bool)
    (end, p_final, _), _ = jax.lax.scan(visit, (jnp.int32(0), p_N1xV[0], removed), jnp.arange(n))
    return end, p_final

  q = jnp.zeros((b, n, 0)) if one_hot else draft.probs  # vmap needs an array
  end_B, p_final_BxV = jax.vmap(row)(draft.tokens, q, draft.parents, p_BxN1xV, u_BxN)
  sampled_B = sampling.sample(key_sample, p_final_BxV)
  if is_greedy is False:
    return end_B, sampled_B
  greedy_end_B, greedy_next_B = greedy_tree(draft, p_BxN1xV)
  return jnp.where(is_greedy, greedy_end_B, end_B), jnp.where(is_greedy, greedy_next_B, sampled_B)


@dataclasses.dataclass(frozen=True)
class TypicalAcceptance:
  """Medusa's typical acceptance: LOSSY, opt-in (``config.verifier = "typical"``).

  A node is accepted when the target gives its token probability above
  ``min(epsilon, delta * exp(-H(p)))`` at the parent (a looser bar where the target is unsure);
  the deepest node whose whole path passes wins, and the next token is drawn from the target
  there. The output is plausible text, not a sample of the target's distribution.
  """

  epsilon: float = 0.09
  delta: float = 0.3

  def __post_init__(self):
    if not (0 < self.epsilon <= 1 and self.delta > 0):
      raise ValueError(
        f"typical acceptance needs 0 < epsilon <= 1 and delta > 0, got epsilon={self.epsilon}, "
        f"delta={self.delta}."
      )

  def __call__(self, key, draft, p_BxN1xV, sp):
    b, n = draft.tokens.shape
    parents_BxN = (
      jnp.broadcast_to(jnp.arange(n), (b, n)) if draft.parents is None else draft.parents
    )
    p_par_BxNxV = _node_probs(p_BxN1xV, parents_BxN)
    entropy_BxN = -jnp.sum(p_par_BxNxV * jnp.log(jnp.maximum(p_par_BxNxV, 1e-30)), axis=-1)
    p_x_BxN = indexing.take_along(p_par_BxNxV, draft.tokens[..., None], axis=-1)[..., 0]
    pass_BxN = p_x_BxN > jnp.minimum(self.epsilon, self.delta * jnp.exp(-entropy_BxN))
    end_B = deepest_passing(parents_BxN, pass_BxN)
    p_end_BxV = indexing.take_along(p_BxN1xV, end_B[:, None, None], axis=1)[:, 0]
    return end_B, sampling.sample(key, p_end_BxV)
