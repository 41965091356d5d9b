"""Fakes for fast tests: tiny random models, and deliberately broken verifiers.

The broken verifiers exist so the exact-distribution tests can show that they fail on a
wrong algorithm, not only pass on the right one.
"""

import jax
import jax.numpy as jnp
import numpy as np

from specjax import sampling, verify
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
  import dataclasses

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


# --- Deliberately wrong verifiers (each must fail the exact-distribution test) ---------------


def resample_from_target(key, draft_BxK, q_BxKxV, p_BxK1xV):
  """Wrong: on rejection, draws from p instead of the residual norm(max(p - q, 0))."""
  b, k = draft_BxK.shape
  key_accept, key_sample = jax.random.split(key)
  p_x = jnp.take_along_axis(p_BxK1xV[:, :k], draft_BxK[..., None], axis=-1)[..., 0]
  q_x = jnp.take_along_axis(q_BxKxV, draft_BxK[..., None], axis=-1)[..., 0]
  n_B = verify.num_accepted(jax.random.uniform(key_accept, (b, k)) * q_x < p_x)
  dist = jnp.take_along_axis(p_BxK1xV, n_B[:, None, None], axis=1)[:, 0]
  return n_B, sampling.sample(key_sample, dist)


def accept_with_target_prob(key, draft_BxK, q_BxKxV, p_BxK1xV):
  """Wrong: accepts x with probability p(x), ignoring q (the rule for a one-hot draft)."""
  return verify.rejection_sample_chain(key, draft_BxK, jnp.ones_like(q_BxKxV), p_BxK1xV)
