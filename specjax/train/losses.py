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
  nll = -jnp.take_along_axis(log_q, tokens_BxT[:, 1:, None], axis=-1)[..., 0]
  return masked_mean(nll, mask_BxT[:, :-1])
