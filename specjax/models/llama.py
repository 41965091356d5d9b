"""A Llama-family decoder (Llama, SmolLM2, Qwen2/3, Mistral) as public blocks over a params dict.

    x = embed(params, cfg, tokens[B,T])                                   # [B, T, D]
    attn = attention_inputs(cache.lengths, mask, cache.num_slots)         # shared by every layer
    x, k_new, v_new = block(params["layers"][i], cfg, x, positions[B,T], k_i, v_i, attn)
    logits = head(params, cfg, final_norm(params, cfg, x))                # [B, T, V] float32

``forward_kv`` is their composition over every layer: it only *reads* the cache and returns the
new tokens' keys/values; ``write_kv`` puts them at slots ``cache.lengths[b] + t``, and
``forward`` does both. ``lengths`` itself is left for the caller to commit. A drafter that needs
one decoder layer (EAGLE) or the target's head (Medusa) calls the same blocks.

``mask[T, T]`` (or ``[B, T, T]``) says which of the T new tokens each new token sees: a lower
triangle for a chain, an ancestor mask for a tree. Every token also sees the row's committed
cache prefix ``[0, cache.lengths[b])``. Attention scores the new tokens against that prefix and
against each other (the new K/V, not yet in the cache) under one softmax.

The prefix is read through a window of the cache: the smallest of a few static sizes (powers of
two from 128 up to half the cache, then the whole cache) that holds every row's prefix, chosen
per call with ``lax.switch``. A short prompt in a cache sized for 4096 tokens then attends over
128 or 256 slots, not 4096, and the compiled code has one small attention branch per size.
Because the forward never writes the cache, a ``lax.cond`` between two forwards (loop.py's
one-token step for abstaining drafters) passes the cache in read-only and XLA does not copy it.

Parameters are described once in ``SCHEMA`` (shapes, random init, partition specs, GGUF and HF
names). Matrices are ``[out, in]``, as checkpoints store them: a one-token forward then reads
each weight row by row, which streams at full memory bandwidth on a CPU (``[in, out]`` ran ~25%
slower in a measured matrix-vector chain).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec as P

from specjax import indexing
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
  Param("bo", lambda c: (c.dim,), "bias", P(), "blk.{i}.attn_output.bias",
        "model.layers.{i}.self_attn.o_proj.bias", lambda c: c.out_bias, per_layer=True),
  Param("b_gate", lambda c: (c.ffn_dim,), "bias", P("tensor"), "blk.{i}.ffn_gate.bias",
        "model.layers.{i}.mlp.gate_proj.bias", lambda c: c.mlp_bias, per_layer=True),
  Param("b_up", lambda c: (c.ffn_dim,), "bias", P("tensor"), "blk.{i}.ffn_up.bias",
        "model.layers.{i}.mlp.up_proj.bias", lambda c: c.mlp_bias, per_layer=True),
  Param("b_down", lambda c: (c.dim,), "bias", P(), "blk.{i}.ffn_down.bias",
        "model.layers.{i}.mlp.down_proj.bias", lambda c: c.mlp_bias, per_layer=True),
  Param("q_norm", lambda c: (c.head_dim,), "ones", P(), "blk.{i}.attn_q_norm.weight",
        "model.layers.{i}.self_attn.q_norm.weight", lambda c: c.qk_norm, per_layer=True),
  Param("k_norm", lambda c: (c.head_dim,), "ones", P(), "blk.{i}.attn_k_norm.weight",
        "model.layers.{i}.self_attn.k_norm.weight", lambda c: c.qk_norm, per_layer=True),
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


def param_shapes(cfg: ModelConfig, dtype=jnp.float32) -> Params:
  """``init_params``' shapes and dtype (``jax.ShapeDtypeStruct`` leaves), read off the schema."""
  return schema.shapes(SCHEMA, cfg, cfg.num_layers, dtype)


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
  """``x @ w.T`` for a weight stored ``[out, in]``.

  Narrower weights (bfloat16) multiply activations rounded to their type, accumulating and
  returning float32: XLA's fast bfloat16 product. Promoting the weights to float32 instead
  converts every weight on every call (a bfloat16 forward ran at 2.5-4.4x its matrices that
  way; experiments/verify_cost). A single row takes the transposed form, which XLA's CPU backend
  runs as a matrix-vector product: 7x faster than the row form for SmolLM2's 30 layers and
  head (24 vs 178 ms), while from two rows on the row form is 2-4x the faster (measured on a
  2-core AVX2 CPU; float32 products are the same either way).
  """
  if w_OxI.dtype == x_xI.dtype == jnp.float32:
    return jnp.einsum("...i,oi->...o", x_xI, w_OxI)
  x_xI = x_xI.astype(w_OxI.dtype)
  if math.prod(x_xI.shape[:-1]) == 1:
    return jnp.einsum("...i,io->...o", x_xI, w_OxI.T, preferred_element_type=jnp.float32)
  return jnp.einsum("...i,oi->...o", x_xI, w_OxI, preferred_element_type=jnp.float32)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  var = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(var + eps) * weight


