"""Fakes for fast tests: tiny random models, a random tree drafter, broken verifiers.

The broken verifiers exist so the exact-distribution tests can show that they fail on a
wrong algorithm, not only pass on the right one.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling, trees, verify
from specjax.drafters.base import Draft, Stateless
from specjax.models import llama
from specjax.models.config import ModelConfig


def tiny_config(vocab_size=8, dim=16, num_layers=2, name="tiny", **kw) -> ModelConfig:
  kw = dict(num_heads=2, num_kv_heads=1, ffn_dim=2 * dim, tie_embeddings=False) | kw
  return ModelConfig(vocab_size=vocab_size, dim=dim, num_layers=num_layers, name=name, **kw)


def tiny_model(seed: int = 0, logit_std: float = 1.5, residual_scale: float = 1.0, **kw):
  """A random tiny LM whose next-token distributions have moderate entropy."""
  cfg = tiny_config(**kw)
  params = llama.init_params(
    cfg, jax.random.key(seed), embed_std=logit_std / cfg.dim**0.5, residual_scale=residual_scale
  )
  return cfg, params


def truncated(cfg: ModelConfig, params, num_layers: int):
  """The first ``num_layers`` layers of a model with its own embeddings and head: a cheap draft."""
  small = dataclasses.replace(cfg, num_layers=num_layers, name=f"{cfg.name}-first{num_layers}")
  return small, dict(params, layers=params["layers"][:num_layers])


def sequence_probs(params, cfg, prompt, num_new, sp: sampling.SamplingParams) -> np.ndarray:
  """Enumerates the target's joint distribution over every continuation of ``num_new`` tokens.

  Returns ``[V] * num_new`` probabilities, computed with full forwards (no cache tricks) and
  the same ``sampling.probs``: the ground truth the decode loop must reproduce.
  """
  v = cfg.vocab_size
  conts = np.stack(np.meshgrid(*[np.arange(v)] * num_new, indexing="ij"), -1).reshape(-1, num_new)
  seqs = np.concatenate([np.tile(np.asarray(prompt), (len(conts), 1)), conts], axis=1)
  n, t = seqs.shape
  cache = llama.init_cache(cfg, n, t)
  pos = jnp.broadcast_to(jnp.arange(t), (n, t))
  logits, _, _ = llama.forward(params, cfg, jnp.asarray(seqs), pos, cache, llama.causal_mask(t))
  p = np.asarray(sampling.probs(logits, sp))  # [n, t, V]
  lp = len(prompt)
  joint = np.ones(n)
  for i in range(num_new):
    joint *= p[np.arange(n), lp - 1 + i, conts[:, i]]
  return joint.reshape([v] * num_new)


# --- A random tree drafter -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RandomTreeDrafter(Stateless):
  """Proposes a tree whose children are drawn from a random q per node.

  Every internal node gets its own random distribution q (through ``sampling.probs``, so top-k
  and top-p apply); its children are drawn from q *without replacement* by Gumbel-top-k and
  labelled with q, which is what recursive rejection sampling needs. ``deterministic=True``
  instead takes q's top tokens in order yet still labels them with the soft q: a wrong
  pairing that the exact-distribution test must catch. With ``alt_tree`` (same node count)
  every row picks one of the two topologies at random each step: a dynamic tree, whose
  parents are data.
  """

  tree: trees.Tree
  spread: float = 1.0
  deterministic: bool = False
  alt_tree: trees.Tree | None = None
  name: str = "random_tree"

  def __post_init__(self):
    if self.alt_tree is not None and self.alt_tree.num_nodes != self.tree.num_nodes:
      raise ValueError("alt_tree must have as many nodes as tree.")

  @property
  def num_draft(self) -> int:
    return max(self.tree.max_depth, (self.alt_tree or self.tree).max_depth)

  @property
  def num_nodes(self) -> int:
    return self.tree.num_nodes

  @staticmethod
  def _parents_and_rank(tree: trees.Tree) -> np.ndarray:
    parents = np.asarray(tree.parents)
    rank = [int(np.sum(parents[:i] == parents[i])) for i in range(len(parents))]
    return np.stack([parents, np.asarray(rank)])

  def propose(self, params, state, ctx):
    b, v = ctx.tokens.shape[0], ctx.vocab_size
    key_q, key_g, key_t = jax.random.split(ctx.key, 3)
    layout_2xN = jnp.asarray(self._parents_and_rank(self.tree), jnp.int32)
    layout_Bx2xN = jnp.broadcast_to(layout_2xN, (b,) + layout_2xN.shape)
    if self.alt_tree is not None:
      alt_2xN = jnp.asarray(self._parents_and_rank(self.alt_tree), jnp.int32)
      pick_B = jax.random.bernoulli(key_t, 0.5, (b,))
      layout_Bx2xN = jnp.where(pick_B[:, None, None], alt_2xN, layout_Bx2xN)
    parents_BxN, rank_BxN = layout_Bx2xN[:, 0], layout_Bx2xN[:, 1]
    n1 = self.tree.num_nodes + 1
    logits_BxN1xV = self.spread * jax.random.normal(key_q, (b, n1, v))
    q_BxN1xV = sampling.probs(logits_BxN1xV, ctx.sampling)
    score_BxN1xV = jnp.log(q_BxN1xV)
    if not self.deterministic:
      score_BxN1xV += jax.random.gumbel(key_g, (b, n1, v))
    order_BxN1xV = jnp.argsort(-score_BxN1xV, axis=-1)
    order_BxNxV = jnp.take_along_axis(order_BxN1xV, parents_BxN[..., None], axis=1)
    tokens_BxN = jnp.take_along_axis(order_BxNxV, rank_BxN[..., None], axis=2)[..., 0]
    draft = Draft(
      tokens=tokens_BxN.astype(jnp.int32),
      probs=jnp.take_along_axis(q_BxN1xV, parents_BxN[..., None], axis=1),
      parents=parents_BxN,
    )
    return draft, state


# --- Deliberately wrong verifiers (each must fail the exact-distribution test) ---------------


def resample_from_target(key, draft, p_BxK1xV, sp):
  """Wrong: on rejection, draws from p instead of the residual norm(max(p - q, 0))."""
  b, k = draft.tokens.shape
  key_accept, key_sample = jax.random.split(key)
  p_x = jnp.take_along_axis(p_BxK1xV[:, :k], draft.tokens[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(draft.probs, draft.tokens[..., None], axis=-1)[..., 0]
  n_B = verify.num_accepted(jax.random.uniform(key_accept, (b, k)) * q_x < p_x)
  dist = jnp.take_along_axis(p_BxK1xV, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sampling.sample(key_sample, dist)


def accept_with_target_prob(key, draft, p_BxK1xV, sp):
  """Wrong: accepts x with probability p(x), ignoring q (the rule for a one-hot draft)."""
  return verify.rejection_sample_chain(key, draft.tokens, jnp.ones_like(draft.probs), p_BxK1xV)


def skip_q_renormalisation(key, draft, p_BxN1xV, sp):
  """Wrong: after a sibling is rejected, keeps using q instead of q without that token."""
  return verify.rejection_sample_tree(key, draft, p_BxN1xV, sp, renormalise=False)
