"""verify.py: the rejection rate of one draft token equals TV(p, q), and the residual rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling, verify
from specjax.decode import generate
from specjax.drafters.draft_model import DraftModel


def _random_dist(key, v, temp):
  return jax.nn.softmax(jax.random.normal(key, (v,)) / temp)


def test_rejection_rate_equals_total_variation():
  """Leviathan et al. 2023: P(reject one draft token) = TV(p, q) = 1 - sum(min(p, q))."""
  n, v = 200_000, 8
  p = _random_dist(jax.random.key(0), v, 0.7)
  q = _random_dist(jax.random.key(1), v, 0.7)
  tv = 0.5 * float(jnp.abs(p - q).sum())
  x_N = jax.random.categorical(jax.random.key(2), jnp.log(q), shape=(n,))
  q_NxKxV = jnp.broadcast_to(q, (n, 1, v))
  p_NxK1xV = jnp.broadcast_to(p, (n, 2, v))
  n_acc, token = verify.rejection_sample_chain(jax.random.key(3), x_N[:, None], q_NxKxV, p_NxK1xV)
  rejected = float(jnp.mean(n_acc == 0))
  sigma = (tv * (1 - tv) / n) ** 0.5
  assert 0.2 < tv < 0.8, tv  # the distributions really differ
  assert abs(rejected - tv) < 4 * sigma, (rejected, tv, sigma)
  # The first emitted token (draft if accepted, else the residual's) is distributed as p.
  first = np.where(np.asarray(n_acc) == 1, np.asarray(x_N), np.asarray(token))
  freq = np.bincount(first, minlength=v) / n
  np.testing.assert_allclose(freq, np.asarray(p), atol=4 * (0.25 / n) ** 0.5)


@pytest.mark.slow
def test_rejection_rate_in_decode_matches_analytic_overlap(tiny_pair):
  """Through generate(): measured alpha_1 agrees with the analytic mean of 1 - TV(p, q)."""
  (tcfg, tparams), (dcfg, dparams) = tiny_pair
  out = generate(
    tparams,
    tcfg,
    [[1, 2, 3]] * 20000,
    drafter=DraftModel(dcfg, 1),
    drafter_params=dparams,
    max_new_tokens=2,
    max_len=8,
    temperature=1.0,
    seed=5,
  )
  m = out.metrics
  n = m["position_attempts"][0]
  alpha, analytic = m["alpha"][0], m["alpha_analytic"][0]
  assert n == 20000
  assert 0.1 < analytic < 0.9
  assert abs(alpha - analytic) < 4 * (analytic * (1 - analytic) / n) ** 0.5


def test_greedy_is_rejection_sampling_on_one_hot():
  """At temperature 0 a draft token survives iff it is the target's argmax."""
  sp = sampling.SamplingParams.create(0.0)
  logits_BxK1xV = jnp.array([[[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]]] * 2)
  p = sampling.probs(logits_BxK1xV, sp)
  drafts_BxK = jnp.array([[1, 0], [1, 2]])  # row 0 all match; row 1 fails at position 1
  q = jax.nn.one_hot(drafts_BxK, 3)
  n, tok = verify.rejection_sample_chain(jax.random.key(0), drafts_BxK, q, p)
  assert n.tolist() == [2, 1]
  assert tok.tolist() == [2, 0]  # bonus argmax for row 0, correction for row 1


def test_greedy_fast_path_equals_the_verifiers_at_temperature_0():
  """Decoding at temperature 0 skips the V-wide distributions (``loop._greedy_verdict``):
  its verdict (end, next token, overlap) equals the lossless verifier's and typical
  acceptance's on one-hot distributions, for chains (one-hot and soft q) and trees. Drafts
  hit the argmax often, so paths of every length occur."""
  from specjax.drafters.base import Draft
  from specjax.loop import _greedy_verdict, _verdict

  sp = sampling.SamplingParams.create(0.0)
  b, n, v = 64, 4, 6
  k1, k2, k3, k4 = jax.random.split(jax.random.key(7), 4)
  logits = jax.random.normal(k1, (b, n + 1, v))
  parents = jnp.broadcast_to(jnp.asarray([0, 0, 1, 2]), (b, n))
  for tree in (False, True):
    # node i's token: its parent's argmax, or (a third of the time) another token
    at = parents if tree else jnp.broadcast_to(jnp.arange(n), (b, n))
    best = jnp.take_along_axis(jnp.argmax(logits, -1), at, axis=1)
    other = jax.random.randint(k3, (b, n), 0, v)
    tokens = jnp.where(jax.random.uniform(k2, (b, n)) < 0.67, best, other)
    q = jax.nn.softmax(jax.random.normal(k4, (b, n, v)))
    for probs in (None,) if tree else (None, q):
      draft = Draft(tokens=tokens, probs=probs, parents=parents if tree else None)
      # jitted as the loop runs them (op by op, each op is a compile of its own)
      fast = jax.jit(lambda d, x: _greedy_verdict(n, None, d, x, sp))(draft, logits)
      for verifier in (verify.verify, verify.TypicalAcceptance()):
        run = lambda d, x, verifier=verifier: _verdict(verifier, n, jax.random.key(0), d, x, sp)  # noqa: E731
        slow = jax.jit(run)(draft, logits)
        for f, s in zip(fast, slow, strict=True):
          np.testing.assert_allclose(f, s, atol=1e-6)
      assert len(set(fast[0].tolist())) >= 3  # short and long paths both occur


def test_residual_is_normalised_positive_part():
  p = jnp.array([0.5, 0.3, 0.2])
  q = jnp.array([0.2, 0.5, 0.3])
  np.testing.assert_allclose(verify.residual(p, q), [1.0, 0.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(verify.residual(p, p), p)  # degenerate: never sampled, stays finite
