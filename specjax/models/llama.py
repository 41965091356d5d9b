"""A Llama-family decoder (Llama, SmolLM2, Qwen2) as pure functions of a params pytree.

    forward(params, cfg, tokens[B,T], positions[B,T], cache, mask) -> (logits[B,T,V], Hidden, cache)

``mask[T, T]`` (or ``[B, T, T]``) says which of the T new tokens each new token sees: a lower
triangle for a chain, an ancestor mask for a tree. Every token also sees the row's committed
cache prefix ``[0, cache.lengths[b])``. New keys/values are written at slots
``cache.lengths[b] + t``; ``lengths`` itself is left for the caller to commit.

Params layout (per-layer dicts in a tuple, so each layer's weights stay separate buffers).
Matrices are ``[out, in]``, as checkpoints store them: a one-token forward then reads each
weight row by row, which streams at full memory bandwidth on a CPU (``[in, out]`` ran ~25%
slower in a measured matrix-vector chain).

    embed [V, D], final_norm [D], lm_head [V, D] (untied only),
    layers: L x {attn_norm [D], wq [H*Dh, D], wk [G*Dh, D], wv [G*Dh, D], wo [D, H*Dh],
                 (bq [H*Dh], bk [G*Dh], bv [G*Dh] with qkv_bias), mlp_norm [D],
                 w_gate [F, D], w_up [F, D], w_down [D, F]}
"""

import jax
import jax.numpy as jnp
from flax import struct

from specjax.models.cache import KVCache, write_rows
from specjax.models.config import ModelConfig
from specjax.typing import Params


@struct.dataclass
class Hidden:
  final: jax.Array  # [B, T, D], after the final norm: what the LM head reads.
  layers: tuple[jax.Array, ...] = ()  # Residual stream after each requested layer, [B, T, D].


def init_params(
  cfg: ModelConfig,
  key: jax.Array,
  embed_std: float = 0.02,
  residual_scale: float = 1.0,
  dtype=jnp.float32,
) -> Params:
  """Random weights: N(0, 1/fan_in) projections, N(0, embed_std) embeddings.

  ``residual_scale`` shrinks the attention and MLP output projections; below 1 the layers
  perturb rather than replace the residual stream, so a model truncated to its first layers
  predicts much like the whole: a random stand-in for a well-matched draft.
  """
  d, hd, f = cfg.dim, cfg.head_dim, cfg.ffn_dim
  qd, kvd = cfg.num_heads * hd, cfg.num_kv_heads * hd
  keys = iter(jax.random.split(key, 16 * cfg.num_layers + 4))

  def dense(fan_in, fan_out, scale=1.0):
    w = jax.random.normal(next(keys), (fan_out, fan_in)) * scale / jnp.sqrt(fan_in)
    return w.astype(dtype)

  def bias(n):
    return (0.1 * jax.random.normal(next(keys), (n,))).astype(dtype)

  layers = []
  for _ in range(cfg.num_layers):
    layer = {
      "attn_norm": jnp.ones((d,), dtype),
      "wq": dense(d, qd),
      "wk": dense(d, kvd),
      "wv": dense(d, kvd),
      "wo": dense(qd, d, residual_scale),
      "mlp_norm": jnp.ones((d,), dtype),
      "w_gate": dense(d, f),
      "w_up": dense(d, f),
      "w_down": dense(f, d, residual_scale),
    }
    if cfg.qkv_bias:
      layer.update(bq=bias(qd), bk=bias(kvd), bv=bias(kvd))
    layers.append(layer)
  params = {
    "embed": (embed_std * jax.random.normal(next(keys), (cfg.vocab_size, d))).astype(dtype),
    "layers": tuple(layers),
    "final_norm": jnp.ones((d,), dtype),
  }
  if not cfg.tie_embeddings:
    params["lm_head"] = dense(d, cfg.vocab_size, embed_std * d**0.5)
  return params


def linear(x_xI: jax.Array, w_OxI: jax.Array) -> jax.Array:
  """``x @ w.T`` for a weight stored ``[out, in]``."""
  return jnp.einsum("...i,oi->...o", x_xI, w_OxI)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(var + eps) * weight


