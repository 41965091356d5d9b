"""Distillation losses over masked positions: pure functions of logits, no model code.

``mask_BxT[b, t] = 1`` where position t's next-token prediction counts (the data contract of
``specjax.train.data``). Every loss is a mean over counted positions, so batches with different
numbers of counted positions weigh each position equally, and a batch with none gives 0.

Besides the loss, ``distill_kl`` reports what a speculative decoder will see:
``accept`` = E[sum_x min(p(x), q(x))], the probability that one token drawn from the draft q is
accepted against the target p (1 - total variation; Leviathan et al. 2023), and ``top1`` = how
often argmax q == argmax p (greedy acceptance of one draft token).

``token_loss`` is the per-position pull of a draft distribution q towards the target's p, by
name (``TOKEN_LOSSES``; the trainable drafters' ``objective.<name>.loss``); ``alpha`` below is
``sum_x min(p(x), q(x))``, the acceptance probability of one drafted token:

    soft_ce   -sum p log q                    cross-entropy on the target's distribution
    kl        sum p (log p - log q)           forward KL (soft_ce minus p's entropy)
    rkl       sum q (log q - log p)           reverse KL (mode-seeking)
    jsd       (KL(p || m) + KL(q || m)) / 2   Jensen-Shannon, m = (p + q) / 2
    tv        1 - alpha                       total variation: 1 - acceptance
    nla       -log alpha                      negative log-acceptance (LK; TV's gradient / alpha)
    ce        -log q(argmax p)                cross-entropy on the target's top token
    lk        l kl + (1 - l) tv               LK hybrid, l = exp(-LK_ETA sg(alpha)) (no gradient
                                              through the blend weight; Samarin et al. 2026)

With a reduced draft vocabulary p is the target's distribution restricted to the draft's tokens
(it sums to less than 1): ``alpha`` is then still exactly the acceptance probability.
"""

import jax
import jax.numpy as jnp

from specjax import indexing

TOKEN_LOSSES = ("soft_ce", "kl", "rkl", "jsd", "tv", "nla", "ce", "lk")
LK_ETA = 3.0  # the LK hybrid's blend temperature (the paper's best)
NLA_FLOOR = 1e-5  # nla's alpha floor (a draft with no overlap still has a finite loss)


def masked_mean(x_BxT: jax.Array, mask_BxT: jax.Array) -> jax.Array:
  mask_BxT = mask_BxT.astype(jnp.float32)
  return jnp.sum(x_BxT * mask_BxT) / jnp.maximum(jnp.sum(mask_BxT), 1.0)


