"""Target features reach drafters: what init and commit are handed equals a direct forward's
hidden states at those positions (batch 4, ragged prompts, after rejections, after EOS)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import testing
from specjax.decode import generate
from specjax.drafters import DraftModel, PromptLookup
from specjax.models import llama, tiny

PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11], [10], [3, 9, 3, 7, 20, 3, 9]]
BUDGET = 20


@pytest.fixture(scope="module")
def target():
  # Later layers perturb the residual stream: the truncated draft agrees often, not always.
  return tiny.random_model(seed=0, vocab_size=64, dim=32, num_layers=3, residual_scale=0.3)


_logits_of = jax.jit(llama.logits_of, static_argnames=("cfg", "features"))


def _direct(cfg, params, seq, features):
  """``[T, F]``: the requested hidden states of a plain forward over the whole sequence
  (jitted: op by op, a test compiled ~290 small programs)."""
  _, feats = _logits_of(params, cfg, jnp.asarray([seq]), features)
  return np.concatenate([np.asarray(f[0]) for f in feats], axis=-1)


INNER = {
  "draft_model": lambda cfg, params: (DraftModel(tiny.truncated(cfg, params, 1)[0], 3), 1),
  "prompt_lookup_abstaining": lambda cfg, params: (PromptLookup(2, min_ngram=2), None),
}


@pytest.mark.parametrize("features", [("final",), (0, "final", 2)], ids=["final", "layers"])
@pytest.mark.parametrize("inner", INNER, ids=INNER)
def test_drafter_receives_the_targets_features(target, inner, features):
  cfg, params = target
  drafter, layers = INNER[inner](cfg, params)
  dparams = tiny.truncated(cfg, params, layers)[1] if layers else None
  ar = generate(params, cfg, PROMPTS, max_new_tokens=BUDGET, max_len=40).tokens
  stop = ar[0][6]  # row 0 (and perhaps others) stops at this token mid-way
  rec = testing.Recording(drafter, features)
  out = generate(
    params, cfg, PROMPTS, drafter=rec, drafter_params=dparams, max_new_tokens=BUDGET,
    max_len=40, eos_id=stop,
  )  # fmt: skip
  assert len(out.tokens[0]) < BUDGET, "the stop id never ended a row"
  seqs = [p + row for p, row in zip(PROMPTS, out.tokens, strict=True)]
  want = [_direct(cfg, params, s, features) for s in seqs]
  f = cfg.dim * len(features)

  ((lengths, prefill),) = rec.log["prefill"]
  assert prefill.shape[0] == 4 and prefill.shape[2] == f
  for r, p in enumerate(PROMPTS):
    assert lengths[r] == len(p)
    np.testing.assert_allclose(prefill[r, : len(p)], want[r][: len(p)], atol=2e-5)

  checked = rejected = 0
  for before, after, n, feats in rec.log["steps"]:
    assert feats.shape == (4, drafter.num_draft + 1, f)
    for r in range(4):
      if after[r] == before[r]:  # the row had finished: nothing committed
        continue
      # Index 0 is the root (the newest token, at position L); 1..n the accepted nodes.
      for j in range(n[r] + 1):
        pos = before[r] + j
        if pos < len(seqs[r]):  # the last accepted token past a stop is not in the row
          np.testing.assert_allclose(feats[r, j], want[r][pos], atol=2e-5)
          checked += 1
      rejected += int(n[r] < drafter.num_draft)
  assert checked > 25 and rejected > 0
  if inner == "draft_model":
    assert max(n.max() for _, _, n, _ in rec.log["steps"]) > 0, "no step accepted a draft"
  else:
    assert out.metrics["abstained_calls"] > 0, "the root-only (abstain) path never ran"


def test_no_features_means_none_in_the_verdict(target):
  cfg, params = target
  rec = testing.Recording(PromptLookup(2), ())
  generate(params, cfg, PROMPTS, drafter=rec, max_new_tokens=4, max_len=40)
  assert rec.log["prefill"][0][1] is None
  assert all(step[3] is None for step in rec.log["steps"])