def rope(
  x_BxTxHxDh: jax.Array,
  positions_BxT: jax.Array,
  theta: float,
  inv_freq: tuple[float, ...] = (),
  attention_factor: float = 1.0,
) -> jax.Array:
  """Rotary embedding in the half-split layout (first half pairs with second half).

  ``inv_freq`` (a scaled RoPE's frequencies, ``ModelConfig.rope_inv_freq``) replaces
  ``theta``'s; either way they are a compile-time constant. ``attention_factor`` scales cos and
  sin (YaRN)."""
  half = x_BxTxHxDh.shape[-1] // 2
  if inv_freq:
    inv_freq_H = jnp.asarray(np.asarray(inv_freq, np.float32))
  else:
    inv_freq_H = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles_BxTxHalf = positions_BxT[..., None].astype(jnp.float32) * inv_freq_H
  cos = jnp.cos(angles_BxTxHalf)[:, :, None, :]
  sin = jnp.sin(angles_BxTxHalf)[:, :, None, :]
  if attention_factor != 1.0:
    cos, sin = cos * attention_factor, sin * attention_factor
  x1, x2 = x_BxTxHxDh[..., :half], x_BxTxHxDh[..., half:]
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BxTxHxDh.dtype)


def embed(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array) -> jax.Array:
  """The residual stream is float32 whatever the weights' type (see ``attention``)."""
  del cfg
  return params["embed"][tokens_BxT].astype(jnp.float32)


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
  mask: jax.Array  # [B, T, T] which new tokens each new token sees ([B, T, M + T]: ``kv_before``).
  window: jax.Array  # [] int32: index into ``windows`` of the window this call reads.
  windows: tuple[int, ...] = struct.field(pytree_node=False)  # static window sizes (slots)
  # Static: True = each layer writes the new K/V into its cache, then reads prefix and new
  # tokens from the cache; False = the cache is only read (prefix) and the new K/V is kept apart.
  write: bool = struct.field(pytree_node=False, default=True)
  # Optional [B, T, S]: the slot each new token reads at each place of its attention sum
  # (``path_ordered``), where a tree node's ancestors are read as if consecutive, as in AR.
  order: jax.Array | None = None


def path_ordered(lengths_B: jax.Array, mask_BxTxT: jax.Array, num_slots: int) -> jax.Array:
  """``[B, T, S]``: for each new token, the cache slots in the order its attention sum reads
  them: the prefix ``[0, L)``, then the new tokens it sees (its ancestors and itself, in slot
  order: a tree numbers ancestors first) at places L, L + 1, ..., then the rest (unseen). A
  tree node then sums over the same values at the same places as an AR step at its position,
  whose prefix holds that path at consecutive slots (``loop.target_forward``)."""
  b, t = mask_BxTxT.shape[0], mask_BxTxT.shape[-1]
  idx_T = jnp.arange(t)
  seen_new_BxTxT = jnp.argsort(jnp.where(mask_BxTxT, idx_T, t + idx_T), axis=-1)
  rel_S = jnp.arange(num_slots)[None, None, :] - lengths_B[:, None, None]
  is_new = (rel_S >= 0) & (rel_S < t)
  new_slot = lengths_B[:, None, None] + indexing.take_along(
    seen_new_BxTxT, jnp.broadcast_to(jnp.clip(rel_S, 0, t - 1), (b, t, num_slots)), axis=2
  )
  return jnp.where(is_new, new_slot, jnp.arange(num_slots)[None, None, :])


