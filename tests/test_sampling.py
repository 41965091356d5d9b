"""sampling.py: temperature, top-k, top-p produce the distributions their definitions say."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import sampling

LOGITS = jnp.log(jnp.array([0.05, 0.4, 0.1, 0.3, 0.15]))


def _p(**kw):
  return np.asarray(sampling.probs(LOGITS, sampling.SamplingParams.create(**kw)))


def test_temperature_one_is_softmax():
  np.testing.assert_allclose(_p(temperature=1.0), [0.05, 0.4, 0.1, 0.3, 0.15], rtol=1e-5)


def test_temperature_zero_is_one_hot_argmax():
  np.testing.assert_array_equal(_p(temperature=0.0), [0, 1, 0, 0, 0])


def test_temperature_scales_logits():
  expect = np.array([0.05, 0.4, 0.1, 0.3, 0.15]) ** 2
  np.testing.assert_allclose(_p(temperature=0.5), expect / expect.sum(), rtol=1e-5)


def test_top_k_keeps_k_largest():
  np.testing.assert_allclose(_p(temperature=1.0, top_k=2), [0, 4 / 7, 0, 3 / 7, 0], rtol=1e-5)


def test_top_p_keeps_smallest_prefix_reaching_mass():
  # sorted: .4, .3, .15, .1, .05; mass before each: 0, .4, .7, .85, .95
  np.testing.assert_allclose(_p(top_p=0.7), [0, 4 / 7, 0, 3 / 7, 0], rtol=1e-5)
  np.testing.assert_allclose(_p(top_p=0.71), [0, 0.4, 0, 0.3, 0.15] / np.float32(0.85), rtol=1e-5)


def test_top_k_then_top_p():
  # top_k=3 renormalises .4,.3,.15 to .47,.35,.18; top_p .5 keeps the first two.
  np.testing.assert_allclose(_p(top_k=3, top_p=0.5), [0, 4 / 7, 0, 3 / 7, 0], rtol=1e-5)


def test_knobs_are_traced_not_static():
  """The knobs' values are traced; static are only whether the temperature is 0 and whether
  filtering is on (three traces below: greedy, sampled, sampled with filtering). The greedy
  trace holds no softmax, the unfiltered ones no sort; each gives what the run-time choice
  (``greedy=None``) gives."""
  traces = []

  @jax.jit
  def f(logits, sp):
    traces.append(1)
    return sampling.probs(logits, sp)

  knobs = [(1.0, 0, 1.0), (0.0, 0, 1.0), (0.5, 2, 0.9), (0.0, 3, 0.5), (1.0, 0, 0.7), (0.7, 0, 1.0)]
  for t, k, p in knobs:
    sp = sampling.SamplingParams.create(t, k, p)
    got = f(LOGITS, sp)
    want = sampling.probs(LOGITS, dataclasses.replace(sp, greedy=None, filtering=True))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  assert len(traces) == 3
  jaxpr = lambda *knobs: str(jax.make_jaxpr(f)(LOGITS, sampling.SamplingParams.create(*knobs)))  # noqa: E731
  assert [j.count("sort") > 0 for j in (jaxpr(1.0), jaxpr(1.0, 2), jaxpr(0.0, 2))] == [
    False, True, False
  ]  # fmt: skip
  assert ["exp" in jaxpr(t) for t in (0.0, 1.0)] == [False, True]


@pytest.mark.parametrize(
  "kw, field",
  [
    (dict(temperature=-0.1), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_k=10**12), r"top_k must be an integer in \[0, 2\*\*31\)"),
    (dict(temperature="1.0"), "temperature must be a number"),
    (dict(temperature=None), "temperature must be a number"),
    (dict(top_p="0.9"), "top_p must be a number"),
  ],
)
def test_bad_knobs_name_the_field(kw, field):
  with pytest.raises(ValueError, match=field):
    sampling.SamplingParams.create(**kw)


def test_greedy_sample_is_the_draw_it_skips():
  """At a static temperature 0 ``sample`` takes the argmax without drawing: the token the
  inverse-CDF draw gives on the same one-hot distribution, for every row and key."""
  logits = jax.random.normal(jax.random.key(0), (64, 7))
  sp = sampling.SamplingParams.create(0.0)
  q = sampling.probs(logits, sp)
  for seed in range(3):
    key = jax.random.key(seed)
    got = sampling.sample(key, q, sp)
    np.testing.assert_array_equal(got, sampling.sample(key, q))
    np.testing.assert_array_equal(got, jnp.argmax(logits, axis=-1))
