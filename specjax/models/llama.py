"""A Llama-family decoder (Llama, SmolLM2, Qwen2) as public building blocks over a params dict.

    x = embed(params, cfg, tokens[B,T])                                   # [B, T, D]
    attn = attention_inputs(cache.lengths, mask, cache.num_slots, T)      # shared by every layer
    x, k, v = block(params["layers"][i], cfg, x, positions[B,T], k_i, v_i, attn)
    logits = head(params, cfg, final_norm(params, cfg, x))                # [B, T, V] float32

``forward`` is their composition over every layer and the cache; a drafter that needs one
decoder layer (EAGLE) or the target's head (Medusa) calls the same blocks.

``mask[T, T]`` (or ``[B, T, T]``) says which of the T new tokens each new token sees: a lower
triangle for a chain, an ancestor mask for a tree. Every token also sees the row's committed
cache prefix ``[0, cache.lengths[b])``. New keys/values are written at slots
``cache.lengths[b] + t``; ``lengths`` itself is left for the caller to commit.

Attention reads only a window of the cache: the smallest of a few static sizes (powers of two
from 128, and the whole cache) that holds every row's prefix and new tokens, chosen per call
with ``lax.switch``. A short prompt in a cache sized for 4096 tokens then attends over 128 or
256 slots, not 4096, and the compiled code has one small attention branch per size.

Parameters are described once in ``SCHEMA`` (shapes, random init, partition specs, GGUF and HF
names). Matrices are ``[out, in]``, as checkpoints store them: a one-token forward then reads
each weight row by row, which streams at full memory bandwidth on a CPU (``[in, out]`` ran ~25%
slower in a measured matrix-vector chain).
"""

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec as P

from specjax.models import schema
from specjax.models.cache import KVCache, write_rows
from specjax.models.config import ModelConfig
from specjax.models.schema import Param
from specjax.typing import Params

_qd = lambda c: c.num_heads * c.head_dim  # noqa: E731
_kvd = lambda c: c.num_kv_heads * c.head_dim  # noqa: E731
_bias = lambda c: c.qkv_bias  # noqa: E731
# Column-parallel projections split their output over `tensor`, row-parallel ones their input;
# `fsdp` takes the other dimension (see specjax/parallel.py).
_COL, _ROW = P("tensor", "fsdp"), P("fsdp", "tensor")

SCHEMA: schema.Schema = (
  Param("attn_norm", lambda c: (c.dim,), "ones", P(), "blk.{i}.attn_norm.weight",
        "model.layers.{i}.input_layernorm.weight", per_layer=True),
  Param("wq", lambda c: (_qd(c), c.dim), "normal", _COL, "blk.{i}.attn_q.weight",
        "model.layers.{i}.self_attn.q_proj.weight", per_layer=True),
  Param("wk", lambda c: (_kvd(c), c.dim), "normal", _COL, "blk.{i}.attn_k.weight",
        "model.layers.{i}.self_attn.k_proj.weight", per_layer=True),
  Param("wv", lambda c: (_kvd(c), c.dim), "normal", _COL, "blk.{i}.attn_v.weight",
        "model.layers.{i}.self_attn.v_proj.weight", per_layer=True),
  Param("wo", lambda c: (c.dim, _qd(c)), "residual", _ROW, "blk.{i}.attn_output.weight",
        "model.layers.{i}.self_attn.o_proj.weight", per_layer=True),
  Param("mlp_norm", lambda c: (c.dim,), "ones", P(), "blk.{i}.ffn_norm.weight",
        "model.layers.{i}.post_attention_layernorm.weight", per_layer=True),
  Param("w_gate", lambda c: (c.ffn_dim, c.dim), "normal", _COL, "blk.{i}.ffn_gate.weight",
        "model.layers.{i}.mlp.gate_proj.weight", per_layer=True),
  Param("w_up", lambda c: (c.ffn_dim, c.dim), "normal", _COL, "blk.{i}.ffn_up.weight",
        "model.layers.{i}.mlp.up_proj.weight", per_layer=True),
  Param("w_down", lambda c: (c.dim, c.ffn_dim), "residual", _ROW, "blk.{i}.ffn_down.weight",
        "model.layers.{i}.mlp.down_proj.weight", per_layer=True),
  Param("bq", lambda c: (_qd(c),), "bias", P("tensor"), "blk.{i}.attn_q.bias",
        "model.layers.{i}.self_attn.q_proj.bias", _bias, per_layer=True),
  Param("bk", lambda c: (_kvd(c),), "bias", P("tensor"), "blk.{i}.attn_k.bias",
        "model.layers.{i}.self_attn.k_proj.bias", _bias, per_layer=True),
  Param("bv", lambda c: (_kvd(c),), "bias", P("tensor"), "blk.{i}.attn_v.bias",
        "model.layers.{i}.self_attn.v_proj.bias", _bias, per_layer=True),
  Param("embed", lambda c: (c.vocab_size, c.dim), "embed", _COL, "token_embd.weight",
        "model.embed_tokens.weight"),
  Param("final_norm", lambda c: (c.dim,), "ones", P(), "output_norm.weight", "model.norm.weight"),
  Param("lm_head", lambda c: (c.vocab_size, c.dim), "head", _COL, "output.weight",
        "lm_head.weight", lambda c: not c.tie_embeddings),
)  # fmt: skip
RULES = schema.partition_rules(SCHEMA)