def window_sizes(num_slots: int) -> tuple[int, ...]:
  """Static prefix windows for a cache of ``num_slots``: powers of two from ``MIN_WINDOW`` that
  are at most half the cache, then the whole cache."""
  sizes, w = [], MIN_WINDOW
  while 2 * w <= num_slots:
    sizes.append(w)
    w *= 2
  return (*sizes, num_slots)


def attention_inputs(
  lengths_B: jax.Array,
  mask: jax.Array,
  num_slots: int,
  window: int | None = None,
  write: bool = True,
) -> AttentionInputs:
  """The smallest window holding every row's prefix (and, when writing, its new tokens); or,
  with ``window``, exactly that many slots (static: one compiled branch; the caller guarantees
  that everything read fits, e.g. ``window=0`` to read nothing from an empty cache)."""
  b, t = lengths_B.shape[0], mask.shape[-1]
  windows = window_sizes(num_slots) if window is None else (window,)
  needed = jnp.max(lengths_B) + (t if write else 0)
  index = jnp.sum(jnp.asarray(windows[:-1]) < needed).astype(jnp.int32)
  mask = jnp.broadcast_to(mask, (b, *mask.shape[-2:]))
  return AttentionInputs(lengths_B, mask, index, windows, write)


def visibility(lengths_B: jax.Array, mask_BxTxT: jax.Array, num_slots: int) -> jax.Array:
  """[B, T, S] which cache slots each new token sees once written at ``lengths``: the
  committed prefix, plus the new tokens' slots that ``mask`` allows."""
  t = mask_BxTxT.shape[-1]
  rel_BxS = jnp.arange(num_slots)[None, :] - lengths_B[:, None]
  is_new_BxS = (rel_BxS >= 0) & (rel_BxS < t)
  new_BxTxS = indexing.take_along(
    mask_BxTxT,
    jnp.broadcast_to(jnp.clip(rel_BxS, 0, t - 1)[:, None, :], (mask_BxTxT.shape[0], t, num_slots)),
    axis=2,
  )
  return (rel_BxS < 0)[:, None, :] | (is_new_BxS[:, None, :] & new_BxTxS)