def rope(x_BxTxHxDh: jax.Array, positions_BxT: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding in the half-split layout (first half pairs with second half)."""
  half = x_BxTxHxDh.shape[-1] // 2
  inv_freq = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_BxTxHalf = positions_BxT[..., None].astype(jnp.float32) * inv_freq
  cos = jnp.cos(angles_BxTxHalf)[:, :, None, :]
  sin = jnp.sin(angles_BxTxHalf)[:, :, None, :]
  x1, x2 = x_BxTxHxDh[..., :half], x_BxTxHxDh[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxDh.dtype)


def attention_mask(lengths_B: jax.Array, mask_BxTxT: jax.Array, num_slots: int) -> jax.Array:
  """[B, T, S] visibility: the committed prefix, plus the new tokens allowed by ``mask``."""
  t = mask_BxTxT.shape[-1]
  rel_BxS = jnp.arange(num_slots)[None, :] - lengths_B[:, None]
  is_new_BxS = (rel_BxS >= 0) & (rel_BxS < t)
  new_BxTxS = jnp.take_along_axis(
    mask_BxTxT,
    jnp.broadcast_to(jnp.clip(rel_BxS, 0, t - 1)[:, None, :], (mask_BxTxT.shape[0], t, num_slots)),
    axis=2,
  )
  return (rel_BxS < 0)[:, None, :] | (is_new_BxS[:, None, :] & new_BxTxS)


def _attend(cfg, p, x_BxTxD, positions_BxT, k_cache, v_cache, lengths_B, visible_BxTxS):
  b, t, _ = x_BxTxD.shape
  hd, g = cfg.head_dim, cfg.num_kv_heads
  q = linear(x_BxTxD, p["wq"])
  k = linear(x_BxTxD, p["wk"])
  v = linear(x_BxTxD, p["wv"])
  if cfg.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  q_BxTxHxDh = rope(q.reshape(b, t, cfg.num_heads, hd), positions_BxT, cfg.rope_theta)
  k_BxTxGxDh = rope(k.reshape(b, t, g, hd), positions_BxT, cfg.rope_theta)
  v_BxTxGxDh = v.reshape(b, t, g, hd)
  k_cache = write_rows(k_cache, k_BxTxGxDh.transpose(0, 2, 1, 3), lengths_B, axis=1)
  v_cache = write_rows(v_cache, v_BxTxGxDh.transpose(0, 2, 1, 3), lengths_B, axis=1)

  # Queries grouped per kv head: [B, G, R*T, Dh] against the cache's [B, G, S, Dh].
  q_BxGxRTxDh = q_BxTxHxDh.reshape(b, t, g, cfg.groups, hd).transpose(0, 2, 3, 1, 4)
  q_BxGxRTxDh = q_BxGxRTxDh.reshape(b, g, cfg.groups * t, hd)
  scores = jnp.einsum("bgqd,bgsd->bgqs", q_BxGxRTxDh, k_cache) / jnp.sqrt(hd).astype(q.dtype)
  visible_Bx1xRTxS = jnp.tile(visible_BxTxS, (1, cfg.groups, 1))[:, None]
  scores = jnp.where(visible_Bx1xRTxS, scores, jnp.finfo(scores.dtype).min)
  weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v_cache.dtype)
  out_BxGxRTxDh = jnp.einsum("bgqs,bgsd->bgqd", weights, v_cache)
  out = out_BxGxRTxDh.reshape(b, g, cfg.groups, t, hd).transpose(0, 3, 1, 2, 4)
  out = out.reshape(b, t, cfg.num_heads * hd)
  return linear(out, p["wo"]), k_cache, v_cache


def forward(
  params: Params,
  cfg: ModelConfig,
  tokens_BxT: jax.Array,
  positions_BxT: jax.Array,
  cache: KVCache,
  mask: jax.Array,
  capture_layers: tuple[int, ...] = (),
) -> tuple[jax.Array, Hidden, KVCache]:
  """Runs the T new tokens of every row; see the module docstring for the contract."""
  b, t = tokens_BxT.shape
  mask_BxTxT = jnp.broadcast_to(mask, (b, t, t))
  visible_BxTxS = attention_mask(cache.lengths, mask_BxTxT, cache.num_slots)

  x = params["embed"][tokens_BxT]
  new_k, new_v, captured = [], [], []
  for i, p in enumerate(params["layers"]):
    h = rms_norm(x, p["attn_norm"], cfg.norm_eps)
    attn, k_i, v_i = _attend(
      cfg, p, h, positions_BxT, cache.k[i], cache.v[i], cache.lengths, visible_BxTxS
    )
    x = x + attn
    h = rms_norm(x, p["mlp_norm"], cfg.norm_eps)
    x = x + linear(jax.nn.silu(linear(h, p["w_gate"])) * linear(h, p["w_up"]), p["w_down"])
    new_k.append(k_i)
    new_v.append(v_i)
    if i in capture_layers:
      captured.append(x)

  final = rms_norm(x, params["final_norm"], cfg.norm_eps)
  head_VxD = params["embed"] if cfg.tie_embeddings else params["lm_head"]
  logits_BxTxV = linear(final, head_VxD).astype(jnp.float32)
  cache = cache.replace(k=tuple(new_k), v=tuple(new_v))
  return logits_BxTxV, Hidden(final=final, layers=tuple(captured)), cache


def causal_mask(t: int) -> jax.Array:
  return jnp.tril(jnp.ones((t, t), bool))


def init_cache(cfg: ModelConfig, batch: int, num_slots: int, dtype=jnp.float32) -> KVCache:
  return KVCache.zeros(cfg.num_layers, batch, num_slots, cfg.num_kv_heads, cfg.head_dim, dtype)
