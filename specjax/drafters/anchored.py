"""Training on anchored blocks, shared by the block drafters' objectives (DFlash, P-EAGLE): the
target's features of a batch, anchors drawn per row, each drafted position's label (the target's
distribution of that token) and whether it counts, and the block metrics."""

import jax
import jax.numpy as jnp

from specjax.models import llama


def target_features(frozen, target_cfg, batch, wanted: tuple, read: int):
  """The target's final features ``[B, T, F]`` (its logits are the head on them) and the first
  ``read`` of ``wanted``'s features concatenated ``[B, T, read * F]``: from the batch's cached
  features (in ``wanted``'s order, the final one last) or one target forward."""
  if "features" in batch:
    f = target_cfg.dim
    cached = batch["features"].astype(jnp.float32)
    feats = [cached[..., i * f : (i + 1) * f] for i in range(len(wanted))]
  else:
    _, feats = llama.logits_of(frozen, target_cfg, batch["tokens"], wanted)
  fused = jnp.concatenate(feats[:read], axis=-1)
  return jax.lax.stop_gradient(feats[-1]), jax.lax.stop_gradient(fused)


def draw(valid_BxT: jax.Array, key: jax.Array, count: int) -> tuple[jax.Array, jax.Array]:
  """``(anchors [B, A], used [B, A])``: ``count`` positions per row drawn without replacement
  among the valid ones; a row with fewer gets unused (zero-weight) extras."""
  b, t = valid_BxT.shape
  scores = jnp.where(valid_BxT, jax.random.gumbel(key, (b, t)), -jnp.inf)
  top_BxA, anchor_BxA = jax.lax.top_k(scores, count)
  return anchor_BxA, jnp.isfinite(top_BxA)


def labels(final_BxTxF, head_VxF, mask_BxT, row_R, drafted_RxD, used_R):
  """``(target logits [R, D, V'], counted [R, D])`` of the tokens at ``drafted`` (positions in
  row ``row_R``): the target's head (its draft-vocabulary rows) at the position before each,
  counted where that token counts, lies inside the row and its block is used."""
  t = mask_BxT.shape[1]
  at_RxD = jnp.clip(drafted_RxD - 1, 0, t - 1)
  target_RxDxV = llama.linear(final_BxTxF[row_R[:, None], at_RxD], head_VxF)
  counted = mask_BxT[row_R[:, None], jnp.minimum(drafted_RxD, t - 1)].astype(jnp.float32)
  return target_RxDxV, counted * used_R[:, None] * (drafted_RxD < t)


def metrics(out_RxDxV, target_RxDxV, counted_RxD, used_R) -> dict:
  """Top-1 agreement with the target (all positions, and the first) and ``accept_len``: the
  greedy chain's expected accepted length plus the target's own token."""
  agree = (jnp.argmax(out_RxDxV, -1) == jnp.argmax(target_RxDxV, -1)) & (counted_RxD > 0)
  run_R = jnp.sum(jnp.cumprod(agree, axis=1), axis=1)
  blocks = jnp.maximum(jnp.sum(used_R), 1)
  return {
    "top1": jnp.sum(agree) / (jnp.sum(counted_RxD) + 1e-6),
    "top1_first": jnp.sum(agree[:, 0]) / (jnp.sum(counted_RxD[:, 0]) + 1e-6),
    "accept_len": 1.0 + jnp.sum(run_R * used_R) / blocks,
  }
