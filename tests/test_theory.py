"""The closed forms of specjax/theory.py against simulation and against the real verifier."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing, theory, verify
from specjax.drafters.base import Draft


@pytest.mark.parametrize("alpha, k", [(0.3, 1), (0.6, 4), (0.9, 8), (1.0, 3), (0.0, 5)])
def test_expected_tokens_matches_iid_simulation(alpha, k):
  """A step yields the accepted prefix of K i.i.d. Bernoulli(alpha) drafts plus one token."""
  rng = np.random.default_rng(0)
  accepted = rng.random((200_000, k)) < alpha
  prefix = np.where(accepted.all(1), k, np.argmin(accepted, axis=1))
  assert theory.expected_tokens(alpha, k) == pytest.approx(prefix.mean() + 1, abs=0.01)


def test_acceptance_of_the_real_verifier_is_one_minus_tv():
  """One draft token drawn from q, verified against p by the chain rule: accepted with
  probability sum_x min(p, q) = 1 - TV(p, q), for random pairs (what alpha means)."""
  rows, v = 40_000, 6
  gaps = {"verify": [], "broken": []}
  rng = np.random.default_rng(1)
  for pair in range(4):
    p, q = rng.dirichlet(np.ones(v) * 0.7), rng.dirichlet(np.ones(v) * 0.7)
    tokens = rng.choice(v, size=(rows, 1), p=q).astype(np.int32)
    draft = Draft(jnp.asarray(tokens), jnp.broadcast_to(jnp.asarray(q, jnp.float32), (rows, 1, v)))
    p_BxN1xV = jnp.broadcast_to(jnp.asarray(p, jnp.float32), (rows, 2, v))
    tv = 0.5 * np.abs(p - q).sum()
    for name, rule in (("verify", verify.verify), ("broken", testing.accept_with_target_prob)):
      n, _ = rule(jax.random.key(pair), draft, p_BxN1xV, None)
      gaps[name].append(abs(float(np.mean(np.asarray(n) > 0)) - (1 - tv)))
  assert max(gaps["verify"]) < 0.01, gaps
  assert max(gaps["broken"]) > 0.05, gaps  # accepting with p(x) alone is not 1 - TV


def test_optimal_k_is_the_brute_force_argmax_and_verify_cost_one_is_leviathan():
  for alpha in (0.5, 0.8, 0.95):
    for c in (0.02, 0.2):
      speeds = [theory.speedup(alpha, k, c) for k in range(1, 65)]
      assert theory.optimal_k(alpha, c) == 1 + int(np.argmax(speeds))
      assert theory.speedup_with_verify_cost(alpha, 3, c, lambda t: 1.0) == theory.speedup(
        alpha, 3, c
      )
  # a dearer verify (2x at K + 1 = 5 tokens) lowers the best K
  dear = theory.interpolate({1: 1.0, 9: 3.0})
  assert theory.optimal_k(0.8, 0.05, verify=dear) < theory.optimal_k(0.8, 0.05)


def test_alpha_from_tau_inverts_expected_tokens():
  for alpha, k in ((0.3, 2), (0.75, 6)):
    assert theory.alpha_from_tau(theory.expected_tokens(alpha, k), k) == pytest.approx(alpha)
  with pytest.raises(ValueError, match=r"tau=5 must be in \[1, K \+ 1 = 4\]"):
    theory.alpha_from_tau(5, 3)


def test_losslessness_task_random_pairs_follow_tv():
  from specjax.tasks import losslessness

  pairs = losslessness.random_pairs(num_pairs=5, rows=20_000, vocab=6, seed=0)
  assert max(abs(r["tv"] - r["rejected"]) for r in pairs) < 0.015
  assert max(r["tv"] for r in pairs) - min(r["tv"] for r in pairs) > 0.1  # a spread of pairs


@pytest.mark.parametrize(
  "field, value, message",
  [  # before: a ZeroDivisionError after 27 s, "max() arg is an empty sequence", a nan written
    ("samples", 1000, r"samples must be a positive multiple of 4000 \(rows drawn per call\)"),
    ("pairs", 0, r"pairs must be an integer >= 1, got 0"),
    ("tokens", 0, r"tokens must be an integer >= 2, got 0"),
    ("vocab", 0, r"vocab must be an integer >= 2, got 0"),
    ("corpus", "chat", r"config.losslessness.corpus: unknown corpus 'chat'"),
  ],
)
def test_losslessness_task_checks_its_section_first(monkeypatch, field, value, message):
  """task=losslessness's sizes and corpus are one error naming the field, before any pair is
  drawn or the target loads."""
  from experiments.losslessness import config as losslessness_config
  from specjax import build
  from specjax.tasks import losslessness

  monkeypatch.setattr(build, "target", lambda config: 1 / 0)  # nothing may load
  monkeypatch.setattr(losslessness, "random_pairs", lambda *a: 1 / 0)  # nor be drawn
  c = losslessness_config.get_config()
  c.losslessness[field] = value
  with pytest.raises(ValueError, match=message):
    losslessness.run(c)
