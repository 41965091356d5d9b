"""Prompt lookup: the n-gram match, greedy exactness, and the exact distribution."""

import jax.numpy as jnp
import pytest

from specjax import testing
from specjax.decode import generate
from specjax.drafters.prompt_lookup import PromptLookup
from specjax.testing import P_PASS

REPETITIVE = [[1, 2, 3, 4, 1, 2, 3], [5, 6, 5, 6, 5], [7, 1, 7, 2, 7, 1], [3, 3, 3]]


def test_match_finds_latest_longest_ngram():
  d = PromptLookup(3, max_ngram=2)
  tokens = jnp.array([[5, 6, 7, 8, 9, 5, 6, 0], [1, 2, 9, 1, 2, 4, 1, 2], [1, 2, 3, 4, 5, 6, 7, 8]])
  lengths = jnp.array([6, 7, 7])
  # row 0: suffix (5, 6) occurred at 0 -> continue at 2; row 1: (1, 2) latest earlier at 3 -> 5;
  # row 2: nothing repeats -> -1.
  assert d.match_end(tokens, lengths).tolist() == [2, 5, -1]


@pytest.mark.parametrize("k", [2, 4])
def test_greedy_prompt_lookup_equals_autoregressive(small_target, k):
  cfg, params = small_target
  kw = dict(max_new_tokens=24, max_len=48)
  ar = generate(params, cfg, REPETITIVE, **kw)
  spec = generate(params, cfg, REPETITIVE, drafter=PromptLookup(k), **kw)
  assert spec.tokens == ar.tokens
  assert sum(spec.metrics["accept_hist"][1:]) > 0


@pytest.mark.parametrize(
  "knobs", [dict(temperature=1.0), dict(temperature=1.0, top_p=0.8)], ids=["t1", "t1_topp0.8"]
)
def test_prompt_lookup_exact_distribution(tiny_pair, knobs):
  target, _ = tiny_pair
  assert testing.exact_pvalue(target, PromptLookup(2), None, knobs, prompt=[1, 2, 1, 2, 1]) > P_PASS


@pytest.mark.parametrize(
  "kw, field",
  [(dict(num_draft=0), "num_draft"), (dict(num_draft=2, min_ngram=3, max_ngram=2), "min_ngram")],
)
def test_bad_prompt_lookup_config(kw, field):
  with pytest.raises(ValueError, match=field):
    PromptLookup(**kw)


@pytest.mark.slow
def test_abstaining_rows_take_one_token_steps_and_stay_exact(small_target, tiny_pair):
  """min_ngram=2: rows without a 2-gram match abstain; an all-abstaining step is an AR step."""
  cfg, params = small_target
  kw = dict(max_new_tokens=24, max_len=48)
  ar = generate(params, cfg, REPETITIVE, **kw)
  for drafter in (PromptLookup(3, min_ngram=2), PromptLookup(3, min_ngram=2, num_branches=2)):
    out = generate(params, cfg, REPETITIVE, drafter=drafter, **kw)
    assert out.tokens == ar.tokens
    solo = generate(params, cfg, [REPETITIVE[0]], drafter=drafter, **kw)
    assert solo.tokens[0] == ar.tokens[0]
    assert 0 < solo.metrics["abstained_calls"] < solo.metrics["target_calls"] - 1
  target, _ = tiny_pair
  drafter = PromptLookup(2, min_ngram=2)
  assert (
    testing.exact_pvalue(target, drafter, None, dict(temperature=1.0), prompt=[1, 2, 1, 2]) > P_PASS
  )
