"""Exact-distribution tests: speculative sampling reproduces the target's joint distribution.

Each test draws >= 20,000 three-token continuations through the real batched ``generate``
path and compares their histogram with the target's enumerated joint distribution by a
chi-square test. Cells with expected count < 5 are pooled. A correct sampler must give
p > 1e-3 (fails by chance 1 time in 1000 at most; seeds are fixed, so the run is repeatable);
each deliberately broken verifier must give p < 1e-6.
"""

import numpy as np
import pytest
from scipy import stats

from specjax import sampling, testing, verify
from specjax.decode import generate
from specjax.drafters.base import NoDraft
from specjax.drafters.draft_model import DraftModel

PROMPT = [1, 2, 3]
NUM_NEW = 3
ROWS, CALLS = 4000, 5  # 20,000 samples
P_PASS, P_FAIL = 1e-3, 1e-6


def chi2_pvalue(target, drafter, dparams, knobs, verifier=verify.verify, prompt=PROMPT):
  """Samples ROWS * CALLS continuations with ``drafter``; chi-square p-value vs the target."""
  tcfg, tparams = target
  counts = np.zeros([tcfg.vocab_size] * NUM_NEW)
  for call in range(CALLS):
    out = generate(
      tparams,
      tcfg,
      [prompt] * ROWS,
      drafter=drafter,
      drafter_params=dparams,
      max_new_tokens=NUM_NEW,
      max_len=16,
      seed=call,
      verifier=verifier,
      **knobs,
    )
    for row in out.tokens:
      counts[tuple(row)] += 1
  expected = (
    testing.sequence_probs(
      tparams, tcfg, prompt, NUM_NEW, sampling.SamplingParams.create(**knobs)
    ).ravel()
    * counts.sum()
  )
  observed = counts.ravel()
  assert observed[expected == 0].sum() == 0, "sampled a sequence the target gives probability 0"
  small = expected < 5
  obs = np.append(observed[~small], observed[small].sum())
  exp = np.append(expected[~small], expected[small].sum())
  keep = exp > 0
  return stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue


def _chi2_pvalue(target, draft, k, knobs, verifier=verify.verify):
  dcfg, dparams = draft
  return chi2_pvalue(target, DraftModel(dcfg, k), dparams, knobs, verifier)


KNOBS = {
  "t1": dict(temperature=1.0),
  "t0.7_topk3": dict(temperature=0.7, top_k=3),
  "t1_topp0.8": dict(temperature=1.0, top_p=0.8),
}


@pytest.mark.parametrize("knobs", KNOBS.values(), ids=KNOBS.keys())
def test_exact_distribution_independent_draft(tiny_pair, knobs):
  target, draft = tiny_pair
  assert _chi2_pvalue(target, draft, k=2, knobs=knobs) > P_PASS


def test_exact_distribution_truncated_draft(tiny_pair):
  """A draft close to the target accepts often: exercises the multi-token and bonus paths."""
  target, _ = tiny_pair
  draft = testing.truncated(*target, num_layers=1)
  assert _chi2_pvalue(target, draft, k=3, knobs=dict(temperature=1.0)) > P_PASS


def test_autoregressive_exact_distribution(tiny_pair):
  """The K = 0 loop (the baseline every speedup is measured against) samples the target too."""
  target, _ = tiny_pair
  assert chi2_pvalue(target, NoDraft(), None, dict(temperature=1.0)) > P_PASS


BROKEN = {
  "resample_from_target": testing.resample_from_target,
  "accept_with_target_prob": testing.accept_with_target_prob,
}


@pytest.mark.parametrize("verifier", BROKEN.values(), ids=BROKEN.keys())
def test_broken_verifier_fails(tiny_pair, verifier):
  """The same test, run on a wrong verifier, must reject it: the test has teeth."""
  target, draft = tiny_pair
  assert _chi2_pvalue(target, draft, k=2, knobs=dict(temperature=1.0), verifier=verifier) < P_FAIL
