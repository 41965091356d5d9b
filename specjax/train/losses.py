"""Distillation losses over masked positions: pure functions of logits, no model code.

``mask_BxT[b, t] = 1`` where position t's next-token prediction counts (the data contract of
``specjax.train.data``). Every loss is a mean over counted positions, so batches with different
numbers of counted positions weigh each position equally, and a batch with none gives 0.

Besides the loss, ``distill_kl`` reports what a speculative decoder will see:
``accept`` = E[sum_x min(p(x), q(x))], the probability that one token drawn from the draft q is
accepted against the target p (1 - total variation; Leviathan et al. 2023), and ``top1`` = how
often argmax q == argmax p (greedy acceptance of one draft token).
"""

import jax
import jax.numpy as jnp

from specjax import indexing


def masked_mean(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  mask_BxT = mask_BxT.astype(jnp.float32)
  return jnp.sum(x_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def distill_kl(
  teacher_logits_BxTxV: jax.Array,
  student_logits_BxTxV: jax.Array,
  mask_BxT: jax.Array,
  temperature: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Forward KL(p_teacher || q_student) at ``temperature``, DistillSpec-style; plus metrics.

  The teacher is treated as a constant (no gradient flows into it). At temperature t the loss
  is scaled by t^2 so gradient magnitudes stay comparable across temperatures (Hinton et al.).
  """
  teacher = jax.lax.stop_gradient(teacher_logits_BxTxV.astype(jnp.float32))
  student = student_logits_BxTxV.astype(jnp.float32)
  log_p = jax.nn.log_softmax(teacher / temperature, axis=-1)
  log_q = jax.nn.log_softmax(student / temperature, axis=-1)
  p = jnp.exp(log_p)
  kl_BxT = jnp.sum(p * (log_p - log_q), axis=-1)
  loss = masked_mean(kl_BxT, mask_BxT) * temperature**2

  # Acceptance metrics at temperature 1, the distributions decoding really compares.
  p1 = jax.nn.softmax(teacher, axis=-1)
  q1 = jax.nn.softmax(jax.lax.stop_gradient(student), axis=-1)
  accept_BxT = jnp.sum(jnp.minimum(p1, q1), axis=-1)
  top1_BxT = (jnp.argmax(teacher, -1) == jnp.argmax(student, -1)).astype(jnp.float32)
  return loss, {
    "kl": masked_mean(kl_BxT, mask_BxT),
    "accept": masked_mean(accept_BxT, mask_BxT),
    "top1": masked_mean(top1_BxT, mask_BxT),
  }


def next_token_xent(
  logits_BxTxV: jax.Array, tokens_BxT: jax.Array, mask_BxT: jax.Array
) -> jax.Array:
  """Cross-entropy of position t's logits against token t+1 (the last position never counts)."""
  log_q = jax.nn.log_softmax(logits_BxTxV[:, :-1].astype(jnp.float32), axis=-1)
  nll = -indexing.take_along(log_q, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
  return masked_mean(nll, mask_BxT[:, :-1])


def within_document(mask_BxT: jax.Array, k: int) -> jax.Array:
  """``[B, T - k]``: 1 where positions t .. t + k all count, so the token k + 1 places after t
  is in t's document (the label of a head that looks k tokens further than the target)."""
  t = mask_BxT.shape[1]
  valid_BxT = mask_BxT[:, : t - k]
  for j in range(1, k + 1):
    valid_BxT = valid_BxT * mask_BxT[:, j : t - k + j]
  return valid_BxT


def medusa_xent(
  target_logits_BxTxV: jax.Array,
  head_logits_BxTxHxW: jax.Array,
  vocab_ids_W: jax.Array,
  mask_BxT: jax.Array,
  decay: float = 0.8,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Medusa-1: head k at position t learns the target's own prediction at t + k.

  The target's distribution at t + k (over the next token, t + k + 1) is the soft label of head
  k at t: cross-entropy ``-sum_w p_{t+k}(w) log q_{k,t}(w)`` over the draft vocabulary ``w``,
  averaged over positions whose labels stay in one document (``mask`` counts at t, ..., t + k),
  weighted ``decay ** (k - 1)``. Metrics per head: ``top1_k`` (head k's argmax is the target's)
  and ``top5_k`` (the target's argmax is in head k's top 5), over the same positions.
  """
  t, h = head_logits_BxTxHxW.shape[1], head_logits_BxTxHxW.shape[2]
  teacher = jax.lax.stop_gradient(target_logits_BxTxV.astype(jnp.float32))
  p_BxTxW = jax.nn.softmax(teacher, axis=-1)[..., vocab_ids_W]
  argmax_BxT = jnp.argmax(teacher, axis=-1)
  mask_BxT = mask_BxT.astype(jnp.float32)
  loss, metrics = 0.0, {}
  for k in range(1, min(h, t - 1) + 1):
    # Head k at t <-> the target at t + k; counted where t .. t + k are all in one document.
    valid_BxT = within_document(mask_BxT, k)
    log_q_BxTxW = jax.nn.log_softmax(head_logits_BxTxHxW[:, : t - k, k - 1].astype(jnp.float32))
    xent_BxT = -jnp.sum(p_BxTxW[:, k:] * log_q_BxTxW, axis=-1)
    loss = loss + decay ** (k - 1) * masked_mean(xent_BxT, valid_BxT)
    want_BxT = argmax_BxT[:, k:]
    _, top5_BxTx5 = jax.lax.top_k(jax.lax.stop_gradient(log_q_BxTxW), min(5, len(vocab_ids_W)))
    top5_ids = vocab_ids_W[top5_BxTx5]
    hit1_BxT = (top5_ids[..., 0] == want_BxT).astype(jnp.float32)
    metrics[f"top1_{k}"] = masked_mean(hit1_BxT, valid_BxT)
    metrics[f"top5_{k}"] = masked_mean(
      jnp.any(top5_ids == want_BxT[..., None], axis=-1).astype(jnp.float32), valid_BxT
    )
  return loss, metrics


def eagle_losses(
  out_BxTxF: jax.Array,
  f_next_BxTxF: jax.Array,
  draft_logits_BxTxW: jax.Array,
  p_next_BxTxW: jax.Array,
  argmax_next_BxT: jax.Array,
  vocab_ids_W: jax.Array,
  valid_BxT: jax.Array,
) -> dict[str, jax.Array]:
  """EAGLE's two terms at every counted pair, and its teacher-forced acceptance.

  ``feature``: smooth-L1 between the drafter's output at pair t and the target's feature at
  t + 1 (mean over the feature axis); ``token``: cross-entropy of the draft's distribution
  against the target's own at t + 1 (``p_next``, restricted to the draft vocabulary); ``top1``:
  how often the draft's argmax is the target's (``argmax_next``: greedy acceptance of one
  drafted token)."""
  f_next = jax.lax.stop_gradient(f_next_BxTxF.astype(jnp.float32))
  err = jnp.abs(out_BxTxF.astype(jnp.float32) - f_next)
  smooth_l1_BxT = jnp.mean(jnp.where(err < 1.0, 0.5 * err**2, err - 0.5), axis=-1)
  log_q = jax.nn.log_softmax(draft_logits_BxTxW.astype(jnp.float32), axis=-1)
  xent_BxT = -jnp.sum(jax.lax.stop_gradient(p_next_BxTxW) * log_q, axis=-1)
  hit_BxT = vocab_ids_W[jnp.argmax(draft_logits_BxTxW, -1)] == argmax_next_BxT
  return {
    "feature": masked_mean(smooth_l1_BxT, valid_BxT),
    "token": masked_mean(xent_BxT, valid_BxT),
    "top1": masked_mean(hit_BxT.astype(jnp.float32), valid_BxT),
  }