def distill_kl(
  teacher_logits_BxTxV: jax.Array,
  student_logits_BxTxV: jax.Array,
  mask_BxT: jax.Array,
  temperature: float = 1.0,
  loss: str = "kl",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Forward KL(p_teacher || q_student) at ``temperature``, DistillSpec-style (or another
  ``token_loss``, ``loss``, of the two distributions at that temperature); plus metrics.

  The teacher is treated as a constant (no gradient flows into it). At temperature t the loss
  is scaled by t^2 so gradient magnitudes stay comparable across temperatures (Hinton et al.).
  """
  teacher = jax.lax.stop_gradient(teacher_logits_BxTxV.astype(jnp.float32))
  student = student_logits_BxTxV.astype(jnp.float32)
  log_p = jax.nn.log_softmax(teacher / temperature, axis=-1)
  log_q = jax.nn.log_softmax(student / temperature, axis=-1)
  p = jnp.exp(log_p)
  kl_BxT = jnp.sum(p * (log_p - log_q), axis=-1)
  chosen_BxT = kl_BxT if loss == "kl" else token_loss(loss, p, log_q)
  value = masked_mean(chosen_BxT, mask_BxT) * temperature**2

  # Acceptance metrics at temperature 1, the distributions decoding really compares.
  p1 = jax.nn.softmax(teacher, axis=-1)
  q1 = jax.nn.softmax(jax.lax.stop_gradient(student), axis=-1)
  accept_BxT = jnp.sum(jnp.minimum(p1, q1), axis=-1)
  top1_BxT = (jnp.argmax(teacher, -1) == jnp.argmax(student, -1)).astype(jnp.float32)
  return value, {
    "kl": masked_mean(kl_BxT, mask_BxT),
    "accept": masked_mean(accept_BxT, mask_BxT),
    "top1": masked_mean(top1_BxT, mask_BxT),
  }


def check_token_loss(name: str, field: str) -> None:
  if name not in TOKEN_LOSSES:
    raise ValueError(f"{field}={name!r} is unknown; choose one of {', '.join(TOKEN_LOSSES)}.")


def token_loss(name: str, p_xW: jax.Array, log_q_xW: jax.Array) -> jax.Array:
  """``[...]``: loss ``name`` (``TOKEN_LOSSES``) of the draft's log-probabilities ``log_q``
  against the target's probabilities ``p`` over the same tokens (last axis), in float32 at least;
  p is a constant (no gradient flows into it). log p is floored at the smallest normal number
  where p underflows to 0, so rkl and jsd stay finite."""
  at_least_f32 = jnp.promote_types(log_q_xW.dtype, jnp.float32)  # float64 stays (tests)
  p = jax.lax.stop_gradient(p_xW.astype(at_least_f32))
  log_q = log_q_xW.astype(at_least_f32)
  if name == "soft_ce":
    return -jnp.sum(p * log_q, axis=-1)
  if name == "ce":
    return -indexing.take_along(log_q, jnp.argmax(p, axis=-1)[..., None], axis=-1)[..., 0]
  q = jnp.exp(log_q)
  log_p = jnp.log(jnp.maximum(p, jnp.finfo(at_least_f32).tiny))
  kl = lambda: jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)  # noqa: E731
  alpha = jnp.sum(jnp.minimum(p, q), axis=-1)
  if name == "kl":
    return kl()
  if name == "rkl":
    return jnp.sum(q * (log_q - log_p), axis=-1)
  if name == "jsd":
    log_m = jnp.logaddexp(log_p, log_q) - jnp.log(2.0)
    to_m = jnp.sum(jnp.where(p > 0, p * (log_p - log_m), 0.0), axis=-1)
    return 0.5 * (to_m + jnp.sum(q * (log_q - log_m), axis=-1))
  if name == "tv":
    return 1.0 - alpha
  if name == "nla":
    return -jnp.log(jnp.maximum(alpha, NLA_FLOOR))
  if name == "lk":
    blend = jnp.exp(-LK_ETA * jax.lax.stop_gradient(alpha))
    return blend * kl() + (1.0 - blend) * (1.0 - alpha)
  raise ValueError(f"unknown token loss {name!r}; choose one of {', '.join(TOKEN_LOSSES)}.")


def top_k_soft_ce(p_xW: jax.Array, log_q_xW: jax.Array, k: int) -> jax.Array:
  """``[...]``: HASS's harmonized objective distillation (Zhang et al. 2025): the soft
  cross-entropy on the target's ``k`` most likely tokens alone, ``-sum_{x in top-k(p)} p(x)
  log q(x)``, where a drafted tree looks."""
  at_least_f32 = jnp.promote_types(log_q_xW.dtype, jnp.float32)
  p = jax.lax.stop_gradient(p_xW.astype(at_least_f32))
  top_p, top_ids = jax.lax.top_k(p, min(k, p.shape[-1]))
  top_log_q = indexing.take_along(log_q_xW.astype(at_least_f32), top_ids, axis=-1)
  return -jnp.sum(top_p * top_log_q, axis=-1)


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
  loss: str = "soft_ce",
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Medusa-1: head k at position t learns the target's own prediction at t + k.

  The target's distribution at t + k (over the next token, t + k + 1) is the soft label of head
  k at t: ``token_loss(loss)`` (by default cross-entropy ``-sum_w p_{t+k}(w) log q_{k,t}(w)``)
  over the draft vocabulary ``w``,
  averaged over positions whose labels stay in one document (``mask`` counts at t, ..., t + k),
  weighted ``decay ** (k - 1)``. Metrics per head: ``top1_k`` (head k's argmax is the target's)
  and ``top5_k`` (the target's argmax is in head k's top 5), over the same positions.
  """
  t, h = head_logits_BxTxHxW.shape[1], head_logits_BxTxHxW.shape[2]
  teacher = jax.lax.stop_gradient(target_logits_BxTxV.astype(jnp.float32))
  p_BxTxW = jax.nn.softmax(teacher, axis=-1)[..., vocab_ids_W]
  argmax_BxT = jnp.argmax(teacher, axis=-1)
  mask_BxT = mask_BxT.astype(jnp.float32)
  total, metrics = 0.0, {}
  for k in range(1, min(h, t - 1) + 1):
    # Head k at t <-> the target at t + k; counted where t .. t + k are all in one document.
    valid_BxT = within_document(mask_BxT, k)
    log_q_BxTxW = jax.nn.log_softmax(head_logits_BxTxHxW[:, : t - k, k - 1].astype(jnp.float32))
    xent_BxT = token_loss(loss, p_BxTxW[:, k:], log_q_BxTxW)
    total = total + decay ** (k - 1) * masked_mean(xent_BxT, valid_BxT)
    want_BxT = argmax_BxT[:, k:]
    _, top5_BxTx5 = jax.lax.top_k(jax.lax.stop_gradient(log_q_BxTxW), min(5, len(vocab_ids_W)))
    top5_ids = vocab_ids_W[top5_BxTx5]
    hit1_BxT = (top5_ids[..., 0] == want_BxT).astype(jnp.float32)
    metrics[f"top1_{k}"] = masked_mean(hit1_BxT, valid_BxT)
    metrics[f"top5_{k}"] = masked_mean(
      jnp.any(top5_ids == want_BxT[..., None], axis=-1).astype(jnp.float32), valid_BxT
    )
  return total, metrics


def eagle_losses(
  out_BxTxF: jax.Array,
  f_next_BxTxF: jax.Array,
  draft_logits_BxTxW: jax.Array,
  p_next_BxTxW: jax.Array,
  argmax_next_BxT: jax.Array,
  vocab_ids_W: jax.Array,
  valid_BxT: jax.Array,
  loss: str = "soft_ce",
  top_k: int = 0,
) -> dict[str, jax.Array]:
  """EAGLE's two terms at every counted pair, and its teacher-forced acceptance.

  ``feature``: smooth-L1 between the drafter's output at pair t and the target's feature at
  t + 1 (mean over the feature axis); ``token``: ``token_loss(loss)`` of the draft's
  distribution against the target's own at t + 1 (``p_next``, restricted to the draft
  vocabulary); ``top_k`` (with ``top_k`` > 0): HASS's ``top_k_soft_ce``; ``top1``:
  how often the draft's argmax is the target's (``argmax_next``: greedy acceptance of one
  drafted token)."""
  f_next = jax.lax.stop_gradient(f_next_BxTxF.astype(jnp.float32))
  err = jnp.abs(out_BxTxF.astype(jnp.float32) - f_next)
  smooth_l1_BxT = jnp.mean(jnp.where(err < 1.0, 0.5 * err**2, err - 0.5), axis=-1)
  log_q = jax.nn.log_softmax(draft_logits_BxTxW.astype(jnp.float32), axis=-1)
  xent_BxT = token_loss(loss, p_next_BxTxW, log_q)
  hit_BxT = vocab_ids_W[jnp.argmax(draft_logits_BxTxW, -1)] == argmax_next_BxT
  terms = {
    "feature": masked_mean(smooth_l1_BxT, valid_BxT),
    "token": masked_mean(xent_BxT, valid_BxT),
    "top1": masked_mean(hit_BxT.astype(jnp.float32), valid_BxT),
  }
  if top_k:
    terms["top_k"] = masked_mean(top_k_soft_ce(p_next_BxTxW, log_q, top_k), valid_BxT)
  return terms