MIN_WINDOW = 128  # smallest attention window (slots); windows double up to the whole cache


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
  return schema.init_params(SCHEMA, cfg, key, cfg.num_layers, embed_std, residual_scale, dtype)


def check_params(cfg: ModelConfig, params: Params) -> None:
  """Raises a ValueError naming the first weight missing, extra or misshapen for ``cfg``."""
  if not isinstance(params, dict) or len(params.get("layers", ())) != cfg.num_layers:
    n = len(params.get("layers", ())) if isinstance(params, dict) else "no"
    raise ValueError(
      f"params have {n} layers but {cfg.name!r} has {cfg.num_layers}: pass the params that "
      "were loaded or trained with this config."
    )
  schema.check_shapes(SCHEMA, cfg, params, cfg.num_layers)


# --- building blocks --------------------------------------------------------------------------


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


def embed(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array) -> jax.Array:
  del cfg
  return params["embed"][tokens_BxT]


def final_norm(params: Params, cfg: ModelConfig, x_BxTxD: jax.Array) -> jax.Array:
  return rms_norm(x_BxTxD, params["final_norm"], cfg.norm_eps)


def head(params: Params, cfg: ModelConfig, h_BxTxD: jax.Array) -> jax.Array:
  """Logits ``[B, T, V]`` (float32) from final-normed hidden states."""
  head_VxD = params["embed"] if cfg.tie_embeddings else params["lm_head"]
  return linear(h_BxTxD, head_VxD).astype(jnp.float32)


@struct.dataclass
class AttentionInputs:
  """What every layer's attention shares in one forward."""

  lengths: jax.Array  # [B] committed prefix per row: slots [0, L) are visible to every token.
  mask: jax.Array  # [B, T, T] which new tokens each new token sees.
  window: jax.Array  # [] int32: index into ``windows`` of the window this call reads.
  windows: tuple[int, ...] = struct.field(pytree_node=False)  # static window sizes (slots)


def window_sizes(num_slots: int, num_new: int) -> tuple[int, ...]:
  """Static attention windows for a cache of ``num_slots``: powers of two from ``MIN_WINDOW``
  that can hold ``num_new`` new tokens and are at most half the cache, then the whole cache."""
  sizes, w = [], MIN_WINDOW
  while 2 * w <= num_slots:
    if w >= num_new:
      sizes.append(w)
    w *= 2
  return (*sizes, num_slots)


