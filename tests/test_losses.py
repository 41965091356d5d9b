"""The token losses a drafter can be trained with (``specjax.train.losses.token_loss``): each
equals speculators' reference loss of the same name (its eager module, which it checks its own
fused kernels against), its gradient equals a finite difference (float64), and each means what
its name says (tv is 1 - the acceptance probability, soft_ce - kl is p's entropy)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from specjax import losses

# specjax's name -> speculators.losses.eager's function
REFERENCE = {
  "kl": "kl_div_loss", "rkl": "reverse_kl_div_loss", "jsd": "js_div_loss", "tv": "tv_loss",
  "nla": "neg_log_acceptance_loss", "ce": "ce_loss", "lk": "lk_hybrid_loss",
}  # fmt: skip


def _logits(seed, shape=(1, 6, 17), scale=3.0):
  return scale * np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", REFERENCE)
def test_each_loss_is_speculators_reference(name):
  torch = pytest.importorskip("torch")
  eager = pytest.importorskip("speculators.losses.eager")
  draft, target = _logits(0), _logits(1)
  want = getattr(eager, REFERENCE[name])(torch.from_numpy(draft), torch.from_numpy(target))
  got = losses.token_loss(name, jax.nn.softmax(target), jax.nn.log_softmax(draft))
  np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", losses.TOKEN_LOSSES)
def test_each_gradient_is_a_finite_difference(name):
  with jax.enable_x64(True):
    p = jax.nn.softmax(jnp.asarray(_logits(1, (3, 9)), jnp.float64))
    draft = jnp.asarray(_logits(0, (3, 9)), jnp.float64)
    each = lambda name, z: losses.token_loss(name, p, jax.nn.log_softmax(z))  # noqa: E731
    f = lambda z: jnp.sum(each(name, z))  # noqa: E731
    assert f(draft).dtype == jnp.float64
    if name == "lk":  # no gradient through the blend weight: the blend's, at the weight held
      w = jnp.exp(-losses.LK_ETA * (1 - each("tv", draft)))
      held = lambda z: jnp.sum(w * each("kl", z) + (1 - w) * each("tv", z))  # noqa: E731
      np.testing.assert_allclose(jax.grad(f)(draft), jax.grad(held)(draft), rtol=1e-9)
      f = held
    check_grads(f, (draft,), order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)


def test_what_the_losses_mean():
  p = jax.nn.softmax(_logits(1, (4, 11)))
  log_q = jax.nn.log_softmax(_logits(0, (4, 11)))
  q = jnp.exp(log_q)
  loss = lambda name, p=p, log_q=log_q: losses.token_loss(name, p, log_q)  # noqa: E731
  np.testing.assert_allclose(loss("tv"), 1 - jnp.sum(jnp.minimum(p, q), -1), rtol=1e-6)
  entropy = -jnp.sum(p * jnp.log(p), -1)
  np.testing.assert_allclose(loss("soft_ce") - loss("kl"), entropy, rtol=1e-5)
  for name in losses.TOKEN_LOSSES:  # the draft equal to the target: no divergence left
    if name not in ("soft_ce", "ce", "nla"):
      np.testing.assert_allclose(loss(name, log_q=jnp.log(p)), 0.0, atol=1e-6)
  # A restricted p (a reduced draft vocabulary) sums below 1; tv is still 1 - acceptance, and
  # an underflowed p(x) = 0 leaves every loss finite.
  sub = p.at[:, :3].set(0.0)
  assert all(bool(jnp.all(jnp.isfinite(loss(n, p=sub)))) for n in losses.TOKEN_LOSSES)
  np.testing.assert_allclose(loss("tv", p=sub), 1 - jnp.sum(jnp.minimum(sub, q), -1), rtol=1e-6)


def test_an_unknown_loss_is_one_clear_error():
  with pytest.raises(ValueError, match=r"config.objective.eagle.loss='l2' is unknown; choose"):
    losses.check_token_loss("l2", "config.objective.eagle.loss")


def test_hass_top_k_is_the_soft_cross_entropy_on_the_targets_top_k():
  p = jax.nn.softmax(_logits(1, (4, 11)))
  log_q = jax.nn.log_softmax(_logits(0, (4, 11)))
  top = np.argsort(-np.asarray(p), axis=-1)[:, :3]
  want = -np.sum(np.take_along_axis(np.asarray(p * log_q), top, -1), -1)
  np.testing.assert_allclose(losses.top_k_soft_ce(p, log_q, 3), want, rtol=1e-6)
  # every token: the whole soft cross-entropy
  np.testing.assert_allclose(
    losses.top_k_soft_ce(p, log_q, 11), losses.token_loss("soft_ce", p, log_q), rtol=1e-6
  )
  with jax.enable_x64(True):
    p64 = jax.nn.softmax(jnp.asarray(_logits(1, (3, 9)), jnp.float64))
    z = jnp.asarray(_logits(0, (3, 9)), jnp.float64)
    f = lambda z: jnp.sum(losses.top_k_soft_ce(p64, jax.nn.log_softmax(z), 4))  # noqa: E731
    check_grads(f, (z,), order=1, modes=("rev",), eps=1e-6, atol=1e-6, rtol=1e-6)