def _attend_path_ordered(cfg, q_BxGxRTxDh, k_cache, v_cache, lengths_B, mask_BxTxT, order):
  """``_attend_written`` over the whole cache with each new token reading the slots in its
  own ``order`` (``path_ordered``): the places it sees are the first L + (ancestors and
  itself), so the sum runs as an AR step's does."""
  b, g, rt, dh = q_BxGxRTxDh.shape
  t, s = order.shape[1], order.shape[2]
  q_BxGxRxTxDh = q_BxGxRTxDh.reshape(b, g, rt // t, t, dh)
  rows = lambda c: jnp.take_along_axis(c[:, :, None], order[:, None, :, :, None], axis=3)  # noqa: E731
  k_BxGxTxSxDh, v_BxGxTxSxDh = rows(k_cache[:, :, :s]), rows(v_cache[:, :, :s])
  scale = 1.0 / jnp.sqrt(dh).astype(q_BxGxRTxDh.dtype)
  scores = jnp.einsum("bgrtd,bgtsd->bgrts", q_BxGxRxTxDh, k_BxGxTxSxDh) * scale
  seen_BxTx1 = lengths_B[:, None, None] + jnp.sum(mask_BxTxT, -1)[..., None]
  seen_Bx1x1xTxS = (jnp.arange(s)[None, None, :] < seen_BxTx1)[:, None, None]
  scores = jnp.where(seen_Bx1x1xTxS, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(q_BxGxRTxDh.dtype)
  out = jnp.einsum("bgrts,bgtsd->bgrtd", weights, v_BxGxTxSxDh)
  return out.reshape(b, g, rt, dh)


def _attend_written(cfg, size, q_BxGxRTxDh, k_cache, v_cache, lengths_B, mask_BxTxT):
  """Softmax attention over the first ``size`` slots of a cache that already holds the new
  tokens' K/V (prefix and new tokens read alike)."""
  scale = 1.0 / jnp.sqrt(q_BxGxRTxDh.shape[-1]).astype(q_BxGxRTxDh.dtype)
  scores = jnp.einsum("bgqd,bgsd->bgqs", q_BxGxRTxDh, k_cache[:, :, :size]) * scale
  visible_Bx1xRTxW = jnp.tile(visibility(lengths_B, mask_BxTxT, size), (1, cfg.groups, 1))[:, None]
  scores = jnp.where(visible_Bx1xRTxW, scores.astype(jnp.float32), jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(q_BxGxRTxDh.dtype)
  return jnp.einsum("bgqs,bgsd->bgqd", weights, v_cache[:, :, :size])


def _attend_window(cfg, size, q_BxGxRTxDh, k_cache, v_cache, k_new, v_new, lengths_B, mask_BxTxT):
  """Softmax attention of the grouped queries over the first ``size`` cache slots (the row's
  prefix) and the T new tokens (as ``mask`` allows), under one softmax."""
  scale = 1.0 / jnp.sqrt(q_BxGxRTxDh.shape[-1]).astype(q_BxGxRTxDh.dtype)
  lowest = jnp.finfo(jnp.float32).min
  new_visible_Bx1xRTxT = jnp.tile(mask_BxTxT, (1, cfg.groups, 1))[:, None]
  scores_new = jnp.einsum("bgqd,bgtd->bgqt", q_BxGxRTxDh, k_new) * scale
  scores_new = jnp.where(new_visible_Bx1xRTxT, scores_new.astype(jnp.float32), lowest)
  if size == 0:  # an empty cache: the new tokens see only each other
    weights = jax.nn.softmax(scores_new, axis=-1).astype(q_BxGxRTxDh.dtype)
    return jnp.einsum("bgqt,bgtd->bgqd", weights, v_new)
  k_BxGxWxDh, v_BxGxWxDh = k_cache[:, :, :size], v_cache[:, :, :size]
  prefix_Bx1x1xW = (jnp.arange(size) < lengths_B[:, None])[:, None, None, :]
  scores_old = jnp.einsum("bgqd,bgsd->bgqs", q_BxGxRTxDh, k_BxGxWxDh) * scale
  scores_old = jnp.where(prefix_Bx1x1xW, scores_old.astype(jnp.float32), lowest)
  weights = jax.nn.softmax(jnp.concatenate([scores_old, scores_new], axis=-1), axis=-1)
  weights = weights.astype(q_BxGxRTxDh.dtype)
  out = jnp.einsum("bgqs,bgsd->bgqd", weights[..., :size], v_BxGxWxDh)
  return out + jnp.einsum("bgqt,bgtd->bgqd", weights[..., size:], v_new)


def qkv(p: Params, cfg: ModelConfig, x_BxTxD: jax.Array, positions_BxT: jax.Array):
  """Rotary queries grouped per kv head ``[B, G, R*T, Dh]`` (query r*T + t is head g*R + r at
  token t), keys and values ``[B, G, T, Dh]``."""
  b, t, _ = x_BxTxD.shape
  hd, g = cfg.head_dim, cfg.num_kv_heads
  q, k, v = linear(x_BxTxD, p["wq"]), linear(x_BxTxD, p["wk"]), linear(x_BxTxD, p["wv"])
  if cfg.qkv_bias:
    q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
  q_BxTxHxDh, k_BxTxGxDh = q.reshape(b, t, cfg.num_heads, hd), k.reshape(b, t, g, hd)
  if cfg.qk_norm:  # Qwen3: each head's q and k normalised before the rotation
    q_BxTxHxDh = rms_norm(q_BxTxHxDh, p["q_norm"], cfg.norm_eps)
    k_BxTxGxDh = rms_norm(k_BxTxGxDh, p["k_norm"], cfg.norm_eps)
  rot = (cfg.rope_theta, cfg.rope_inv_freq, cfg.rope_attention_factor)
  q_BxTxHxDh = rope(q_BxTxHxDh, positions_BxT, *rot)
  k_BxGxTxDh = rope(k_BxTxGxDh, positions_BxT, *rot).transpose(0, 2, 1, 3)
  v_BxGxTxDh = v.reshape(b, t, g, hd).transpose(0, 2, 1, 3)
  q_BxGxRTxDh = q_BxTxHxDh.reshape(b, t, g, cfg.groups, hd).transpose(0, 2, 3, 1, 4)
  return q_BxGxRTxDh.reshape(b, g, cfg.groups * t, hd), k_BxGxTxDh, v_BxGxTxDh


def attention_output(p: Params, cfg: ModelConfig, out_BxGxRTxDh: jax.Array) -> jax.Array:
  """The heads' outputs (grouped as ``qkv`` groups the queries) through ``wo``: ``[B, T, D]``."""
  b, g, rt, hd = out_BxGxRTxDh.shape
  t = rt // cfg.groups
  out = out_BxGxRTxDh.reshape(b, g, cfg.groups, t, hd).transpose(0, 3, 1, 2, 4)
  out_BxTxD = linear(out.reshape(b, t, cfg.num_heads * hd), p["wo"])
  return out_BxTxD + p["bo"] if cfg.out_bias else out_BxTxD


def attention(
  p: Params,
  cfg: ModelConfig,
  x_BxTxD: jax.Array,
  positions_BxT: jax.Array,
  k_cache: jax.Array | None,
  v_cache: jax.Array | None,
  attn: AttentionInputs,
  kv_before: tuple[jax.Array, jax.Array] | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Self-attention of one layer over the cached prefix and the new tokens.

  Returns the output and, with ``attn.write``, the layer's cache with the new keys/values
  written at ``lengths + t`` (written first, then read: XLA updates a loop-carried cache in
  place); without, the new keys and values ``[B, G, T, Dh]`` alone (for ``write_kv``) and the
  cache only read. ``kv_before`` (read-only calls): the keys and values ``[B, G, M, Dh]`` of M
  earlier uncached tokens (an earlier call's), read as if they came first among the new
  tokens; ``attn.mask`` is then ``[B, T, M + T]`` and the keys and values returned are all
  M + T, those before and then the new ones."""
  q_BxGxRTxDh, k_BxGxTxDh, v_BxGxTxDh = qkv(p, cfg, x_BxTxD, positions_BxT)
  if k_cache is not None and k_cache.dtype != k_BxGxTxDh.dtype:
    # A bfloat16 cache: the new tokens see each other's K/V rounded as the cache stores them,
    # so a T-token verify computes what T one-token steps reading the cache would.
    # (Products with float32 queries and weights promote back to float32.)
    k_BxGxTxDh, v_BxGxTxDh = k_BxGxTxDh.astype(k_cache.dtype), v_BxGxTxDh.astype(v_cache.dtype)
  if attn.write:
    k_cache = write_rows(k_cache, k_BxGxTxDh, attn.lengths, axis=1)
    v_cache = write_rows(v_cache, v_BxGxTxDh, attn.lengths, axis=1)
    args = (q_BxGxRTxDh, k_cache, v_cache, attn.lengths, attn.mask)
    branches = [lambda *a, w=w: _attend_written(cfg, w, *a) for w in attn.windows]
    if attn.order is not None:
      branches = [lambda *a: _attend_path_ordered(cfg, *a, attn.order)]
  else:
    if kv_before is not None:
      k_BxGxTxDh = jnp.concatenate([kv_before[0], k_BxGxTxDh], axis=2)
      v_BxGxTxDh = jnp.concatenate([kv_before[1], v_BxGxTxDh], axis=2)
    args = (q_BxGxRTxDh, k_cache, v_cache, k_BxGxTxDh, v_BxGxTxDh, attn.lengths, attn.mask)
    branches = [lambda *a, w=w: _attend_window(cfg, w, *a) for w in attn.windows]
  if len(branches) == 1:
    out_BxGxRTxDh = branches[0](*args)
  else:
    out_BxGxRTxDh = jax.lax.switch(attn.window, branches, *args)
  if attn.write:
    return attention_output(p, cfg, out_BxGxRTxDh), k_cache, v_cache
  return attention_output(p, cfg, out_BxGxRTxDh), k_BxGxTxDh, v_BxGxTxDh


def mlp(p: Params, cfg: ModelConfig, h_BxTxD: jax.Array) -> jax.Array:
  if not cfg.mlp_bias:
    return linear(
      jax.nn.silu(linear(h_BxTxD, p["w_gate"])) * linear(h_BxTxD, p["w_up"]), p["w_down"]
    )
  gate_BxTxF = linear(h_BxTxD, p["w_gate"]) + p["b_gate"]
  up_BxTxF = linear(h_BxTxD, p["w_up"]) + p["b_up"]
  return linear(jax.nn.silu(gate_BxTxF) * up_BxTxF, p["w_down"]) + p["b_down"]


def block(
  p: Params,
  cfg: ModelConfig,
  x_BxTxD: jax.Array,
  positions_BxT: jax.Array,
  k_cache: jax.Array,
  v_cache: jax.Array,
  attn: AttentionInputs,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One pre-norm decoder layer: the residual stream after it, and (see ``attention``) the
  layer's cache with the new K/V written, or the new K/V alone."""
  a, k_new, v_new = attention(
    p, cfg, rms_norm(x_BxTxD, p["attn_norm"], cfg.norm_eps), positions_BxT, k_cache, v_cache, attn
  )
  x_BxTxD = x_BxTxD + a
  x_BxTxD = x_BxTxD + mlp(p, cfg, rms_norm(x_BxTxD, p["mlp_norm"], cfg.norm_eps))
  return x_BxTxD, k_new, v_new


# --- the whole model --------------------------------------------------------------------------

FINAL = "final"  # feature name: the final-normed hidden state (what the LM head reads)


def check_context(cfg: ModelConfig, max_len: int) -> None:
  """Raises a ValueError if ``max_len`` tokens per row leave a sliding-window model's window:
  specjax's causal attention over the whole context is the window's result only within it."""
  if cfg.sliding_window and max_len > cfg.sliding_window:
    raise ValueError(
      f"max_len={max_len} is longer than {cfg.name!r}'s sliding window of {cfg.sliding_window} "
      "tokens: specjax attends over the whole context, which equals windowed attention only "
      f"within the window. Set max_len <= {cfg.sliding_window}."
    )


def check_features(cfg: ModelConfig, features: tuple) -> None:
  """Features are ``"final"`` or layer indices in ``[0, num_layers)`` (residual after it)."""
  for f in features:
    if f != FINAL and not (isinstance(f, int) and 0 <= f < cfg.num_layers):
      raise ValueError(
        f"feature {f!r} is unknown for {cfg.name!r}: use 'final' (the final normed hidden "
        f"state) or a layer index in [0, {cfg.num_layers}) (the residual stream after it)."
      )


@struct.dataclass
class NewKV:
  """The T new tokens' keys and values of every layer, ``L x [B, G, T, Dh]``."""

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]


def forward_kv(
  params: Params,
  cfg: ModelConfig,
  tokens_BxT: jax.Array,
  positions_BxT: jax.Array,
  cache: KVCache | None,
  mask: jax.Array,
  features: tuple = (),
  window: int | None = None,
) -> tuple[jax.Array, tuple[jax.Array, ...], NewKV]:
  """Runs the T new tokens of every row against the cached prefixes, reading the cache only:
  ``(logits [B,T,V], features, new K/V)``.

  ``features`` names hidden states to return, each ``[B, T, D]``, in order: ``"final"`` or a
  layer index (the residual stream after that layer). Nothing extra is kept when it is empty.
  ``window`` fixes the attended prefix slots statically (no window switch to compile); a
  ``cache`` of None is an empty prefix (``window`` 0).
  """
  b, t = tokens_BxT.shape
  if cache is None:
    lengths, window = jnp.zeros((b,), jnp.int32), 0
    layer_kv = [(None, None)] * cfg.num_layers
  else:
    lengths, layer_kv = cache.lengths, list(zip(cache.k, cache.v, strict=True))
  attn = attention_inputs(lengths, mask, 0 if cache is None else cache.num_slots, window, False)
  logits, feats, new = _layers(params, cfg, tokens_BxT, positions_BxT, layer_kv, attn, features)
  return logits, feats, new


# Every layer of a forward has the same shapes, so ``block`` runs as a nested jit: JAX traces it
# once per shape and lowers it once per program (a function every layer calls), and XLA inlines
# the calls before it optimises, so the compiled program computes what the unrolled layers did.
# A SmolLM2 prompt-lookup loop (30 layers) traced in 0.58 s instead of 2.41 s and lowered in
# 0.35 s instead of 0.72 s; the test suite ran in 0.83-0.88x its time (notes/testing-diary.md).
_block = jax.jit(block, static_argnums=(1,))


def _layers(params, cfg, tokens_BxT, positions_BxT, layer_kv, attn, features):
  """``embed``, every ``block`` over its (k, v) in ``layer_kv``, ``final_norm``, ``head``:
  ``(logits, features, NewKV)``, the blocks' K/V outputs (what ``attn`` made of the cache)."""
  x = embed(params, cfg, tokens_BxT)
  new_k, new_v, after = [], [], {}
  for i, (p, (k_i, v_i)) in enumerate(zip(params["layers"], layer_kv, strict=True)):
    x, k_new, v_new = _block(p, cfg, x, positions_BxT, k_i, v_i, attn)
    new_k.append(k_new)
    new_v.append(v_new)
    if i in features:
      after[i] = x
  h = final_norm(params, cfg, x)
  after[FINAL] = h
  return head(params, cfg, h), tuple(after[f] for f in features), NewKV(tuple(new_k), tuple(new_v))


def write_kv(cache: KVCache, new: NewKV, at_B: jax.Array | None = None) -> KVCache:
  """The cache with every layer's new K/V written at slots ``at[b] + t`` (default: the
  committed lengths), in place."""
  at_B = cache.lengths if at_B is None else at_B
  write = lambda buf, x: write_rows(buf, x, at_B, axis=1)  # noqa: E731
  return cache.replace(k=tuple(map(write, cache.k, new.k)), v=tuple(map(write, cache.v, new.v)))


def forward(
  params: Params,
  cfg: ModelConfig,
  tokens_BxT: jax.Array,
  positions_BxT: jax.Array,
  cache: KVCache,
  mask: jax.Array,
  features: tuple = (),
  window: int | None = None,
  path_order: bool = False,
) -> tuple[jax.Array, tuple[jax.Array, ...], KVCache]:
  """Runs the T new tokens of every row, writing their K/V into the cache layer by layer
  before reading it: ``(logits [B,T,V], features, cache)``. Arguments as ``forward_kv``;
  ``window``, when given, must also hold the new tokens' slots. ``path_order``: each new
  token reads the whole cache in its own order (``path_ordered``)."""
  attn = attention_inputs(cache.lengths, mask, cache.num_slots, window)
  if path_order:
    attn = attn.replace(order=path_ordered(cache.lengths, attn.mask, cache.num_slots))
  layer_kv = zip(cache.k, cache.v, strict=True)  # written, in place, by each block
  logits, feats, new = _layers(params, cfg, tokens_BxT, positions_BxT, layer_kv, attn, features)
  return logits, feats, cache.replace(k=new.k, v=new.v)


def causal_mask(t: int) -> jax.Array:
  return jnp.tril(jnp.ones((t, t), bool))


def param_dtype(params: Params):
  """The weights' float type (the embedding's); caches are kept in it too."""
  return params["embed"].dtype


def cast(params: Params, dtype) -> Params:
  """Every floating weight as ``dtype`` (integer leaves, e.g. vocabulary maps, stay)."""
  return jax.tree.map(
    lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
  )


def init_cache(cfg: ModelConfig, batch: int, num_slots: int, dtype=jnp.float32) -> KVCache:
  return KVCache.zeros(cfg.num_layers, batch, num_slots, cfg.num_kv_heads, cfg.head_dim, dtype)


def logits_of(params: Params, cfg: ModelConfig, tokens_BxT: jax.Array, features: tuple = ()):
  """Causal logits (and features) over whole sequences: one forward, no cache."""
  b, t = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
  logits, feats, _ = forward_kv(
    params, cfg, tokens_BxT, positions_BxT, None, causal_mask(t), features
  )
  return logits, feats