def attention_inputs(
  lengths_B: jax.Array, mask: jax.Array, num_slots: int, num_new: int, windowed: bool = True
) -> AttentionInputs:
  """The smallest window holding every row's prefix and its ``num_new`` new tokens
  (``windowed=False``: the whole cache, one compiled branch)."""
  b = lengths_B.shape[0]
  windows = window_sizes(num_slots, num_new) if windowed else (num_slots,)
  needed = jnp.max(lengths_B) + num_new
  window = jnp.sum(jnp.asarray(windows[:-1]) < needed).astype(jnp.int32)
  mask_BxTxT = jnp.broadcast_to(mask, (b, num_new, num_new))
  return AttentionInputs(lengths_B, mask_BxTxT, window, windows)


def visibility(lengths_B: jax.Array, mask_BxTxT: jax.Array, num_slots: int) -> jax.Array:
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


def _attend_window(cfg, size, q_BxGxRTxDh, k_cache, v_cache, lengths_B, mask_BxTxT):
  """Softmax attention of the grouped queries over the first ``size`` slots of the cache."""
  b, g, rt, hd = q_BxGxRTxDh.shape
  k_BxGxWxDh, v_BxGxWxDh = k_cache[:, :, :size], v_cache[:, :, :size]
  scores = jnp.einsum("bgqd,bgsd->bgqs", q_BxGxRTxDh, k_BxGxWxDh) / jnp.sqrt(hd).astype(
    q_BxGxRTxDh.dtype
  )
  visible_BxTxW = visibility(lengths_B, mask_BxTxT, size)
  visible_Bx1xRTxW = jnp.tile(visible_BxTxW, (1, cfg.groups, 1))[:, None]
  scores = jnp.where(visible_Bx1xRTxW, scores, jnp.finfo(scores.dtype).min)
  weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(v_cache.dtype)
  return jnp.einsum("bgqs,bgsd->bgqd", weights, v_BxGxWxDh)


def attention(
  p: Params,
  cfg: ModelConfig,
  x_BxTxD: jax.Array,
  positions_BxT: jax.Array,
  k_cache: jax.Array,
  v_cache: jax.Array,
  attn: AttentionInputs,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Self-attention of one layer: writes the new K/V into the cache, reads the window."""
  b, t, _ = x_BxTxD.shape
  hd, g = cfg.head_dim, cfg.num_kv_heads
  q, k, v = linear(x_BxTxD, p["wq"]), linear(x_BxTxD, p["wk"]), linear(x_BxTxD, p["wv"])
  if cfg.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  q_BxTxHxDh = rope(q.reshape(b, t, cfg.num_heads, hd), positions_BxT, cfg.rope_theta)
  k_BxTxGxDh = rope(k.reshape(b, t, g, hd), positions_BxT, cfg.rope_theta)
  v_BxTxGxDh = v.reshape(b, t, g, hd)
  k_cache = write_rows(k_cache, k_BxTxGxDh.transpose(0, 2, 1, 3), attn.lengths, axis=1)
  v_cache = write_rows(v_cache, v_BxTxGxDh.transpose(0, 2, 1, 3), attn.lengths, axis=1)

  # Queries grouped per kv head: [B, G, R*T, Dh] against the cache's [B, G, S, Dh].
  q_BxGxRTxDh = q_BxTxHxDh.reshape(b, t, g, cfg.groups, hd).transpose(0, 2, 3, 1, 4)
  q_BxGxRTxDh = q_BxGxRTxDh.reshape(b, g, cfg.groups * t, hd)
  args = (q_BxGxRTxDh, k_cache, v_cache, attn.lengths, attn.mask)
  branches = [lambda *a, w=w: _attend_window(cfg, w, *a) for w in attn.windows]
  if len(branches) == 1:
    out_BxGxRTxDh = branches[0](*args)
  else:
    out_BxGxRTxDh = jax.lax.switch(attn.window, branches, *args)
  out = out_BxGxRTxDh.reshape(b, g, cfg.groups, t, hd).transpose(0, 3, 1, 2, 4)
  out = out.reshape(b, t, cfg.num_heads * hd)
  return linear(out, p["wo"]), k_cache, v_cache


def mlp(p: Params, cfg: ModelConfig, h_BxTxD: jax.Array) -> jax.Array:
  del cfg
  return linear(jax.nn.silu(linear(h_BxTxD, p["w_gate"])) * linear(h_BxTxD, p["w_up"]), p["w_down"])


def block(
  p: Params,
  cfg: ModelConfig,
  x_BxTxD: jax.Array,
  positions_BxT: jax.Array,
  k_cache: jax.Array,
  v_cache: jax.Array,
  attn: AttentionInputs,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One pre-norm decoder layer: returns the residual stream after it and the layer's cache."""
  a, k_cache, v_cache = attention(
    p, cfg, rms_norm(x_BxTxD, p["attn_norm"], cfg.norm_eps), positions_BxT, k_cache, v_cache, attn
  )
  x_BxTxD = x_BxTxD + a
  x_BxTxD = x_BxTxD + mlp(p, cfg, rms_norm(x_BxTxD, p["mlp_norm"], cfg.norm_eps))
  return x_BxTxD, k_cache, v_cache


# --- the whole model --------------------------------------------------------------------------

FINAL = "final"  # feature name: the final-normed hidden state (what the LM head reads)


def check_features(cfg: ModelConfig, features: tuple) -> None:
  """Features are ``"final"`` or layer indices in ``[0, num_layers)`` (residual after it)."""
  for f in features:
    if f != FINAL and not (isinstance(f, int) and 0 <= f < cfg.num_layers):
      raise ValueError(
        f"feature {f!r} is unknown for {cfg.name!r}: use 'final' (the final normed hidden "
        f"state) or a layer index in [0, {cfg.num_layers}) (the residual stream after it)."
      )


def forward(
  params: Params,
  cfg: ModelConfig,
  tokens_BxT: jax.Array,
  positions_BxT: jax.Array,
  cache: KVCache,
  mask: jax.Array,
  features: tuple = (),
  windowed: bool = True,
) -> tuple[jax.Array, tuple[jax.Array, ...], KVCache]:
  """Runs the T new tokens of every row: ``(logits [B,T,V], features, cache)``.

  ``features`` names hidden states to return, each ``[B, T, D]``, in order: ``"final"`` or a
  layer index (the residual stream after that layer). Nothing extra is kept when it is empty.
  ``windowed=False`` attends over the whole cache with no window switch: less to compile, for
  a forward that runs once (a prefill).
  """
  t = tokens_BxT.shape[1]
  attn = attention_inputs(cache.lengths, mask, cache.num_slots, t, windowed)
  x = embed(params, cfg, tokens_BxT)
  new_k, new_v, after = [], [], {}
  for i, p in enumerate(params["layers"]):
    x, k_i, v_i = block(p, cfg, x, positions_BxT, cache.k[i], cache.v[i], attn)
    new_k.append(k_i)
    new_v.append(v_i)
    if i in features:
      after[i] = x
  h = final_norm(params, cfg, x)
  after[FINAL] = h
  cache = cache.replace(k=tuple(new_k), v=tuple(new_v))
  return head(params, cfg, h), tuple(after[f] for f in features), cache


def causal_mask(t: int) -> jax.Array:
  return jnp.tril(jnp.ones((t, t), bool))


def init_cache(cfg: ModelConfig, batch: int, num_slots: int, dtype=jnp.float32) -> KVCache:
  return KVCache.zeros(cfg.num_layers, batch, num_slots, cfg.num_kv_heads, cfg.head_dim, dtype)


def logits_of(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array, features: tuple = ()):
  """Causal logits (and features) over whole sequences: one forward into an empty cache."""
  b, t = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
  logits, feats, _ = forward(
    params, cfg, tokens_BxT, positions_BxT, init_cache(cfg, b, t), causal_mask(t), features
  )
  return logits, feats
